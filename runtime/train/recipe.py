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
   scaffold) with those designed slices kept fixed (their ``frozen_*`` masks) and is exported next to the projector; a ``recipe.json`` records the
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog

from cachepolicy.engine import EngineConfig
from cachepolicy.forge import TextSpec
from vmenv.trajectory_writer import write_durably
from runtime.train.agents import (AGENT_ARCHES, TYPED_WORDS, X_PIECES, Y_PIECES, agent_shape,
                                  agent_vocab)
from runtime.train.cell_vision import KEY_DIMS, row_layout, write_cell_mmproj
from runtime.train.dataset import DatasetConfig, generate
from runtime.train.environment import environment
from runtime.train.fit import FitConfig, FitReport, fit
from runtime.train.gguf_io import export_gguf
from runtime.train.grounding import Grounding, design, frozen_lookup, piece_ids
from runtime.train.model import Params
from runtime.train.label_copy import design_label, frozen_label, label_copy
from runtime.train.optim import merge_masks
from runtime.train.params import init_params
from runtime.train.readout import Readout, design_readout, frozen_readout
from runtime.train.typed_flag import design_typed, frozen_typed, typed_flag
from runtime.train.word_copy import ASK_PIECES, WordCopy, design_copy, frozen_copy
from runtime.train.recogniser import (Recogniser, cell_data, lookup_accuracy,
                                      train_recogniser)
from vmenv.simdesk.seeds import eval_seeds, train_seeds
from runtime.engine_setup import ModelFiles, load_engine

__all__ = ["MMPROJ_NAME", "RecipeConfig", "model_name", "train_agents"]

log = structlog.get_logger("kvagent.train")

MMPROJ_NAME = "mmproj.gguf"
#: the kinds whose one click answers a dialog, and where their extra recogniser seeds start
DIALOG_KINDS = ("dialog-button", "click-ok")
DIALOG_SEEDS = 1_000_000


def model_name(arch: str) -> str:
    """The file name of ``arch``'s trained agent."""
    return f"agent-{arch}.gguf"


_DATA = attrs.fields(DatasetConfig)


@attrs.frozen
class RecipeConfig:
    """Everything the shipped agents are made from (the defaults make them)."""

    arches: tuple[str, ...] = AGENT_ARCHES
    seed: int = 0
    episodes: int = 512
    fit: FitConfig = FitConfig()
    threads: int = 2
    #: the projector's recogniser: expert episodes it learns from (every kind in turn, then
    #: the dialog kinds again: their button labels are the classes with the fewest screens,
    #: ~57 buttons per label in 1500 episodes, and held out it found dialog-button's button
    #: on 0.775 of clicks against 0.994 on its own screens), and its updates
    recogniser_episodes: int = 1500
    recogniser_dialog_episodes: int = 3000
    recogniser_updates: int = 1500
    #: the query scaffold's weight (``grounding``)
    scaffold_weight: float = 10.0
    #: the dataset's off-track episodes (``dataset.DatasetConfig``, whose defaults and
    #: checks these are): knocked off-track, with the agent's own mistakes, and how those
    #: mistakes look
    perturbed: float = _DATA.perturbed.default
    slipped: float = _DATA.slipped.default
    early_typing: float = _DATA.early_typing.default
    max_slip_run: int = _DATA.max_slip_run.default
    #: every demonstration ends with the solved state labelled ``done()``, so the agents
    #: end their own episodes as OSWorld's loop needs (it stops only on DONE / FAIL or at
    #: max_steps).  Off: the shipped files were trained without it; with it (issue 47,
    #: measured in docs/training.md) every episode ends with done() but the multi-step
    #: kinds collapse to click, type, done()
    with_done: bool = False

    def dataset(self) -> DatasetConfig:
        """The dataset this recipe trains on; ValueError if its settings are not valid."""
        return DatasetConfig(seed=self.seed, episodes=self.episodes, shard_episodes=128,
                             perturbed=self.perturbed, slipped=self.slipped,
                             early_typing=self.early_typing, max_slip_run=self.max_slip_run,
                             with_done=self.with_done)


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
    vocab = agent_vocab()
    hybrid = agent_shape("qwen35")
    rec, rec_record = _recogniser(config, progress)
    mmproj = write_cell_mmproj(hybrid.spec, out / MMPROJ_NAME, rec, seed=config.seed)
    grounding = Grounding(row_layout(hybrid.spec.n_embd),
                          {c: rec.codes[i] for i, c in enumerate(rec.classes)},
                          piece_ids(vocab.tokens, X_PIECES), piece_ids(vocab.tokens, Y_PIECES),
                          weight=config.scaffold_weight)
    words = WordCopy(grounding.layout, piece_ids(vocab.tokens, TYPED_WORDS),
                     piece_ids(vocab.tokens, ASK_PIECES), seed=config.seed)
    typed = typed_flag(vocab.tokens, words, seed=config.seed)
    labels = label_copy(vocab.tokens, grounding.layout, grounding.codes, typed.text_flag,
                        seed=config.seed)
    init_dir = out / "init"
    data = out / "data"
    t0 = time.perf_counter()
    data_init = export_gguf(init_dir / model_name("qwen35"), hybrid.spec,
                            init_params(hybrid.spec, seed=config.seed), vocab=vocab)
    engine_config = EngineConfig(n_seq_max=1, n_threads=config.threads)
    progress(f"dataset: {config.episodes} episodes into {data}")
    with load_engine(ModelFiles(data_init.path, mmproj), engine_config) as engine:
        manifest = generate(engine, config.dataset(), data, progress=progress)
    record: dict[str, Any] = {
        "config": attrs.asdict(config), "mmproj": {"file": MMPROJ_NAME, "sha256": _sha256(mmproj),
                                                   "recogniser": rec_record},
        "dataset": {"dir": "data", "examples": manifest["totals"]["examples"],
                    "seconds": round(time.perf_counter() - t0, 1)},
        "models": {},
        "environment": environment(),  # what the bytes depend on besides the seed
    }
    for arch in config.arches:
        shape = agent_shape(arch)
        progress(f"{arch}: training {config.fit.steps} steps")
        def keep(step: int, params: Params, arch: str = arch, spec: TextSpec = shape.spec) -> None:
            # intermediate models, to evaluate a long run while it trains
            export_gguf(out / "checkpoints" / f"agent-{arch}-step{step}.gguf", spec, params,
                        vocab=vocab)

        start = design(init_params(shape.spec, seed=config.seed), shape.spec, grounding,
                       seed=config.seed)
        readout = Readout(grounding.layout, grounding.x_ids, grounding.y_ids)
        start = design_readout(start, shape.spec, readout)  # before the flags: x pieces get theirs
        start = design_typed(design_copy(start, shape.spec, words), shape.spec, typed)
        start = design_label(start, shape.spec, labels)  # after the typed flag: its KV head
        frozen = merge_masks(frozen_lookup(start, shape.spec, grounding),
                             frozen_copy(start, shape.spec, words),
                             frozen_typed(start, shape.spec, typed),
                             frozen_label(start, shape.spec, labels),
                             frozen_readout(start, shape.spec, readout))
        params, report = fit(shape.spec, start, data, config.fit,
                             progress=lambda s, a=arch: progress(f"{a}: {s}"),
                             checkpoint=keep, grounding=grounding, frozen=frozen)
        exported = export_gguf(out / model_name(arch), shape.spec, params, vocab=vocab)
        record["models"][arch] = _model_record(exported.path, exported.sha256, report)
        progress(f"{arch}: wrote {exported.path} ({exported.n_bytes / 2**20:.1f} MiB) in "
                 f"{report.wall_seconds:.0f} s ({report.cpu_seconds:.0f} CPU s); final loss "
                 f"{report.loss:.3f}, token accuracy {report.accuracy:.3f}")
    write_durably(out / "recipe.json", json.dumps(record, indent=1).encode())
    return record


def _recogniser(config: RecipeConfig, progress: Callable[[str], None],
                ) -> tuple[Recogniser, dict[str, Any]]:
    """The projector's recogniser, trained on training seeds and measured on held-out ones."""
    t0 = time.perf_counter()
    n, m = config.recogniser_episodes, config.recogniser_dialog_episodes
    progress(f"recogniser: cells of {n} + {m} expert episodes")
    data = cell_data(train_seeds(config.seed), n)
    if m:  # other training seeds than the first part's, read in its classes
        data = data.concat(cell_data(train_seeds(config.seed + DIALOG_SEEDS), m, data.classes,
                                     DIALOG_KINDS))
    rec = train_recogniser(data, key_dims=KEY_DIMS, updates=config.recogniser_updates,
                           seed=config.seed,
                           progress=lambda t, loss: progress(
                               f"recogniser: update {t}/{config.recogniser_updates}, loss "
                               f"{loss:.3f}"))
    held_out = cell_data(iter(eval_seeds(10 * n)), max(8, n // 10), rec.classes)
    lookup = lookup_accuracy(rec, held_out)
    seconds = time.perf_counter() - t0
    progress(f"recogniser: {len(rec.classes)} classes; held-out lookup {lookup:.3f} "
             f"({int((held_out.click_class >= 0).sum())} clicks), {seconds:.0f} s")
    return rec, {"classes": list(rec.classes), "screens": int(len(data.features)),
                 "held_out_lookup": round(lookup, 4), "seconds": round(seconds, 1)}


def _model_record(path: Path, sha256: str, report: FitReport) -> dict[str, Any]:
    return {"file": path.name, "sha256": sha256, **attrs.asdict(report)}


def parse_arches(text: str) -> Sequence[str]:
    """``"qwen35,llama"`` -> the arches (ValueError for an unknown one)."""
    arches = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in arches if a not in AGENT_ARCHES]
    if bad or not arches:
        raise ValueError(f"unknown arch(es) {bad or text!r}; choose from "
                         f"{', '.join(AGENT_ARCHES)}")
    return arches
