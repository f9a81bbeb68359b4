"""Re-rotating cached keys: RoPE composes, R(a) R(b) = R(a + b), so a key cached at position
p moves to p + d by one more rotation R(d) (values do not move: RoPE touches only K).

This is llama.cpp's own K-shift (``llama_kv_cache::build_rope_shift``, what ``seq_add``
triggers at the next decode) done in numpy on rows read out of a state blob, so a cell can be
moved anywhere — also to a position another cell of the sequence holds now, which ``seq_add``
cannot do.  Numerics: angles in float64, the rotation of f16 rows in float64, rounded once to
the cache type; llama.cpp computes angles and rotation in float32 on the same f16 rows.  The
two agree within one f16 step per element (``tests/test_kv_store.py`` measures it).

Supported: NORM (llama: adjacent pairs) and NEOX (halves) rotation of the first ``n_rot``
dimensions of each head, with a linear frequency scale; YaRN and other scaled variants are
refused.  Multi-section RoPE (MROPE: Qwen2-VL; IMROPE: Qwen3-VL, qwen35) is re-rotated too
(``rerotation_problem``), which llama.cpp's own K-shift refuses (``get_can_shift`` is false
for more than one position per embedding): a key's pair ``i`` turns by the position component
its *section* picks (``pair_components``: t, y, x or z, as ggml's ``rope_multi`` picks it,
NEOX pairs), so moving a cell is one rotation per pair by that component's move — a row of
deltas per cell (``rotate``'s ``delta`` of shape (n, 4)).  How each component moves with a
unit's start is the caller's to say (``TEXT_STEP``; an image's ``EncodedImage.pos_step``).
``RopeSpec.problem`` — what kamera and the token evictors ask — still refuses multi-section
RoPE: their store paths are not validated on it (only window-replay's sequence rows are).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

ROPE_NORM, ROPE_NEOX = 0, 2  # llama.cpp's LLAMA_ROPE_TYPE_NORM / _NEOX
#: llama.cpp's LLAMA_ROPE_TYPE_MROPE (Qwen2-VL / 2.5-VL) and _IMROPE (Qwen3-VL, Qwen3.5)
ROPE_MROPE, ROPE_IMROPE = 8, 40
MULTI_SECTION = (ROPE_MROPE, ROPE_IMROPE)
#: How a text token's four M-RoPE components move with its position: llama.cpp's batch gives
#: a text row at position p the components (t, y, x, z) = (p, p, p, 0) (its cells then hold
#: x = y = p: ``kv_blob``); an image row's step is mtmd's (``EncodedImage.pos_step``).
TEXT_STEP = (1, 1, 1, 0)


def shift_refusal(rope_type: int) -> str | None:
    """Why llama.cpp will not shift a model's cached positions for its RoPE (``seq_add``:
    relocate's edit; ``llama_memory_can_shift`` is false), or None where its RoPE allows it."""
    if rope_type in (ROPE_MROPE, ROPE_IMROPE):
        return ("llama.cpp does not shift cached positions under multi-section RoPE (a "
                "position has 4 components; its K-shift rotates by one)")
    return None


@attrs.frozen
class RopeSpec:
    """How a model rotates its keys (read from the model at load)."""

    rope_type: int  # llama_model_rope_type
    n_rot: int  # rotated dimensions per head (rope.dimension_count)
    head_dim: int  # K dimensions per head
    freq_base: float
    freq_scale: float = 1.0
    scaling: str = "none"  # rope.scaling.type in the GGUF, if any
    #: rope.dimension_sections (multi-section RoPE: pairs per t / y / x / z section)
    sections: tuple[int, ...] = ()

    @property
    def problem(self) -> str | None:
        """Why rows of this model cannot be re-rotated here (None: they can)."""
        if self.rope_type in (ROPE_MROPE, ROPE_IMROPE):
            return (f"multi-section RoPE (rope type {self.rope_type}): a key is rotated per "
                    "section by its position's t / y / x components, which llama.cpp's state "
                    "blob keeps apart per cell; re-rotation here moves one position (only "
                    "NORM and NEOX)")
        if self.rope_type not in (ROPE_NORM, ROPE_NEOX):
            return f"rope type {self.rope_type} (only NORM and NEOX re-rotate here)"
        return self._rotation_problem()

    def _rotation_problem(self) -> str | None:
        """What any re-rotation here needs of the frequencies and head shape: a linear (or
        no) frequency scale, an even ``n_rot`` within the head."""
        if self.scaling not in ("none", "linear", ""):
            return f"rope scaling {self.scaling!r}"
        if self.n_rot % 2 or self.n_rot > self.head_dim or self.head_dim <= 0:
            return f"n_rot {self.n_rot} with head dim {self.head_dim}"
        return None

    @property
    def rerotation_problem(self) -> str | None:
        """Why ``rotate`` cannot move this model's cached keys (None: it can) — the same as
        ``problem`` but for multi-section RoPE with known sections, which it re-rotates."""
        if self.rope_type not in MULTI_SECTION:
            return self.problem
        if len(self.sections) != 4 or sum(self.sections) <= 0:
            return f"multi-section RoPE with unknown sections {self.sections}"
        return self._rotation_problem()

    @property
    def multi_section(self) -> bool:
        return self.rope_type in MULTI_SECTION

    def pair_components(self) -> np.ndarray:
        """For each rotated pair, the position component (0..3 = t, y, x, z) its angle is
        taken from (``sector_components``); one component (t) for NORM / NEOX."""
        if not self.multi_section:
            return np.zeros(self.n_rot // 2, dtype=np.int64)
        return sector_components(self.rope_type, self.sections, self.n_rot // 2)

    def inv_freq(self) -> np.ndarray:
        """Angle per position step of each rotated pair (float64)."""
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        return self.freq_scale * self.freq_base ** (-2.0 * i / self.n_rot)


def sector_components(rope_type: int, sections: Sequence[int], n_pairs: int) -> np.ndarray:
    """For each of ``n_pairs`` rotated pairs under multi-section RoPE, the position component
    (0..3 = t, y, x, z) its angle is taken from — ggml's ``rope_multi`` sector rule
    (``ggml_mrope_cache_init``): sector ``s = i mod sum(sections)``; IMROPE interleaves (y if
    ``s % 3 == 1`` and ``s < 3 sections[1]``, x if ``s % 3 == 2`` and ``s < 3 sections[2]``,
    t if ``s % 3 == 0`` and ``s < 3 sections[0]``, else z), MROPE takes consecutive blocks.
    The one implementation: the engine's re-rotation and the trainer's forward
    (``runtime.train.rope``) both read it."""
    sec = tuple(sections)
    total = sum(sec)
    out = np.empty(n_pairs, dtype=np.int64)
    for i in range(n_pairs):
        s = i % total
        if rope_type == ROPE_IMROPE:
            if s % 3 == 1 and s < 3 * sec[1]:
                out[i] = 1
            elif s % 3 == 2 and s < 3 * sec[2]:
                out[i] = 2
            elif s % 3 == 0 and s < 3 * sec[0]:
                out[i] = 0
            else:
                out[i] = 3
        else:
            out[i] = (0 if s < sec[0] else 1 if s < sec[0] + sec[1]
                      else 2 if s < sec[0] + sec[1] + sec[2] else 3)
    return out


def rotate(spec: RopeSpec, k: np.ndarray, delta: np.ndarray | int,
           out_dtype: np.dtype | None = None) -> np.ndarray:
    """``k`` (n_cells, n_heads * head_dim) rotated by ``delta`` positions (one per cell, or
    one for all; under multi-section RoPE also one row of four per cell, (n, 4): each
    component's move); float64 in, the rows' own type (or ``out_dtype``) out."""
    if (why := spec.rerotation_problem) is not None:
        raise ValueError(f"cannot re-rotate keys: {why}")
    n, width = k.shape
    if width % spec.head_dim:
        raise ValueError(f"K rows of width {width} are not whole heads of {spec.head_dim}")
    x = np.asarray(k, dtype=np.float64).reshape(n, width // spec.head_dim, spec.head_dim)
    dd = np.asarray(delta, dtype=np.float64)
    if dd.ndim == 2:  # per component: each pair turns by its section's component's move
        if dd.shape != (n, 4) or not spec.multi_section:
            raise ValueError("per-component deltas are (n_cells, 4), for multi-section RoPE")
        per_pair = dd[:, spec.pair_components()]  # (n, n_rot/2)
    elif spec.multi_section:
        raise ValueError("multi-section RoPE moves each position component on its own: give "
                         "per-component deltas, (n_cells, 4)")
    elif dd.ndim == 0:  # one move for every cell: its angles once, broadcast over the cells
        per_pair = dd.reshape(1, 1)
    else:
        per_pair = np.broadcast_to(dd, (n,))[:, None]
    theta = per_pair * spec.inv_freq()[None, :]  # (n or 1, n_rot/2)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    half = spec.n_rot // 2
    if spec.rope_type == ROPE_NORM:  # (MROPE / IMROPE rotate NEOX pairs, as ggml does)
        first, second = slice(0, spec.n_rot, 2), slice(1, spec.n_rot, 2)
    else:
        first, second = slice(0, half), slice(half, spec.n_rot)
    a, b = x[..., first], x[..., second]
    # a cos - b sin and a sin + b cos, each product rounded on its own as before, written
    # in place (no copy of the rows when every dimension turns, two temporaries reused):
    # the same float64 values, ~half the passes over a screenshot's keys at every step
    out = np.empty_like(x) if spec.n_rot == spec.head_dim else x.copy()
    t, u = a * cos, b * sin
    np.subtract(t, u, out=out[..., first])
    np.multiply(a, sin, out=t)
    np.multiply(b, cos, out=u)
    np.add(t, u, out=out[..., second])
    return out.reshape(n, width).astype(out_dtype or k.dtype)
