"""The arithmetic of the forward pass: float32, optionally rounded the way llama.cpp's CPU
backend rounds when the weights are f16.

llama.cpp (ggml's CPU backend) multiplies an f16 weight matrix by activations that it first
converts to f16 (the matmul's ``vec_dot_type``), accumulating in f32; its KV cache stores K
and V as f16, so the attention's K·Q takes Q converted to f16 and the softmax·V product takes
the probabilities converted to f16.  Norms, RoPE, the delta-net's conv and recurrence, gates
and residuals stay f32.  ``Numerics(f16=True)`` rounds exactly those tensors (round to
nearest even, as ggml's converter), so the parity check compares like with like; training
uses plain f32 (``f16=False``) or, to train for the exported f16 model, the rounding with
straight-through gradients (the rounding's derivative is taken as 1).
"""

from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp


@attrs.frozen
class Numerics:
    """How the forward computes (a static argument of every jitted function)."""

    #: round what llama.cpp rounds to f16 (weights, matmul inputs, K, V, Q, probabilities)
    f16: bool = False


def round_f16(x: jax.Array) -> jax.Array:
    """``x`` rounded to the nearest f16 value, kept f32; gradient passes straight through."""
    rounded = x.astype(jnp.float16).astype(jnp.float32)
    return x + jax.lax.stop_gradient(rounded - x)


def maybe_f16(x: jax.Array, numerics: Numerics) -> jax.Array:
    return round_f16(x) if numerics.f16 else x


def matmul(x: jax.Array, w: jax.Array, numerics: Numerics) -> jax.Array:
    """``x @ w.T`` for a weight in numpy order ``(n_out, n_in)`` (GGUF dims ``{n_in, n_out}``),
    as ggml's ``mul_mat(w, x)``: with ``f16`` both operands are rounded to f16 first."""
    x = maybe_f16(x, numerics)
    w = maybe_f16(w, numerics)
    return jnp.einsum("...i,oi->...o", x, w, precision=jax.lax.Precision.HIGHEST)


def rms_norm(x: jax.Array, weight: jax.Array | None, eps: float) -> jax.Array:
    """``x / sqrt(mean(x²) + eps) * weight`` over the last axis (ggml_rms_norm + mul)."""
    y = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


def l2_norm(x: jax.Array, eps: float) -> jax.Array:
    """``x / sqrt(sum(x²) + eps)`` over the last axis: the delta-net's q/k normalisation
    (llama.cpp writes it as ``rms_norm(x, eps / n) / sqrt(n)``, the same function)."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)
