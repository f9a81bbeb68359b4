"""The recipe that makes kvagent's shipped agents, end to end (``kvagent train``).

1. The projector's recogniser (``recogniser.py``) learns simdesk's widget classes from
   expert episodes' cells; the cell projector (``cell_vision.py``) is written with it once
   (both arches have the same width, so they share it).
2. The dataset (``dataset.py``) is generated once, with the hybrid's initial model: its
   tokenizer (the same vocabulary for both arches) and the projector's embeddings, which do not
   depend on the text model. The llama agent reads the same stored encodings on a line
   (``fit.on_a_line``). A rerun keeps finished shards.
3. Each agent starts from the seed's initial weights with the designed lookup
   (``grounding.design``), read-out (``readout``), word copy (``word_copy``), typed flag
   (``typed_flag``) and label copy (``label_copy``), trains (``fit.py``, with the query
   scaffold) with those designed slices kept fixed (their ``frozen_*`` masks) and is
   exported: the *base* agent (``base/``), which never says ``done()``.
4. The done stage (``done_stage.py``): each agent continues from its base file on the same
   demonstrations each ending in ``done()`` (``data-done/``) and is exported next to the
   projector (``RecipeConfig.done``; ``train_done_from`` runs this stage alone from base
   agents made before, e.g. the files shipped until issue 47); a ``recipe.json`` records the
   configuration, the recogniser's held-out lookup, the files' sha256, the time each part took
   and the environment the bytes depend on (``environment.py``).

Deterministic from ``RecipeConfig.seed``: the same config writes the same files with the same
JAX build, XLA threading, CPU kind and number of available cores (XLA splits reductions over
its intra-op threads, which changes the sums: ``kvagent train`` pins it to one, yet one core
and two still differ, cause not found; across JAX builds or CPUs with other SIMD widths the
files differ — docs/training.md, "Reproducing the shipped files", states the
tolerance measured).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import structlog

from cachepolicy.engine import EngineConfig
from cachepolicy.forge import TextSpec
from vmenv.trajectory_writer import write_durably
from runtime.train.agents import AGENT_ARCHES, agent_shape, agent_vocab
from runtime.train.base_record import base_record
from runtime.train.cell_vision import KEY_DIMS, write_cell_mmproj
from runtime.train.dataset import DatasetConfig, generate, load_manifest
from runtime.train.designs import Designs, agent_designs
from runtime.train.done_stage import train_done
from runtime.train.environment import environment
from runtime.train.fit import FitReport, fit
from runtime.train.gguf_io import export_gguf
from runtime.train.menu_readout import readout_errors
from runtime.train.model import Params
from runtime.train.params import init_params
from runtime.train.cell_labels import sub_cell_grid
from runtime.train.recipe_config import (BASE_DIR, DONE_DATA, MMPROJ_NAME, SUB_UNITS,
                                         RecipeConfig, model_name)
from runtime.train.recogniser import (Recogniser, cell_data, lookup_accuracy,
                                      train_recogniser)
from vmenv.simdesk.seeds import eval_seeds, train_seeds
from runtime.engine_setup import ModelFiles, load_engine

__all__ = ["train_agents", "train_done_from"]

log = structlog.get_logger("kvagent.train")

#: the kinds whose one click answers a dialog, and where their extra recogniser seeds start
DIALOG_KINDS = ("dialog-button", "click-ok")
DIALOG_SEEDS = 1_000_000


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_agents(config: RecipeConfig, out: Path, *,
                 progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Make the agents of ``config`` in ``out`` (``agent-<arch>.gguf``, ``mmproj.gguf``,
    ``data/``, ``recipe.json``); returns the recipe record."""
    unknown = [a for a in config.arches if a not in AGENT_ARCHES]
    if unknown or not config.arches:
        raise ValueError(f"unknown arch(es) {unknown}; expected some of {AGENT_ARCHES}")
    out.mkdir(parents=True, exist_ok=True)
    vocab = agent_vocab(config.sub_cell)
    hybrid = agent_shape("qwen35", config.sub_cell)
    rec, rec_record = _recogniser(config, progress)
    mmproj = write_cell_mmproj(hybrid.spec, out / MMPROJ_NAME, rec, seed=config.seed)
    designs = agent_designs(vocab.tokens, rec.classes, hybrid.spec.n_embd, seed=config.seed,
                            scaffold_weight=config.scaffold_weight,
                            menu_flag=config.menu_flag,
                            flags_in_base=config.flags_in_base, key_row=config.key_row,
                            sub_cell=config.sub_cell)
    if not all(np.array_equal(designs.grounding.codes[c], rec.codes[i])
               for i, c in enumerate(rec.classes)):  # designs' invariant
        raise AssertionError("the recogniser's class codes are not spread_codes(classes, seed)")
    record: dict[str, Any] = {
        "config": attrs.asdict(config), "mmproj": {"file": MMPROJ_NAME, "sha256": _sha256(mmproj),
                                                   "recogniser": rec_record},
        "models": {},
        "environment": environment(),  # what the bytes depend on besides the seed
    }
    data, done_data = out / "data", out / DONE_DATA  # the second read only where it applies
    _datasets(out, [(config.dataset(), "dataset", data), *_done_dataset(config, done_data)],
              mmproj, config.threads, progress, record)
    for arch in config.arches:
        shape = agent_shape(arch, config.sub_cell)
        progress(f"{arch}: training {config.fit.steps} steps")
        def keep(step: int, params: Params, arch: str = arch, spec: TextSpec = shape.spec) -> None:
            # intermediate models, to evaluate a long run while it trains
            export_gguf(out / "checkpoints" / f"agent-{arch}-step{step}.gguf", spec, params,
                        vocab=vocab)

        start = designs.apply(init_params(shape.spec, seed=config.seed), shape.spec)
        params, report = fit(shape.spec, start, data, config.fit,
                             progress=lambda s, a=arch: progress(f"{a}: {s}"),
                             checkpoint=keep, grounding=designs.grounding,
                             frozen=designs.frozen(start, shape.spec))
        staged = config.done.applies(arch)
        base_path = out / BASE_DIR / model_name(arch) if staged else out / model_name(arch)
        exported = export_gguf(base_path, shape.spec, params, vocab=vocab)
        model = _model_record(exported.path, exported.sha256, report)
        _progress_written(progress, arch, exported.path, exported.n_bytes, report)
        if staged:
            model = {**_done_model(config, exported.path, done_data, out, designs, arch,
                                   progress), "base": model}
        record["models"][arch] = model
    write_durably(out / "recipe.json", json.dumps(record, indent=1).encode())
    return record


def train_done_from(config: RecipeConfig, base: Path, out: Path, *,
                    progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The done stage alone, from the base agents in ``base`` (``agent-<arch>.gguf``,
    ``mmproj.gguf`` and the ``recipe.json`` that made them, with no done stage of its own):
    what ``train_agents`` makes when its base agents are those files.  ValueError if
    ``base`` does not hold them or was made with another seed."""
    made = base_record(base, config)
    out.mkdir(parents=True, exist_ok=True)
    mmproj = out / MMPROJ_NAME
    if mmproj.resolve() != (base / MMPROJ_NAME).resolve():
        write_durably(mmproj, (base / MMPROJ_NAME).read_bytes())
    vocab = agent_vocab(config.sub_cell)
    designs = agent_designs(vocab.tokens, made["mmproj"]["recogniser"]["classes"],
                            agent_shape("qwen35").spec.n_embd, seed=config.seed,
                            scaffold_weight=config.scaffold_weight,
                            menu_flag=config.menu_flag,
                            flags_in_base=config.flags_in_base, key_row=config.key_row,
                            sub_cell=config.sub_cell)
    record: dict[str, Any] = {
        "config": attrs.asdict(config), "from": str(base), "mmproj": made["mmproj"],
        "dataset": made.get("dataset"), "models": {}, "environment": environment(),
    }
    done_data = out / DONE_DATA
    _datasets(out, _done_dataset(config, done_data), mmproj, config.threads, progress, record)
    for arch in config.arches:
        if not config.done.applies(arch):  # shipped as its base file (``DoneStage.arches``)
            if (out / model_name(arch)).resolve() != (base / model_name(arch)).resolve():
                write_durably(out / model_name(arch), (base / model_name(arch)).read_bytes())
            record["models"][arch] = made["models"][arch]
            continue
        model = _done_model(config, base / model_name(arch), done_data, out, designs, arch,
                            progress)
        record["models"][arch] = {**model, "base": made["models"][arch]}
    write_durably(out / "recipe.json", json.dumps(record, indent=1).encode())
    return record


def _done_dataset(config: RecipeConfig, data: Path,
                  ) -> list[tuple[DatasetConfig, str, Path]]:
    """The done stage's dataset as ``_datasets`` takes it, where the stage applies to one of
    the arches (else nothing to generate)."""
    if not any(config.done.applies(a) for a in config.arches):
        return []
    return [(config.done_dataset(), "done_dataset", data)]


def _datasets(out: Path, wanted: list[tuple[DatasetConfig, str, Path]], mmproj: Path,
              threads: int, progress: Callable[[str], None], record: dict[str, Any]) -> None:
    """Generate each ``(dataset, key, directory)`` of ``wanted`` and note it in
    ``record[key]`` (directory, examples, seconds), all through one engine: the encodings of
    the recipe's projector and the tokens of the seed's initial hybrid (the same vocabulary
    for both arches; exported once); a rerun keeps finished shards."""
    if not wanted:
        return
    sub_cell = wanted[0][0].sub_cell
    hybrid, seed = agent_shape("qwen35", sub_cell), wanted[0][0].seed
    init = export_gguf(out / "init" / model_name("qwen35"), hybrid.spec,
                       init_params(hybrid.spec, seed=seed), vocab=agent_vocab(sub_cell))
    with load_engine(ModelFiles(init.path, mmproj),
                     EngineConfig(n_seq_max=1, n_threads=threads)) as engine:
        for dataset, key, data in wanted:
            t0 = time.perf_counter()
            progress(f"dataset: {dataset.episodes} episodes into {data}")
            generate(engine, dataset, data, progress=progress)
            record[key] = {"dir": data.name, "examples": _examples(data),
                           "seconds": round(time.perf_counter() - t0, 1)}


def _examples(data: Path) -> int:
    return int(load_manifest(data)["totals"]["examples"])


def _done_model(config: RecipeConfig, base: Path, data: Path, out: Path, designs: Designs,
                arch: str, progress: Callable[[str], None]) -> dict[str, Any]:
    progress(f"{arch}: done stage, {config.done.updates} updates from {base}")
    exported, report = train_done(base, data, out / model_name(arch), config.done, designs,
                                  arch=arch, seed=config.seed,
                                  progress=lambda s: progress(f"{arch} (done stage): {s}"))
    _progress_written(progress, arch, exported.path, exported.n_bytes, report)
    return _model_record(exported.path, exported.sha256, report)


def _progress_written(progress: Callable[[str], None], arch: str, path: Path, n_bytes: int,
                      report: FitReport) -> None:
    progress(f"{arch}: wrote {path} ({n_bytes / 2**20:.1f} MiB) in {report.wall_seconds:.0f} s "
             f"({report.cpu_seconds:.0f} CPU s); final loss {report.loss:.3f}, token accuracy "
             f"{report.accuracy:.3f}")


def _recogniser(config: RecipeConfig, progress: Callable[[str], None],
                ) -> tuple[Recogniser, dict[str, Any]]:
    """The projector's recogniser (with the menu flag's read-out when the recipe asks for
    it), trained on training seeds and measured on held-out ones."""
    t0 = time.perf_counter()
    n, m = config.recogniser_episodes, config.recogniser_dialog_episodes
    # the dialog kinds again, in each layout style the recipe's kinds name
    dialogs = DIALOG_KINDS + tuple(f"{style}-{k}" for style in ("dense", "classic")
                                   for k in DIALOG_KINDS if f"{style}-{k}" in config.kinds)
    progress(f"recogniser: cells of {n} + {m} expert episodes (the second part: "
             f"{', '.join(dialogs)})")
    entries = config.menu_entries
    grid = sub_cell_grid(entries) if config.sub_cell else None
    data = cell_data(train_seeds(config.seed), n, kinds=config.kinds, entries=entries,
                     grid=grid)
    if m:  # other training seeds than the first part's, read in its classes
        data = data.concat(cell_data(train_seeds(config.seed + DIALOG_SEEDS), m, data.classes,
                                     dialogs, entries, grid))
    rec = train_recogniser(data, key_dims=KEY_DIMS, updates=config.recogniser_updates,
                           seed=config.seed, menu=config.menu_flag,
                           sub_units=SUB_UNITS if config.sub_cell else 0,
                           progress=lambda t, loss: progress(
                               f"recogniser: update {t}/{config.recogniser_updates}, loss "
                               f"{loss:.3f}"))
    held_out = cell_data(iter(eval_seeds(10 * n)), max(8, n // 10), rec.classes,
                         kinds=config.kinds, entries=entries, grid=grid)
    lookup = lookup_accuracy(rec, held_out)
    record: dict[str, Any] = {"classes": list(rec.classes), "screens": int(len(data.features)),
                              "held_out_lookup": round(lookup, 4),
                              "dialog_kinds": list(dialogs) if m else []}
    if rec.menu is not None:
        missed, forged = readout_errors(rec.menu, rec.hidden_units(held_out.features),
                                        held_out.menu)
        progress(f"recogniser: menu read-out held out: {missed:.4f} of menu cells missed, "
                 f"{forged:.4f} of other cells read as menu")
        record["menu_readout"] = {"menu_cells_missed": round(missed, 5),
                                  "other_cells_forged": round(forged, 5)}
    seconds = time.perf_counter() - t0
    progress(f"recogniser: {len(rec.classes)} classes; held-out lookup {lookup:.3f} "
             f"({int((held_out.click_class >= 0).sum())} clicks), {seconds:.0f} s")
    return rec, {**record, "seconds": round(seconds, 1)}


def _model_record(path: Path, sha256: str, report: FitReport) -> dict[str, Any]:
    return {"file": path.name, "sha256": sha256, **attrs.asdict(report)}
