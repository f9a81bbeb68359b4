"""The screenshot store's engine side on the real engine (forged tiny llama + LLaVA-style
projector): KV rows read out of and written into a sequence through llama.cpp's state API,
re-rotated to other positions (``kv_rope``), and the low-rank conditioning patch
(``kv_patch``).

Tolerances, stated once: the cache is f16, and llama.cpp rotates keys in float32 while
``kv_rope`` rotates in float64 and rounds once, so two re-rotations of the same row may
differ by one f16 step.  ``_ulps`` measures a difference in f16 steps at the magnitude of
the largest value of the layer (the coarsest step a value of the layer has).
"""

from __future__ import annotations

import gc
import io

import numpy as np
import pytest
from PIL import Image

from cachepolicy.engine.errors import UnsafeEditError
from cachepolicy.engine.kv_blob import KvRows, compose, parse
from cachepolicy.engine.kv_patch import StoredKv, make_patch, place, relocate
from cachepolicy.executor import kl_divergence

CONTEXT = list(range(10, 40))  # the canonical context (30 tokens)
OTHER = list(range(300, 345))  # another antecedent: the conditioning a patch must carry


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _ulps(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| in f16 steps at the larger array's largest magnitude."""
    scale = np.float16(max(np.abs(a.astype(np.float32)).max(),
                           np.abs(b.astype(np.float32)).max()))
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()
                 / float(np.spacing(scale)))


def _max_ulps(x: KvRows, y: KvRows) -> tuple[float, float]:
    assert np.array_equal(x.pos, y.pos)
    return (max(_ulps(a, b) for a, b in zip(x.k, y.k)),
            max(_ulps(a, b) for a, b in zip(x.v, y.v)))


def _unit(engine, seq: int, image) -> tuple[int, int]:
    """Prefill the unit (an image between two short texts); its positions [p0, p1)."""
    p0 = engine.seq_info(seq).next_pos
    engine.prefill_tokens(seq, [60, 61, 62], logits=False)
    engine.prefill_image(seq, image)
    engine.prefill_tokens(seq, [63, 64], logits=False)
    return p0, engine.seq_info(seq).next_pos


@pytest.fixture
def llama(engines):
    engine = engines("llama")
    yield engine
    for s in range(3):
        engine.clear(s)


def test_a_read_sequence_written_back_continues_bitwise(llama) -> None:
    image = llama.encode_image(_png(1))
    llama.prefill_tokens(0, CONTEXT, logits=False)
    _unit(llama, 0, image)
    ref = llama.prefill_tokens(0, [5, 6, 7])
    llama.clear(0)
    llama.prefill_tokens(0, CONTEXT, logits=False)
    _unit(llama, 0, image)
    history = llama.seq_info(0).history
    rows = llama.kv_read(0)
    llama.kv_write(1, rows, history)  # into another sequence
    assert llama.seq_info(1).history == history
    out = llama.prefill_tokens(1, [5, 6, 7])
    assert np.array_equal(ref, out)


def test_blob_parse_compose_round_trip(llama) -> None:
    llama.prefill_tokens(0, CONTEXT, logits=False)
    rows = llama.kv_read(0)
    assert rows.n_cells == len(CONTEXT) and rows.k[0].dtype == np.float16
    fmt, again = parse(compose(llama.kv._format, rows, 0))
    assert np.array_equal(again.pos, rows.pos)
    assert all(np.array_equal(a, b) for a, b in zip(again.k + again.v, rows.k + rows.v))


@pytest.mark.parametrize("delta", [7, 200, 1500])
def test_rerotated_canonical_kv_equals_the_kv_prefilled_at_that_position(llama, delta) -> None:
    """The canonical unit (CONTEXT, then the unit, from position 0) re-rotated by ``delta``
    against the same tokens prefilled from position ``delta``: V of the first layer is
    bitwise equal (it does not depend on position), every K and V within 2 f16 steps (the
    rotation's rounding, and later layers seeing keys rounded at other angles)."""
    image = llama.encode_image(_png(2))
    llama.prefill_tokens(0, CONTEXT, logits=False)
    p0, p1 = _unit(llama, 0, image)
    canon = llama.kv_read(0).between(p0, p1)
    llama.prefill_tokens(1, CONTEXT, logits=False, at=delta)
    q0, q1 = _unit(llama, 1, image)
    assert (q0, q1) == (p0 + delta, p1 + delta)
    there = llama.kv_read(1).between(q0, q1)
    moved = relocate(llama.rope, canon, delta)
    assert np.array_equal(moved.v[0], there.v[0])
    k_ulps, v_ulps = _max_ulps(moved, there)
    assert k_ulps <= 2 and v_ulps <= 2, (k_ulps, v_ulps)


def test_numpy_rotation_matches_llama_cpps_own_shift(llama) -> None:
    """Removing a span with seq_rm + seq_add makes llama.cpp re-rotate the survivors (its
    K-shift, applied at the next decode); ``relocate`` does the same in numpy."""
    llama.prefill_tokens(0, OTHER, logits=False)
    llama.prefill_tokens(0, CONTEXT, logits=False)
    before = llama.kv_read(0).between(len(OTHER), len(OTHER) + len(CONTEXT))
    llama.remove_range(0, 0, len(OTHER))
    with pytest.raises(UnsafeEditError, match="shifted"):
        llama.kv_read(0)  # llama.cpp has not re-rotated the keys yet
    llama.prefill_tokens(1, [1, 2], logits=False)  # any decode applies the pending shift
    after = llama.kv_read(0)
    moved = relocate(llama.rope, before, -len(OTHER))
    k_ulps, v_ulps = _max_ulps(moved, after)
    assert v_ulps == 0 and k_ulps <= 1, k_ulps


def _conditioned(llama, image):
    """(own: the unit after OTHER and CONTEXT, canonical: after CONTEXT alone)."""
    llama.prefill_tokens(0, CONTEXT, logits=False)
    p0, p1 = _unit(llama, 0, image)
    canon = llama.kv_read(0).between(p0, p1)
    llama.prefill_tokens(1, OTHER + CONTEXT, logits=False)
    q0, q1 = _unit(llama, 1, image)
    own = llama.kv_read(1).between(q0, q1)
    return own, canon, (q0, q1)


def test_rank_zero_patch_is_plain_relocation_bitwise(llama) -> None:
    own, canon, (q0, _) = _conditioned(llama, llama.encode_image(_png(3)))
    assert make_patch(llama.rope, own, canon, 0) is None
    placed = place(llama.rope, StoredKv(canon, None), q0)
    moved = relocate(llama.rope, canon, q0 - int(canon.pos[0]))
    assert np.array_equal(placed.pos, moved.pos)
    assert all(np.array_equal(a, b) for a, b in zip(placed.k + placed.v, moved.k + moved.v))


def test_full_rank_patch_reproduces_the_conditioned_kv(llama) -> None:
    """Canonical + a full-rank patch, placed where the unit was in its real context, gives
    its conditioned KV within 4 f16 steps (the patch's factors are stored in f16: their
    product carries their rounding); the conditioning itself is far larger than that."""
    own, canon, (q0, _) = _conditioned(llama, llama.encode_image(_png(4)))
    full = min(own.n_cells, own.k[0].shape[1])
    patch = make_patch(llama.rope, own, canon, full)
    assert patch is not None and patch.energy == pytest.approx(1.0)
    rebuilt = place(llama.rope, StoredKv(canon, patch), q0)
    k_ulps, v_ulps = _max_ulps(rebuilt, own)
    assert k_ulps <= 4 and v_ulps <= 4, (k_ulps, v_ulps)
    bare = place(llama.rope, StoredKv(canon, None), q0)
    assert max(_max_ulps(bare, own)) > 50  # the conditioning a rank-0 reuse loses


@pytest.mark.parametrize("rank", [0, 8])
def test_a_placed_unit_rerotated_again_matches_a_fresh_placement(llama, rank) -> None:
    """kamera places a screenshot from the store once and re-rotates the placed rows at
    later slides: against placing the entry afresh at the new position, V is bitwise and K
    within 1 f16 step (the one extra rounding of a re-rotation)."""
    own, canon, (q0, _) = _conditioned(llama, llama.encode_image(_png(6)))
    stored = StoredKv(canon, make_patch(llama.rope, own, canon, rank))
    first = place(llama.rope, stored, q0 + 300)
    for shift in (-40, -300):
        again = relocate(llama.rope, first, shift)
        fresh = place(llama.rope, stored, q0 + 300 + shift)
        assert all(np.array_equal(a, b) for a, b in zip(again.v, fresh.v))
        assert _max_ulps(again, fresh)[0] <= 1


def test_patch_error_falls_with_rank_and_continuation_drift_with_it(llama) -> None:
    """The rebuilt unit's error and the next-token KL (the unit written into the sequence
    after its real antecedent, then the same continuation) shrink as the rank grows."""
    image = llama.encode_image(_png(5))
    own, canon, (q0, q1) = _conditioned(llama, image)
    ref = llama.prefill_tokens(1, [5, 6, 7])  # the exact continuation
    prefix = llama.kv_read(1).between(0, q0)
    history = llama.seq_info(1).history
    errs, kls, energies = [], [], []
    for rank in (0, 2, 8, 32):
        patch = make_patch(llama.rope, own, canon, rank)
        rebuilt = place(llama.rope, StoredKv(canon, patch), q0)
        errs.append(sum(float(np.abs(a.astype(np.float64) - b).sum())
                        for a, b in zip(rebuilt.k + rebuilt.v, own.k + own.v)))
        energies.append(patch.energy if patch is not None else 0.0)
        llama.kv_write(2, KvRows.concat([prefix, rebuilt]), history[:-1])
        kls.append(kl_divergence(ref, llama.prefill_tokens(2, [5, 6, 7])))
        llama.clear(2)
    assert errs == sorted(errs, reverse=True) and energies == sorted(energies)
    assert kls[-1] < kls[0]


def test_stored_kv_is_counted_while_referenced(llama) -> None:
    llama.prefill_tokens(0, CONTEXT, logits=False)
    rows = llama.kv_read(0)
    base = llama.memory()
    kept = llama.kv_keep(rows)
    mem = llama.memory()
    assert mem.live_stored_kv == base.live_stored_kv + 1
    assert mem.live_stored_kv_bytes == base.live_stored_kv_bytes + rows.nbytes
    del kept
    gc.collect()
    assert llama.memory().live_stored_kv_bytes == base.live_stored_kv_bytes


def test_hybrid_model_rows_are_refused(engines) -> None:
    qwen = engines("qwen35")
    assert qwen.kv_edit_problem is not None
    qwen.prefill_tokens(0, CONTEXT, logits=False)
    try:
        with pytest.raises(UnsafeEditError):
            qwen.kv_read(0)
    finally:
        qwen.clear(0)
