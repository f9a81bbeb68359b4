"""The training set generator: deterministic, training seeds only, recovery states, the
layout mix, stored prompts that are the prompt builder's, screenshots encoded once and stored
bitwise, resumable."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import pytest

from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.train.dataset import (
    LAYOUTS, MANIFEST, PERTURBED, SLIPPED, TERMINAL, DatasetConfig, DatasetError, generate,
    load_manifest, rollout, shards,
)
from runtime.train.prompts import ImagePiece, PastStep, PromptBuilder, TextPiece
from vmenv.simdesk import is_eval_seed
from vmenv.simdesk.render import render_png

CONFIG = DatasetConfig(seed=7, episodes=6, shard_episodes=3, perturbed=0.3, slipped=0.4,
                       variants=3)


@pytest.fixture(scope="module")
def engine(engines: Callable[..., object]) -> object:
    return engines("qwen35")


@pytest.fixture(scope="module")
def dataset(engine: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    generate(engine, CONFIG, out)  # type: ignore[arg-type]
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_manifest_counts_what_the_shards_hold(dataset: Path) -> None:
    m = load_manifest(dataset)
    t = m["totals"]
    loaded = list(shards(dataset))
    assert len(loaded) == 2 and t["episodes"] == 6
    assert t["examples"] == sum(len(s) for s in loaded) > 0
    assert sum(t["by_kind"].values()) == sum(t["by_layout"].values()) == t["examples"]
    assert set(t["by_kind"]) == set(CONFIG.kinds[:6])  # episode e: kind e mod 8
    windows = {k: v for k, v in t["rows"]["by_window"].items() if "/" not in k}
    assert sum(v["examples"] for v in windows.values()) == t["examples"]
    rows = np.concatenate([s.a["meta_rows"] for s in loaded])
    assert t["rows"]["max"] == rows.max() and t["rows"]["mean"] == pytest.approx(rows.mean())
    assert t["bytes"] == sum(p.stat().st_size for p in dataset.glob("shard-*.npz"))
    assert t["examples_per_s"] > 0 and t["bytes_per_1000_examples"] > 0


def test_training_seeds_only_and_every_step_a_target(dataset: Path) -> None:
    for shard in shards(dataset):
        seeds = shard.a["meta_seed"]
        assert not any(is_eval_seed(int(s)) for s in seeds)
        for e in range(len(shard)):
            pieces = shard.pieces(e)
            trained = [p for p in pieces if isinstance(p, TextPiece) and p.train]
            assert len(trained) == 1 and pieces[-1] is trained[0]  # the target closes it
            assert shard.meta(e)["target_tokens"] == len(trained[0].tokens)


def test_stored_examples_are_the_prompt_builder_s(dataset: Path, engine: object) -> None:
    """Every stored example equals the prompt ``PromptBuilder`` makes for its step, layout
    and K from the rolled-out episode (so the layout proof carries over to the data)."""
    factory = SegmentFactory(engine)  # type: ignore[arg-type]
    checked = 0
    for shard in shards(dataset):
        for e in range(len(shard)):
            meta = shard.meta(e)
            ep = rollout(CONFIG, int(meta["episode"]))
            assert (ep.seed, CONFIG.kinds.index(ep.kind)) == (meta["seed"], meta["kind"])
            policy, k = LAYOUTS[int(meta["layout"])], int(meta["window"])
            builder = PromptBuilder(factory, AgentConfig(policy=policy, window=max(k, 1)),
                                    CONFIG.screen)
            i = int(meta["step"])
            pngs = [render_png(s.state) for s in ep.steps[: i + 1]]
            want = builder.step(ep.instruction, [PastStep(p, s.action)
                                                 for p, s in zip(pngs, ep.steps)][:i],
                                pngs[i], ep.steps[i].action)
            assert shard.pieces(e) == want.pieces
            assert meta["shown"] == sum(isinstance(p, ImagePiece) for p in want.pieces)
            checked += 1
    assert checked == load_manifest(dataset)["totals"]["examples"]


def test_layouts_mix_terminal_interleaved_and_windows(engine: object, tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, episodes=8, shard_episodes=8, perturbed=0.0, slipped=0.0)
    m = generate(engine, config, tmp_path)  # type: ignore[arg-type]
    t = m["totals"]
    assert set(t["by_layout"]) == set(LAYOUTS)
    assert {k for k in t["rows"]["by_window"] if "/" not in k} == {"1", "2", "3", "4", "5",
                                                                   "all"}
    (shard,) = shards(tmp_path)
    steps = {(int(a), int(b)) for a, b in zip(shard.a["meta_episode"], shard.a["meta_step"])}
    per_step = len(shard) / len(steps)
    assert 2 <= per_step <= config.variants  # identical prompts are kept once
    assert t["recovery_examples"] == 0 and t["by_mode"] == {"clean": len(shard)}


def test_perturbed_episodes_teach_recovery(engine: object, tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, episodes=4, shard_episodes=4, perturbed=1.0, slipped=0.0,
                          variants=1)
    generate(engine, config, tmp_path)  # type: ignore[arg-type]
    (shard,) = shards(tmp_path)
    for e in range(4):
        ep = rollout(config, e)
        assert ep.mode == PERTURBED and ep.steps[ep.off_at].perturbed
        rows = np.flatnonzero(shard.a["meta_episode"] == e)
        recovery = shard.a["meta_recovery"][rows]
        assert list(recovery) == [s >= ep.off_at for s in shard.a["meta_step"][rows]]
        # every step is a target, the perturbed one too: the expert's first recovery action
        assert len(rows) == len(ep.steps) and sum(recovery) == len(ep.steps) - ep.off_at
        assert set(shard.a["meta_mode"][rows]) == {PERTURBED}


def test_a_slip_is_in_the_history_and_never_a_target(engine: object, tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, episodes=4, shard_episodes=4, perturbed=0.0, slipped=1.0,
                          variants=1)
    generate(engine, config, tmp_path)  # type: ignore[arg-type]
    (shard,) = shards(tmp_path)
    factory = SegmentFactory(engine)  # type: ignore[arg-type]
    for e in range(4):
        ep = rollout(config, e)
        k = ep.off_at
        assert ep.mode == SLIPPED and [s.slip for s in ep.steps].count(True) == 1
        assert ep.steps[k].slip
        rows = np.flatnonzero(shard.a["meta_episode"] == e)
        steps = [int(x) for x in shard.a["meta_step"][rows]]
        assert k not in steps and len(steps) == len(ep.steps) - 1  # no example of the slip
        wrong = PromptBuilder(factory, AgentConfig(), CONFIG.screen).response(
            ep.steps[k].action)
        for row, step in zip(rows, steps):
            pieces = shard.pieces(int(row))
            history = engine.detokenize(  # type: ignore[attr-defined]
                [t for p in pieces[:-1] if isinstance(p, TextPiece) for t in p.tokens])
            target = engine.detokenize(pieces[-1].tokens[:-1])  # type: ignore[attr-defined]
            assert (f"Step {k}: {wrong}" in history) == (step > k)  # what the agent did
            assert shard.meta(int(row))["recovery"] == (step > k)
            assert target == PromptBuilder(factory, AgentConfig(), CONFIG.screen).response(
                ep.steps[step].action)  # the expert's


def test_early_typing_slips_type_the_task_s_text() -> None:
    """``early_typing``: a slipped episode's mistakes type its task's own text where the
    expert clicks, up to ``max_slip_run`` in a row."""
    from vmenv.actions import Click, TypeText
    from vmenv.simdesk import sample_task

    early = attrs.evolve(CONFIG, episodes=24, perturbed=0.0, slipped=1.0, early_typing=1.0,
                         max_slip_run=2)
    seen_run = False
    for e in range(early.episodes):
        ep = rollout(early, e)
        task = sample_task(ep.kind, ep.seed)
        slips = [i for i, s in enumerate(ep.steps) if s.slip]
        assert 1 <= len(slips) <= 2 and slips == list(range(ep.off_at, ep.off_at + len(slips)))
        seen_run |= len(slips) == 2
        first = ep.steps[slips[0]]
        if task.goal is not None and task.goal.text and isinstance(
                task.next_action(first.state), Click):
            assert first.action == TypeText(task.goal.text)
    assert seen_run


def test_screenshots_are_stored_once_with_the_encoder_s_bits(dataset: Path,
                                                             engine: object) -> None:
    for shard in shards(dataset):
        ids = list(shard.a["image_ids"])
        assert len(set(ids)) == len(ids)
        for i in range(shard.n_images):
            enc = shard.encoded(i)
            fresh = engine.encode_image(shard.png(i), use_cache=False)  # type: ignore[attr-defined]
            assert enc.image_id == fresh.image_id == ids[i]
            assert np.array_equal(enc.embeddings, fresh.embeddings)
            assert np.array_equal(enc.positions_at(17), fresh.positions_at(17))
            assert (enc.n_pos, enc.prefix_tokens, enc.suffix_tokens) == (
                fresh.n_pos, fresh.prefix_tokens, fresh.suffix_tokens)


def test_deterministic_and_resumable(dataset: Path, engine: object, tmp_path: Path) -> None:
    again = tmp_path / "again"
    generate(engine, CONFIG, again)  # type: ignore[arg-type]
    first = [_sha(p) for p in sorted(dataset.glob("shard-*.npz"))]
    assert [_sha(p) for p in sorted(again.glob("shard-*.npz"))] == first
    # a killed run: the second shard is missing; the rerun writes it alone, identically
    (again / "shard-00001.npz").unlink()
    before = (again / "shard-00000.npz").stat().st_mtime_ns
    m = generate(engine, CONFIG, again)  # type: ignore[arg-type]
    assert [_sha(p) for p in sorted(again.glob("shard-*.npz"))] == first
    assert (again / "shard-00000.npz").stat().st_mtime_ns == before
    assert m["totals"]["examples"] == load_manifest(dataset)["totals"]["examples"]
    # a manifest written before a setting existed (here pin_look_back): its default is what
    # those data were, so the shards are kept
    written = json.loads((again / MANIFEST).read_text())
    del written["config"]["pin_look_back"]
    (again / MANIFEST).write_text(json.dumps(written))
    generate(engine, CONFIG, again)  # type: ignore[arg-type]
    assert (again / "shard-00000.npz").stat().st_mtime_ns == before
    # another seed is another dataset: refused here, different data elsewhere
    other = attrs.evolve(CONFIG, seed=8)
    with pytest.raises(DatasetError):
        generate(engine, other, again)  # type: ignore[arg-type]
    generate(engine, attrs.evolve(other, episodes=3), tmp_path / "other")  # type: ignore[arg-type]
    assert _sha(tmp_path / "other" / "shard-00000.npz") != first[0]
    assert json.loads((again / MANIFEST).read_text())["config"]["seed"] == 7


def test_a_code_typed_after_its_screen_left_the_window_is_left_out(engine: object,
                                                                   tmp_path: Path) -> None:
    config = attrs.evolve(CONFIG, kinds=("remember-code",), episodes=3, shard_episodes=3,
                          perturbed=0.0, slipped=0.0, variants=4)
    m = generate(engine, config, tmp_path)  # type: ignore[arg-type]
    assert m["totals"]["unanswerable_skipped"] > 0
    (shard,) = shards(tmp_path)
    typed = 0
    for e in range(len(shard)):
        target = engine.detokenize(shard.pieces(e)[-1].tokens)  # type: ignore[attr-defined]
        meta = shard.meta(e)
        if target.startswith("type("):
            typed += 1
            assert meta["shown"] == meta["step"] + 1  # the code's screen is in the prompt
    assert typed > 0


def test_the_marked_app_clicked_after_its_screen_left_the_window_is_left_out(
        engine: object, tmp_path: Path) -> None:
    """marked-launch's last click names the ``marked`` class (the lookup finds it on the first
    screenshot only): an example keeps it only when that screenshot is in the prompt."""
    config = attrs.evolve(CONFIG, kinds=("marked-launch",), episodes=3, shard_episodes=3,
                          perturbed=0.0, slipped=0.0, variants=4)
    m = generate(engine, config, tmp_path)  # type: ignore[arg-type]
    assert m["totals"]["unanswerable_skipped"] > 0
    (shard,) = shards(tmp_path)
    marked = 0
    for e in range(len(shard)):
        meta = shard.meta(e)
        if meta["clicked"] == "marked":
            marked += 1
            assert meta["step"] >= 4  # four screens after the mark: a K = 3 window lost it
            assert meta["shown"] == meta["step"] + 1  # every screenshot, the first included
    assert marked > 0


def test_pinned_layouts_keep_the_marked_click_after_its_screen_left_the_window(
        engine: object, tmp_path: Path) -> None:
    """With ``pin_share`` the terminal variants pin the first screenshot: marked-launch's last
    click (its mark on screenshot 0 only) is then kept in K = 3 windows that show three
    screenshots, the first and the newest two, where without a pin it is left out."""
    config = attrs.evolve(CONFIG, kinds=("marked-launch",), episodes=3, shard_episodes=3,
                          perturbed=0.0, slipped=0.0, variants=4, windows=(3,),
                          noevict_share=0.0)
    plain, pinned = tmp_path / "plain", tmp_path / "pinned"

    def marked_shown(out: Path, share: float) -> list[tuple[int, int]]:
        generate(engine, attrs.evolve(config, pin_share=share), out)  # type: ignore[arg-type]
        (shard,) = shards(out)
        return [(m["step"], m["shown"]) for m in map(shard.meta, range(len(shard)))
                if m["clicked"] == "marked"]

    assert marked_shown(plain, 0.0) == []  # K = 3 never shows screenshot 0 at step >= 4
    kept = marked_shown(pinned, 1.0)
    assert kept and all(step >= 4 and shown == 3 for step, shown in kept)
    assert load_manifest(pinned)["config"]["pin_share"] == 1.0


def test_look_back_steps_are_laid_out_pinned_where_their_layout_dropped_the_first_screen(
        engine: object, tmp_path: Path) -> None:
    """``pin_look_back``: marked-launch's last click, which a K = 3 window cannot answer,
    is laid out pinned (the first screenshot and the newest two) in place of every drawn
    layout — terminal or interleaved — instead of being skipped; the other steps keep the
    layouts drawn for them."""
    config = attrs.evolve(CONFIG, kinds=("marked-launch",), episodes=3, shard_episodes=3,
                          perturbed=0.0, slipped=0.0, variants=4, windows=(3,),
                          noevict_share=0.0)
    plain, repinned = tmp_path / "plain", tmp_path / "repinned"
    skipped = generate(engine, config, plain)["totals"]["unanswerable_skipped"]  # type: ignore[arg-type]
    m = generate(engine, attrs.evolve(config, pin_look_back=True), repinned)  # type: ignore[arg-type]
    assert skipped > 0 and m["totals"]["unanswerable_skipped"] == 0
    (before,), (after,) = shards(plain), shards(repinned)
    metas = [after.meta(e) for e in range(len(after))]
    marked = [x for x in metas if x["clicked"] == "marked"]
    assert marked and all(x["step"] >= 4 and x["shown"] == 3
                          and x["layout"] == LAYOUTS.index(TERMINAL) for x in marked)
    # one example per distinct layout of each episode's last step (the 4 variants of a
    # K = 3 window lay out at most 2 distinct prompts: terminal and pinned-terminal)
    assert len(marked) >= 3
    # every other example is the plain run's, layout for layout
    others = [(x["episode"], x["step"], x["layout"], x["window"], x["shown"])
              for x in metas if x["clicked"] != "marked"]
    assert others == [(x["episode"], x["step"], x["layout"], x["window"], x["shown"])
                      for x in map(before.meta, range(len(before)))]
