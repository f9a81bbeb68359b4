"""Training closes the loop: JAX-trained weights → GGUF → llama.cpp's greedy decode says what
was trained; the step is deterministic; the loss only sees response tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.forge import ForgedModel
from runtime.train import (
    AdamW, ImagePiece, TextPiece, build_example, collate, export_gguf, init_params, init_state,
    load_gguf, loss_fn, make_train_step,
)
from test_train_parity import png_bytes

CONFIG = EngineConfig(n_ctx_per_seq=1024, n_seq_max=1, n_threads=2, decode_rows=1)
HEAD = "<|im_start|>user\nclick the submit button"
TAIL = "<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "click(10, 20)<|im_end|>"
SCREEN = png_bytes(160, 96)


def prompt(engine: Engine) -> list[TextPiece | ImagePiece]:
    return [TextPiece(engine.tokenize(HEAD)), ImagePiece(SCREEN), TextPiece(engine.tokenize(TAIL))]


def greedy_answer(engine: Engine, n: int) -> list[int]:
    """Prefill the prompt as the runtime does (text, image, text) and decode greedily."""
    enc = engine.encode_image(SCREEN)
    engine.prefill_tokens(0, [*engine.tokenize(HEAD), *enc.prefix_tokens], logits=False)
    engine.prefill_image(0, enc)
    logits = engine.prefill_tokens(0, [*enc.suffix_tokens, *engine.tokenize(TAIL)])
    assert logits is not None
    try:
        return engine.generate(0, logits, n)
    finally:
        engine.clear(0)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_overfit_in_jax_then_llama_cpp_decodes_the_trained_answer(
        arch: str, forged: Callable[..., ForgedModel], tmp_path: Path) -> None:
    m = forged(arch)
    model = load_gguf(m.model_path)
    with Engine(m.model_path, m.mmproj_path, CONFIG) as engine:
        pieces = prompt(engine)
        answer = list(engine.tokenize(ANSWER))
        before = greedy_answer(engine, len(answer))
        example = build_example(engine, [*pieces, TextPiece(answer, train=True)])
    assert before != answer  # the random model does not already say it
    assert example.n_train_tokens == len(answer)
    batch = collate([example], 64)
    step = make_train_step(model.spec, AdamW(learning_rate=3e-3, warmup_steps=5))
    state = init_state(model.params)
    for _ in range(60):
        state, metrics = step(state, batch)
    assert float(metrics["loss"]) < 0.05 and float(metrics["accuracy"]) == 1.0
    out = export_gguf(tmp_path / "trained.gguf", model.spec, state.params, vocab=model.vocab)
    with Engine(out.path, m.mmproj_path, CONFIG) as engine:
        assert greedy_answer(engine, len(answer)) == answer


def test_training_is_deterministic_from_a_seed(forged: Callable[..., ForgedModel]) -> None:
    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path, CONFIG) as engine:
        pieces = prompt(engine)
        example = build_example(engine, [*pieces, TextPiece(engine.tokenize(ANSWER), train=True)])
    spec = load_gguf(m.model_path).spec
    batch = collate([example, example], 64)
    step = make_train_step(spec, AdamW(learning_rate=1e-3, weight_decay=0.01))
    finals = []
    for _ in range(2):  # two runs from the same seed through the same compiled step
        state = init_state(init_params(spec, seed=11))
        for _ in range(3):
            state, _ = step(state, batch)
        finals.append(jax.device_get(state.params))
    assert all(np.array_equal(finals[0][k], finals[1][k]) for k in finals[0])
    other = init_params(spec, seed=12)
    assert not np.array_equal(np.asarray(other["blk.0.ffn_up.weight"]),
                              np.asarray(init_params(spec, seed=11)["blk.0.ffn_up.weight"]))


def test_loss_reads_only_response_rows(forged: Callable[..., ForgedModel]) -> None:
    m = forged("llama")
    model = load_gguf(m.model_path)
    with Engine(m.model_path, m.mmproj_path, CONFIG) as engine:
        pieces = prompt(engine)
        example = build_example(engine, [*pieces, TextPiece(engine.tokenize(ANSWER), train=True)])
    batch = collate([example], 64)
    loss, metrics = loss_fn(model.params, batch, model.spec)
    assert int(metrics["n_tokens"]) == example.n_train_tokens
    # other targets where the mask is 0 (prompt rows, image rows, padding): same loss
    scrambled = batch._replace(targets=jnp.where(batch.loss_mask > 0, batch.targets, 5))
    assert float(loss_fn(model.params, scrambled, model.spec)[0]) == float(loss)
    # a different target on one response row: another loss
    row = int(np.flatnonzero(np.asarray(batch.loss_mask[0]))[0])
    changed = batch._replace(targets=batch.targets.at[0, row].set(5))
    assert float(loss_fn(model.params, changed, model.spec)[0]) != float(loss)


def test_kind_weights_shift_the_share_of_updates_and_leave_the_equal_order_alone() -> None:
    from itertools import islice

    from runtime.train.fit import _order

    kinds = [0] * 10 + [1] * 30 + [2] * 5  # example i's kind
    equal = list(islice(_order(kinds, seed=3), 3000))
    assert list(islice(_order(kinds, seed=3, weights={}), 3000)) == equal  # no weights: as before
    share = np.bincount([kinds[i] for i in equal], minlength=3) / 3000
    assert np.all(np.abs(share - 1 / 3) < 0.04)  # equal shares, whatever each kind's size
    weighted = list(islice(_order(kinds, seed=3, weights={2: 3.0}), 3000))
    share = np.bincount([kinds[i] for i in weighted], minlength=3) / 3000
    assert abs(share[2] - 0.6) < 0.04 and abs(share[0] - 0.2) < 0.04  # 3 : 1 : 1
    # every example of a kind comes once per that kind's epoch
    firsts = [i for i in weighted if kinds[i] == 2][:5]
    assert sorted(firsts) == [40, 41, 42, 43, 44]


def test_clicked_weights_draw_a_rare_click_as_a_group_of_its_own(tmp_path: Path) -> None:
    from itertools import islice

    from runtime.train.fit import _groups, _order
    from runtime.train.shards import META, PieceKind, Projector, Shard, ShardWriter

    writer = ShardWriter(Projector((), (), 8))
    # kind 0: 40 examples, 4 of them the look-back click ``marked``; kind 1: 40 examples
    clicked = ["marked" if i % 10 == 0 else "notes.save" for i in range(40)] + [""] * 40
    for i, c in enumerate(clicked):
        meta = {k: 0 for k in META} | {"kind": i // 40, "clicked": c}
        writer.add_example([(PieceKind.TARGET, [1, 2])], **meta)
    writer.write(tmp_path / "s.npz")
    shard = Shard(tmp_path / "s.npz", Projector((), (), 8))
    index = [(shard, e) for e in range(len(shard))]
    kinds = ("save-note", "open-terminal")
    assert _groups(index, kinds, ()) == [i // 40 for i in range(80)]  # no weights: the kinds
    for absent in ("markd", "open-terminal/marked"):  # a misspelt class weighs nothing
        with pytest.raises(ValueError, match=absent):
            _groups(index, kinds, ((absent, 1.0),))
    # KIND/CLASS: that kind's clicks of the class; the first entry an example matches wins
    pair = _groups(index, kinds, (("marked", 1.0), ("save-note/notes.save", 1.0)))
    assert pair == [2 if c == "marked" else 3 if c == "notes.save" else 1 for c in clicked]
    groups = _groups(index, kinds, (("marked", 1.0),))
    assert [i for i, g in enumerate(groups) if g == 2] == [0, 10, 20, 30]
    drawn = list(islice(_order(groups, seed=1, weights={2: 1.0}), 3000))
    share = sum(clicked[i] == "marked" for i in drawn) / 3000
    assert abs(share - 1 / 3) < 0.04  # a third of the updates, against 1/20 within its kind
    plain = list(islice(_order(_groups(index, kinds, ()), seed=1), 3000))
    assert sum(clicked[i] == "marked" for i in plain) / 3000 < 0.08


def test_click_weights_parse_class_weight_pairs() -> None:
    from runtime.train.recipe_config import parse_click_weights

    assert parse_click_weights("") == ()
    assert parse_click_weights(" marked=1, notes.save=0.5") == (("marked", 1.0),
                                                                ("notes.save", 0.5))
    assert parse_click_weights("marked-launch/notes.save=2") == (("marked-launch/notes.save", 2.0),)
    for bad in ("marked", "marked=0", "marked=-1", "=1", "marked=x", "marked=inf", "marked=nan",
                "a=1,a=2"):
        with pytest.raises(ValueError):
            parse_click_weights(bad)
