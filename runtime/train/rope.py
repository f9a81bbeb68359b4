"""Rotary position embeddings as llama.cpp applies them (ggml's CPU ``rope`` op).

Two modes, picked by the architecture (``llama_model_rope_type``):

* ``llama``: NORMAL mode.  One position per row; the head's ``rope_dims`` (= head_dim) values
  rotate in adjacent pairs ``(2i, 2i+1)`` by ``θ_i = p · base^(-2i/rope_dims)``.
* ``qwen35``: IMROPE, interleaved multi-section RoPE (Qwen3-VL).  Four position components
  per row, ``(t, y, x, z)``; only the first ``rope_dims`` (= head_dim / 4) values of a head
  rotate, in NEOX pairs ``(i, i + rope_dims/2)``; pair ``i`` takes its angle from the
  component chosen by its sector ``s = i mod sum(sections)``: y if ``s % 3 == 1`` and
  ``s < 3·sections[1]``, x if ``s % 3 == 2`` and ``s < 3·sections[2]``, t if ``s % 3 == 0``
  and ``s < 3·sections[0]``, else z.  Text rows use ``(p, p, p, 0)``: every pair then turns
  by ``p`` as in 1-D RoPE.

ggml builds ``θ_i`` by multiplying ``θ_0 = p`` by ``base^(-2/rope_dims)`` i times in f32;
``angles`` does the same multiplications in the same order, so the angles (which reach
thousands of radians at long positions) carry the same rounding as llama.cpp's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from cachepolicy.engine.kv_rope import ROPE_IMROPE, sector_components
from cachepolicy.forge import TextSpec


def pair_components(spec: TextSpec) -> np.ndarray:
    """For each rotary pair, the index of the position component it turns by (0 for
    NORMAL mode; 0..3 = t, y, x, z under IMROPE: the engine's sector rule)."""
    n_pairs = spec.rope_dims // 2
    if not spec.is_hybrid:
        return np.zeros(n_pairs, dtype=np.int32)
    return sector_components(ROPE_IMROPE, spec.rope_sections, n_pairs).astype(np.int32)


def n_position_components(spec: TextSpec) -> int:
    """Position values per row: 4 under multi-section RoPE (qwen35), else 1."""
    return 4 if spec.is_hybrid else 1


def angles(positions: jax.Array, spec: TextSpec) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) of every rotary pair's angle, each ``[T, rope_dims/2]`` f32, for integer
    ``positions [T, n_position_components(spec)]``."""
    n_pairs = spec.rope_dims // 2
    # powf(freq_base, -2/n_dims) in f32, as ggml computes theta_scale
    scale = np.float32(np.float32(spec.rope_freq_base) ** np.float32(-2.0 / spec.rope_dims))
    theta = positions.astype(jnp.float32)  # [T, P]
    per_pair = []
    for _ in range(n_pairs):
        per_pair.append(theta)
        theta = theta * scale
    stacked = jnp.stack(per_pair, axis=1)  # [T, n_pairs, P]
    comp = jnp.asarray(pair_components(spec))
    chosen = jnp.take_along_axis(stacked, comp[None, :, None], axis=2)[..., 0]
    return jnp.cos(chosen), jnp.sin(chosen)


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array, spec: TextSpec) -> jax.Array:
    """Rotate ``x [T, heads, head_dim]`` by the per-row angles (``angles``)."""
    c, s = cos[:, None, :], sin[:, None, :]
    if not spec.is_hybrid:  # NORMAL: adjacent pairs over the whole head
        x0, x1 = x[..., 0::2], x[..., 1::2]
        rotated = jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
        return rotated.reshape(x.shape)
    n_rot = spec.rope_dims  # NEOX pairs over the first rope_dims values; the rest pass through
    half = n_rot // 2
    x0, x1, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return jnp.concatenate([x0 * c - x1 * s, x0 * s + x1 * c, rest], axis=-1)
