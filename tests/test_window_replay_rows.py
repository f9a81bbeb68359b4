"""window-replay's engine side on the forged qwen35 (hybrid, IMROPE, qwen3vl_merger
projector): a hybrid's state blob parsed into attention rows and composed back with its
recurrent part (``kv_blob.parse_hybrid``), and M-RoPE re-rotation of cached keys in numpy
(``kv_rope``, ``kv_patch.relocate``) against the rows llama.cpp writes when the same unit is
prefilled at another position.

Tolerances as in ``tests/test_kv_store.py``: the cache is f16; llama.cpp rotates in float32,
``kv_rope`` in float64 with one rounding, so a re-rotated key may differ by one f16 step."""

from __future__ import annotations

import numpy as np
import pytest

from cachepolicy.engine.errors import UnsafeEditError
from cachepolicy.engine.kv_blob import KvRows, compose, parse_hybrid
from cachepolicy.engine.kv_patch import relocate
from cachepolicy.engine.kv_rope import ROPE_IMROPE, TEXT_STEP, RopeSpec, rotate
from test_kv_store import _png, _ulps  # the same screenshots and f16-step measure

CONTEXT = list(range(10, 40))


@pytest.fixture
def qwen(engines):
    engine = engines("qwen35")
    yield engine
    for s in range(3):
        engine.clear(s)


def _unit(engine, seq: int, image) -> tuple[int, int]:
    p0 = engine.seq_info(seq).next_pos
    engine.prefill_tokens(seq, [60, 61, 62], logits=False)
    engine.prefill_image(seq, image)
    engine.prefill_tokens(seq, [63, 64], logits=False)
    return p0, engine.seq_info(seq).next_pos


def _steps(engine, image, rows: KvRows, p0: int) -> np.ndarray:
    """Each cell's component steps: the image's cells mtmd's, the text cells' TEXT_STEP."""
    img0, img1 = p0 + 3, p0 + 3 + image.n_pos
    steps = np.tile(np.asarray(TEXT_STEP), (rows.n_cells, 1))
    in_image = (rows.pos >= img0) & (rows.pos < img1) & (rows.ext[:, 2] == -1)
    steps[in_image] = image.pos_step
    return steps


def test_the_hybrid_blob_is_attention_rows_then_the_recurrent_part(qwen) -> None:
    """Cells carry (x, y, tok): text at x = y = p with its token, the image's its grid and
    -1; the recurrent part is what a PARTIAL_ONLY snapshot holds; composing the rows with it
    gives back llama.cpp's own bytes, and a sequence written that way continues bitwise."""
    image = qwen.encode_image(_png(1))
    qwen.prefill_tokens(0, CONTEXT, logits=False)
    p0, p1 = _unit(qwen, 0, image)
    blob = qwen.kv._blob(0, 0)
    fmt, rows, recurrent = parse_hybrid(blob, cell_ext=True)
    assert fmt.cell_ext and recurrent == qwen.kv._blob(0, 1)[8:]
    assert rows.n_cells == qwen.seq_info(0).n_tokens
    text = rows.ext[:, 2] != -1
    assert np.array_equal(rows.ext[text, 0], rows.pos[text])
    assert np.array_equal(rows.ext[text, 1], rows.pos[text])
    assert list(rows.ext[text, 2][: len(CONTEXT)]) == CONTEXT
    grid = image.positions_at(p0 + 3)  # (t, y, x, z) per image row, as mtmd places them
    img = ~text
    assert np.array_equal(rows.pos[img], grid[0]) and np.array_equal(rows.ext[img, 1], grid[1])
    assert np.array_equal(rows.ext[img, 0], grid[2])
    assert compose(fmt, rows, 0, recurrent=recurrent) == blob
    ref = qwen.prefill_tokens(0, [5, 6, 7])
    qwen.clear(0)
    qwen.prefill_tokens(0, CONTEXT, logits=False)
    _unit(qwen, 0, image)
    history = qwen.seq_info(0).history
    read = qwen.kv_read_attention(0)
    qwen.kv_write_attention(0, read, history)  # the sequence's own recurrent state kept
    assert qwen.seq_info(0).history == history
    assert np.array_equal(ref, qwen.prefill_tokens(0, [5, 6, 7]))
    with pytest.raises(UnsafeEditError):
        qwen.kv_read(0)  # the whole-state API still refuses a hybrid


def test_imrope_pair_components_follow_ggml() -> None:
    spec = RopeSpec(rope_type=ROPE_IMROPE, n_rot=8, head_dim=32, freq_base=1e6,
                    sections=(2, 1, 1, 0))
    assert list(spec.pair_components()) == [0, 1, 2, 0]
    spec24 = RopeSpec(rope_type=ROPE_IMROPE, n_rot=64, head_dim=128, freq_base=1e6,
                      sections=(11, 11, 10, 0))
    comp = spec24.pair_components()
    assert list(comp[:6]) == [0, 1, 2, 0, 1, 2] and comp[30] == 0 and comp[31] == 1
    # a per-component move of (d, d, d, 0) with no z pair is one rotation by d of every pair
    k = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float16)
    assert np.array_equal(rotate(spec, k, np.tile([9, 9, 9, 0], (5, 1))),
                          rotate(spec, k, np.tile([9, 9, 9, 5], (5, 1))))
    with pytest.raises(ValueError, match="per-component"):
        rotate(spec, k, 9)


@pytest.mark.parametrize("delta", [7, 200, 1500])
def test_mrope_rerotated_rows_equal_the_rows_prefilled_there(qwen, delta) -> None:
    """A unit (text, image, text) after CONTEXT, rows read and moved by ``delta`` in numpy,
    against the same tokens prefilled from position ``delta``: positions and cell extensions
    equal, V of the first attention layer bitwise, every K within one f16 step and every V
    within two (later layers see keys llama.cpp rotated at the other angles)."""
    assert qwen.rope.multi_section and qwen.rope.rerotation_problem is None
    image = qwen.encode_image(_png(2))
    qwen.prefill_tokens(0, CONTEXT, logits=False)
    p0, p1 = _unit(qwen, 0, image)
    here = qwen.kv_read_attention(0).between(p0, p1)
    qwen.prefill_tokens(1, CONTEXT, logits=False, at=delta)
    q0, q1 = _unit(qwen, 1, image)
    assert (q0, q1) == (p0 + delta, p1 + delta)
    there = qwen.kv_read_attention(1).between(q0, q1)
    moved = relocate(qwen.rope, here, delta, _steps(qwen, image, here, p0))
    assert np.array_equal(moved.pos, there.pos) and np.array_equal(moved.ext, there.ext)
    assert np.array_equal(moved.v[0], there.v[0])
    k_ulps = max(_ulps(a, b) for a, b in zip(moved.k, there.k))
    v_ulps = max(_ulps(a, b) for a, b in zip(moved.v, there.v))
    assert k_ulps <= 1 and v_ulps <= 2, (k_ulps, v_ulps)
    # and it is the rotation that does it: the unmoved keys are far off
    assert max(_ulps(a, b) for a, b in zip(here.k, there.k)) > 4
