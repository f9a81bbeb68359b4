"""``kvagent train`` end to end on a toy budget (CI never trains a full model): the recipe writes
the projector, the dataset, the trained model and recipe.json; the model loads in the engine
and answers through the runtime's grammar; a rerun with the same seed reuses the dataset and
writes the same bytes; the done stage run alone (``--from``) from base agents makes what the
whole recipe makes; bad arguments are refused before any work."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from runtime.cli import main
from runtime.train.environment import ONE_THREAD_XLA_FLAGS, pin_xla_threads

#: the recipe's defaults on a toy budget; its draw groups are left out (8 episodes hold one
#: menu-launch, so one of its menu classes is never clicked: a group that matches nothing is
#: refused)
ARGS = ["train", "--arch", "qwen35", "--episodes", "8", "--steps", "1", "--threads", "2",
        "--recogniser-episodes", "8", "--recogniser-dialog-episodes", "4",
        "--recogniser-updates", "5", "--done-updates", "2", "--click-weights", "",
        "--done-click-weights", "", "--done-arch-click-weights", "none"]


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The toy recipe run once for the module (base training, then the done stage): its
    directory and what it printed.  Read-only to the tests but for the rerun, which must
    leave its bytes as they were."""
    out = tmp_path_factory.mktemp("staged")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("XLA_FLAGS", raising=False)  # the command pins XLA; undone after
        with contextlib.redirect_stdout(printed):
            assert main([*ARGS, "--out", str(out)]) == 0
    yield out, printed.getvalue()


def test_train_writes_loadable_reproducible_agent(staged: tuple[Path, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # the command pins XLA; undone after
    out, printed = staged
    record = json.loads((out / "recipe.json").read_text())
    model = out / "agent-qwen35.gguf"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    assert record["models"]["qwen35"]["sha256"] == digest
    assert record["models"]["qwen35"]["steps"] == 2  # the done stage's updates
    assert record["models"]["qwen35"]["base"]["steps"] == 1
    assert record["dataset"]["examples"] > 8  # several steps and layouts per episode
    env = record["environment"]  # what the bytes depend on besides the seed
    assert env["jax"] == jax.__version__ and env["xla_flags"] == ONE_THREAD_XLA_FLAGS
    assert env["cpus"] >= 1 and env["machine"] and env["cpu"]
    assert "qwen35: training 1 steps" in printed and "kvagent bench-eval" in printed

    with Engine(model, out / "mmproj.gguf", EngineConfig(n_seq_max=1, n_threads=2)) as engine:
        assert engine.uses_mrope and engine.n_embd == 192

    shard_times = [s["seconds"] for s in json.loads((out / "data" / "manifest.json")
                                                     .read_text())["shards"]]
    assert main([*ARGS, "--out", str(out)]) == 0  # same seed: the dataset is kept
    again = json.loads((out / "recipe.json").read_text())
    assert again["models"]["qwen35"]["sha256"] == digest
    assert [s["seconds"] for s in json.loads((out / "data" / "manifest.json")
                                              .read_text())["shards"]] == shard_times


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_done_stage_from_base_files_is_the_whole_recipe(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, staged: tuple[Path, str],
) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    staged, base, resumed = staged[0], tmp_path / "base", tmp_path / "resumed"
    # an arch outside --done-arch ships its base file: the recipe without its done stage
    assert main([*ARGS, "--done-arch", "llama", "--out", str(base)]) == 0
    assert not (base / "base").exists() and not (base / "data-done").exists()
    # the base agents are the recipe without its done stage, byte for byte
    assert _sha(staged / "base" / "agent-qwen35.gguf") == _sha(base / "agent-qwen35.gguf")
    assert _sha(staged / "agent-qwen35.gguf") != _sha(base / "agent-qwen35.gguf")
    record = json.loads((staged / "recipe.json").read_text())
    assert record["models"]["qwen35"]["base"]["sha256"] == _sha(base / "agent-qwen35.gguf")
    # every demonstration gains its done() step: more examples than the base dataset's
    assert record["done_dataset"]["examples"] > record["dataset"]["examples"]
    assert "base" not in json.loads((base / "recipe.json").read_text())["models"]["qwen35"]
    capsys.readouterr()

    assert main([*ARGS, "--from", str(base), "--out", str(resumed)]) == 0
    assert _sha(resumed / "agent-qwen35.gguf") == _sha(staged / "agent-qwen35.gguf")
    assert _sha(resumed / "mmproj.gguf") == _sha(base / "mmproj.gguf")
    again = json.loads((resumed / "recipe.json").read_text())
    assert again["models"]["qwen35"]["base"]["sha256"] == _sha(base / "agent-qwen35.gguf")
    assert "done stage, 2 updates" in capsys.readouterr().out

    # --from refuses what is not a base agent of this seed, before any work
    for bad, why in ((staged, "done stage already"), (tmp_path / "empty", "recipe.json"),
                     (base, "seed")):
        extra = ["--seed", "1"] if why == "seed" else []
        assert main([*ARGS, *extra, "--from", str(bad), "--out", str(tmp_path / "x")]) == 2
        assert why in capsys.readouterr().err
    # ... and base agents made otherwise than asked now (the recipe's defaults here)
    for other, why in ((["--no-menu-flag"], "--menu-flag"), (["--word-slips"], "--word-slips")):
        assert main([*ARGS, *other, "--from", str(base), "--out", str(tmp_path / "x")]) == 2
        assert why in capsys.readouterr().err
    assert main([*ARGS, "--done-updates", "0", "--from", str(base),
                 "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def _recipe(*argv: str):
    from runtime.cli import build_parser, command_of
    from runtime.commands.train import recipe_config

    return recipe_config(build_parser(command_of(["train"])).parse_args(["train", *argv]))


def test_the_command_with_no_options_asks_for_the_shipped_recipe() -> None:
    """``kvagent train`` alone is ``RecipeConfig()``, and that is the recipe the shipped files'
    recipe.json records — but for ``threads`` (llama.cpp's while writing the datasets: the
    shipped files were made one arch per core, docs/training.md); an option the record
    predates reads as what the recipe made before it (``base_record``'s, e.g. ``sub_cell``
    off), so a default that changed it would not pass."""
    import attrs

    from runtime.agent_models import AGENT_DIR
    from runtime.train.base_record import _BASE_OPTIONS
    from runtime.train.recipe_config import RecipeConfig

    assert _recipe() == RecipeConfig()
    shipped = json.loads((AGENT_DIR / "recipe.json").read_text())["config"]
    shipped = {**{k: before for k, before, _ in _BASE_OPTIONS if k not in shipped}, **shipped}
    ours = json.loads(json.dumps(attrs.asdict(RecipeConfig())))
    assert {k: v for k, v in ours.items() if k != "threads"} == \
        {k: v for k, v in shipped.items() if k != "threads"}


def test_each_switch_and_draw_group_option_reaches_the_recipe() -> None:
    """Every ``--X`` / ``--no-X`` turns its own field of the recipe the other way and nothing
    else; ``""`` leaves a stage's draw groups out."""
    import attrs

    from runtime.commands.train import _SWITCHES
    from runtime.train.recipe_config import RecipeConfig

    d = RecipeConfig()
    for name, _ in _SWITCHES:
        flag = f"--{'no-' if getattr(d, name) else ''}{name.replace('_', '-')}"
        got = _recipe(flag)
        assert got == attrs.evolve(d, **{name: not getattr(d, name)}), flag
    got = _recipe("--click-weights", "", "--done-click-weights", "")
    assert got.fit.clicked_weights == () and got.done.clicked_weights == ()
    assert got == attrs.evolve(d, fit=attrs.evolve(d.fit, clicked_weights=()),
                               done=attrs.evolve(d.done, clicked_weights=()))
    off = _recipe("--no-flags-in-base", "--no-done-flags")
    assert not off.flags_in_base and not off.done.instruction_flags


def test_an_arch_draws_its_own_done_stage_groups() -> None:
    """The shipped recipe gives the hybrid done-stage groups of its own and the llama agent
    the shared ones; the option replaces the per-arch sets (``none``: every arch shared), and
    the fit each arch's done stage runs draws its own."""
    import attrs

    from runtime.train.recipe_config import (DONE_CLICK_WEIGHTS, HYBRID_DONE_CLICK_WEIGHTS,
                                             RecipeConfig)

    d = RecipeConfig().done
    assert d.fit_config(0, "qwen35").clicked_weights == HYBRID_DONE_CLICK_WEIGHTS
    assert d.fit_config(0, "llama").clicked_weights == DONE_CLICK_WEIGHTS
    assert HYBRID_DONE_CLICK_WEIGHTS != DONE_CLICK_WEIGHTS
    shared = _recipe("--done-arch-click-weights", "none").done
    assert shared == attrs.evolve(d, arch_clicked_weights=())
    assert shared.clicks_of("qwen35") == shared.clicks_of("llama") == DONE_CLICK_WEIGHTS
    both = _recipe("--done-arch-click-weights", "llama:marked=2",
                   "--done-arch-click-weights", "qwen35:").done
    assert both.clicks_of("llama") == (("marked", 2.0),) and both.clicks_of("qwen35") == ()
    with pytest.raises(ValueError, match="two sets"):
        attrs.evolve(d, arch_clicked_weights=(("llama", ()), ("llama", ())))


def test_train_refuses_bad_arguments(tmp_path: Path, capsys) -> None:
    assert main(["train", "--arch", "mamba", "--out", str(tmp_path)]) == 2
    assert "unknown arch" in capsys.readouterr().err
    assert main(["train", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert main(["train", "--done-updates", "-1", "--out", str(tmp_path)]) == 2
    assert main(["train", "--kinds", "open-terminal,nope", "--out", str(tmp_path)]) == 2
    assert "unknown task kind 'nope'" in capsys.readouterr().err
    assert main(["train", "--pin-share", "1.5", "--out", str(tmp_path)]) == 2
    assert "--pin-share" in capsys.readouterr().err
    for bad in (["--slipped", "0.8", "--perturbed", "0.3"], ["--early-typing", "1.5"],
                ["--max-slip-run", "0"], ["--click-weights", "marked=0"],
                ["--done-click-weights", "marked"], ["--click-weights", "a=1,a=2"],
                ["--kinds", "open-terminal,click-ok"], ["--menu-entries", "launch"],
                ["--no-done-flags"], ["--done-arch-click-weights", "llama=1"],
                ["--done-arch-click-weights", "mamba:marked=1"],
                ["--done-arch-click-weights", "llama:nope/marked=1"],
                ["--done-arch-click-weights", "llama:", "--done-arch-click-weights", "llama:"]):
        assert main(["train", *bad, "--out", str(tmp_path)]) == 2
        assert "--" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_xla_is_pinned_to_one_thread_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch,
                                                          ) -> None:
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert pin_xla_threads() and os.environ["XLA_FLAGS"] == ONE_THREAD_XLA_FLAGS
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert not pin_xla_threads() and os.environ["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"


def _designed_flag_columns(n_vocab: int, flags):
    """The instruction flags' embedding columns as designed: each flag piece holds
    ``POS_SCALE`` in its own dim, every other entry 0 (before any key read-out)."""
    import numpy as np

    from runtime.train.cell_vision import POS_SCALE

    want = np.zeros((n_vocab, len(flags.dims)), np.float32)
    for i, tok in enumerate(flags.flag_ids):
        want[tok, i] = POS_SCALE
    return want


def test_the_recipe_designs_the_menu_flag_instruction_flags_and_key_row(
        staged: tuple[Path, str]) -> None:
    """The recipe's defaults (``--menu-flag --flags-in-base --key-row``): it trains the menu
    read-out with the recogniser, records its held-out errors, designs the flag into the
    agent and the files load together; the fresh agent carries the instruction flags, the
    base training keeps them fixed, and the done stage finds them designed (it would refuse
    to design them twice: ``design_flags`` needs the label head's rows free) and keeps them;
    the key row's text flag is in both files, unmoved by training, and the enter piece's
    read-out of the Enter flag is there.  (``--from`` needs each asked as the base was made:
    ``test_recipe_base``, and the done-stage test above.)"""
    import numpy as np

    from runtime.train.designs import agent_designs
    from runtime.train.gguf_io import load_gguf
    from runtime.train.grounding import first_head_of
    from runtime.train.menu_flag import KEY_GAIN
    from runtime.train.word_copy import copy_layer, match_dim

    out = staged[0]
    record = json.loads((out / "recipe.json").read_text())
    assert record["config"]["menu_flag"] is True and record["config"]["flags_in_base"] is True
    assert record["config"]["key_row"] is True and record["config"]["enter_key"] is True
    assert record["config"]["word_slips"] is False
    assert set(record["mmproj"]["recogniser"]["menu_readout"]) == {"menu_cells_missed",
                                                                  "other_cells_forged"}
    model = out / "agent-qwen35.gguf"
    with Engine(model, out / "mmproj.gguf", EngineConfig(n_seq_max=1, n_threads=2)) as engine:
        assert engine.uses_mrope
    loaded = load_gguf(model)
    spec, params = loaded.spec, loaded.params
    designs = agent_designs(loaded.vocab.tokens, record["mmproj"]["recogniser"]["classes"],
                            spec.n_embd, seed=0, scaffold_weight=10.0, menu_flag=True,
                            flags_in_base=True, key_row=True)
    menu, flags, typed = designs.menu, designs.flags, designs.typed
    assert not params["token_embd.weight"][:, menu.dim].any()  # kept fixed through training
    for path in (out / "base" / "agent-qwen35.gguf", model):
        embd = np.asarray(load_gguf(path).params["token_embd.weight"])
        want = _designed_flag_columns(embd.shape[0], flags)
        got = embd[:, list(flags.dims)].copy()
        for tok, i in flags.key_reads:  # the key read-outs: designed, then trained
            assert got[tok, i] > 0, path
            got[tok, i] = 0.0
        assert flags.key_reads and np.array_equal(got, want), path
        text_rows = set(np.flatnonzero(embd[:, typed.text_flag]))
        assert text_rows == set(typed.query_ids) and loaded.vocab.tokens.index('press("') \
            in text_rows, path
    key = params[f"blk.{copy_layer(spec)}.attn_k.weight"]
    assert key[first_head_of(spec, 1).kv.start + match_dim(spec), menu.dim] == \
        pytest.approx(KEY_GAIN, rel=1e-3)  # f16


def test_the_recipe_before_its_defaults_changed_still_runs(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    """The options' other sides, as the recipe ran before the twenty-eighth session
    (``--no-menu-flag --no-flags-in-base --no-enter-key --no-key-row --word-slips``): the
    base agent holds no instruction flag, the done stage designs them in (``apply_flags``)
    and keeps them through its updates, and nothing of the key row is there."""
    import numpy as np

    from runtime.train.designs import agent_designs
    from runtime.train.gguf_io import load_gguf

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    out = tmp_path / "old"
    assert main([*ARGS, "--no-menu-flag", "--no-flags-in-base", "--no-enter-key",
                 "--no-key-row", "--word-slips", "--out", str(out)]) == 0
    record = json.loads((out / "recipe.json").read_text())
    assert not record["config"]["flags_in_base"] and record["config"]["word_slips"]
    assert "menu_readout" not in record["mmproj"]["recogniser"]
    loaded = load_gguf(out / "agent-qwen35.gguf")
    designs = agent_designs(loaded.vocab.tokens, record["mmproj"]["recogniser"]["classes"],
                            loaded.spec.n_embd, seed=0, scaffold_weight=10.0)
    flags, typed = designs.flags, designs.typed
    want = _designed_flag_columns(loaded.spec.n_vocab, flags)
    base = np.asarray(load_gguf(out / "base" / "agent-qwen35.gguf").params["token_embd.weight"])
    done = np.asarray(loaded.params["token_embd.weight"])
    assert not np.array_equal(base[:, list(flags.dims)], want)  # the base never had them
    assert np.array_equal(done[:, list(flags.dims)], want) and not flags.key_reads
    assert loaded.vocab.tokens.index('press("') not in set(np.flatnonzero(done[:, typed.text_flag]))


def test_the_sub_cell_recipe_makes_an_agent_that_clicks_off_centre(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sub-cell`` on a toy budget: the agent's vocabulary holds the sub-cell pieces, its
    projector the sub-cell read-out (a cell's row has a value in its column's sub-cell dim),
    its demonstrations click points off the cell centres on the dense and classic-style
    kinds (whose dialogs the recogniser also learns from), and the
    recorded recipe says so (test_recipe_base: the done stage refuses to mix the two)."""
    from runtime.train.agents import N_VOCAB_SUB, SUB_X_PIECES
    from runtime.train.cell_vision import row_layout
    from runtime.train.dataset import DatasetConfig, rollout
    from vmenv.actions import Click
    from vmenv.simdesk.render import render_png

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    out = tmp_path / "sub"
    kinds = "click-ok,dense-click-ok,dense-save-note,classic-click-ok,save-note"
    assert main([*ARGS, "--sub-cell", "--kinds", kinds, "--done-updates", "0",
                 "--out", str(out)]) == 0
    record = json.loads((out / "recipe.json").read_text())
    assert record["config"]["sub_cell"] is True
    assert record["mmproj"]["recogniser"]["dialog_kinds"] == [
        "dialog-button", "click-ok", "dense-click-ok", "classic-click-ok"]
    model = out / "agent-qwen35.gguf"
    with Engine(model, out / "mmproj.gguf", EngineConfig(n_seq_max=1, n_threads=2)) as engine:
        assert engine.n_vocab == N_VOCAB_SUB
        # click( 408 , 200 ): one piece per coordinate, off-centre ones too
        assert len(engine.tokenize(f"click({SUB_X_PIECES[25]}, 200)")) == 4
        lay = row_layout(192, sub_cell=True)
        data = DatasetConfig(kinds=tuple(kinds.split(",")), sub_cell=True)
        episode = rollout(data, 1)
        rows = np.asarray(engine.encode_image(render_png(episode.steps[0].state)).embeddings)
        cols = np.tile(np.arange(lay.cols), lay.rows)
        others = rows[:, lay.sub_x].copy()
        others[np.arange(len(rows)), cols] = 0.0
        assert np.abs(others).max() < 0.05  # each value only in its own column's dim
    clicks = [s.action for e in range(8) for s in rollout(data, e).steps
              if isinstance(s.action, Click)]
    assert any((c.x - 16) % 32 or (c.y - 16) % 32 for c in clicks)
