"""Re-rotating cached keys: RoPE composes, R(a) R(b) = R(a + b), so a key cached at position
p moves to p + d by one more rotation R(d) (values do not move: RoPE touches only K).

This is llama.cpp's own K-shift (``llama_kv_cache::build_rope_shift``, what ``seq_add``
triggers at the next decode) done in numpy on rows read out of a state blob, so a cell can be
moved anywhere — also to a position another cell of the sequence holds now, which ``seq_add``
cannot do.  Numerics: angles in float64, the rotation of f16 rows in float64, rounded once to
the cache type; llama.cpp computes angles and rotation in float32 on the same f16 rows.  The
two agree within one f16 step per element (``tests/test_kv_store.py`` measures it).

Supported: NORM (llama: adjacent pairs) and NEOX (halves) rotation of the first ``n_rot``
dimensions of each head, with a linear frequency scale; M-RoPE, YaRN and other scaled
variants are refused (``RopeSpec.problem``): on the Qwen-VL models (qwen2vl, qwen3vl,
qwen3vlmoe) kamera and the token evictors are refused at configuration with that reason, and
relocate because llama.cpp itself refuses to shift their positions (``Engine.shift_problem``).
"""

from __future__ import annotations

import attrs
import numpy as np

ROPE_NORM, ROPE_NEOX = 0, 2  # llama.cpp's LLAMA_ROPE_TYPE_NORM / _NEOX
#: llama.cpp's LLAMA_ROPE_TYPE_MROPE (Qwen2-VL / 2.5-VL) and _IMROPE (Qwen3-VL, Qwen3.5)
ROPE_MROPE, ROPE_IMROPE = 8, 40


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
        if self.scaling not in ("none", "linear", ""):
            return f"rope scaling {self.scaling!r}"
        if self.n_rot % 2 or self.n_rot > self.head_dim or self.head_dim <= 0:
            return f"n_rot {self.n_rot} with head dim {self.head_dim}"
        return None

    def inv_freq(self) -> np.ndarray:
        """Angle per position step of each rotated pair (float64)."""
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        return self.freq_scale * self.freq_base ** (-2.0 * i / self.n_rot)


def rotate(spec: RopeSpec, k: np.ndarray, delta: np.ndarray | int,
           out_dtype: np.dtype | None = None) -> np.ndarray:
    """``k`` (n_cells, n_heads * head_dim) rotated by ``delta`` positions (one per cell, or
    one for all); float64 in, the rows' own type (or ``out_dtype``) out."""
    if (why := spec.problem) is not None:
        raise ValueError(f"cannot re-rotate keys: {why}")
    n, width = k.shape
    if width % spec.head_dim:
        raise ValueError(f"K rows of width {width} are not whole heads of {spec.head_dim}")
    x = np.asarray(k, dtype=np.float64).reshape(n, width // spec.head_dim, spec.head_dim)
    d = np.broadcast_to(np.asarray(delta, dtype=np.float64), (n,))
    theta = d[:, None] * spec.inv_freq()[None, :]  # (n, n_rot/2)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    half = spec.n_rot // 2
    if spec.rope_type == ROPE_NORM:
        a, b = x[..., 0:spec.n_rot:2], x[..., 1:spec.n_rot:2]
        out[..., 0:spec.n_rot:2] = a * cos - b * sin
        out[..., 1:spec.n_rot:2] = a * sin + b * cos
    else:
        a, b = x[..., :half], x[..., half:spec.n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:spec.n_rot] = a * sin + b * cos
    return out.reshape(n, width).astype(out_dtype or k.dtype)
