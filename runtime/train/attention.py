"""Full (softmax) attention blocks: llama's, and qwen35's gated one.

Which keys a row sees is decided by positions, as llama.cpp's KV-cache mask decides it (not
by row order): key j is visible to query i iff ``t_j < t_i``, or ``t_j == t_i`` and — under
multi-section RoPE only — key j is not after query i in raster order of its 2-D position
(``y_j > y_i``, or ``y_j == y_i`` and ``x_j > x_i``, hides it).  So an image's rows, which
all share the image's start position t, attend causally in raster order, and text rows
attend causally.  Padding rows (``valid`` False) are never visible.

Scores are ``softmax(q·k · head_dim^-1/2)``; grouped-query attention maps query head h to
KV head ``h // (n_head / n_head_kv)`` (ggml's mul_mat broadcast).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cachepolicy.forge import TextSpec
from runtime.train import rope
from runtime.train.numerics import Numerics, matmul, maybe_f16, rms_norm

# A finite "minus infinity": a fully masked row (all padding) then gives uniform weights
# instead of NaN, and a visible key's weight is unchanged (exp underflows to exactly 0).
_MASKED = -1e30

Params = dict[str, jax.Array]


def visibility(positions: jax.Array, valid: jax.Array) -> jax.Array:
    """``[T_query, T_key]`` bool: which keys each row attends to (see the module docstring)."""
    t = positions[:, 0]
    seen = t[None, :] <= t[:, None]
    if positions.shape[1] >= 3:  # multi-section RoPE: 2-D causal order among equal t
        y, x = positions[:, 1], positions[:, 2]
        same_y = y[None, :] == y[:, None]
        later_2d = (y[None, :] > y[:, None]) | (same_y & (x[None, :] > x[:, None]))
        seen = (t[None, :] < t[:, None]) | ((t[None, :] == t[:, None]) & ~later_2d)
    return seen & valid[None, :]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array,
           numerics: Numerics) -> jax.Array:
    """Softmax attention of ``q [T, H, d]`` over ``k, v [T, H_kv, d]``; returns ``[T, H·d]``.

    With ``numerics.f16`` K and V are rounded as llama.cpp's f16 KV cache stores them, Q as
    its K·Q matmul converts it, and the probabilities as the V matmul converts them."""
    n_tok, n_head, d = q.shape
    group = n_head // k.shape[1]
    k = jnp.repeat(maybe_f16(k, numerics), group, axis=1)
    v = jnp.repeat(maybe_f16(v, numerics), group, axis=1)
    q = maybe_f16(q, numerics)
    hp = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("qhd,khd->hqk", q, k, precision=hp) * (1.0 / d ** 0.5)
    scores = jnp.where(visible[None], scores, _MASKED)
    probs = maybe_f16(jax.nn.softmax(scores, axis=-1), numerics)
    out = jnp.einsum("hqk,khd->qhd", probs, v, precision=hp)
    return out.reshape(n_tok, n_head * d)


def llama_attention(p: Params, prefix: str, x: jax.Array, cos: jax.Array, sin: jax.Array,
                    visible: jax.Array, spec: TextSpec, numerics: Numerics) -> jax.Array:
    """llama's self-attention on the normed input ``x [T, E]`` (no biases); returns [T, E]."""
    n_tok, hd = x.shape[0], spec.head_dim
    q = matmul(x, p[f"{prefix}.attn_q.weight"], numerics).reshape(n_tok, spec.n_head, hd)
    k = matmul(x, p[f"{prefix}.attn_k.weight"], numerics).reshape(n_tok, spec.n_head_kv, hd)
    v = matmul(x, p[f"{prefix}.attn_v.weight"], numerics).reshape(n_tok, spec.n_head_kv, hd)
    q, k = rope.apply(q, cos, sin, spec), rope.apply(k, cos, sin, spec)
    out = attend(q, k, v, visible, numerics)
    return matmul(out, p[f"{prefix}.attn_output.weight"], numerics)


def gated_attention(p: Params, prefix: str, x: jax.Array, cos: jax.Array, sin: jax.Array,
                    visible: jax.Array, spec: TextSpec, numerics: Numerics) -> jax.Array:
    """qwen35's full-attention block on the normed input ``x [T, E]``; returns [T, E].

    ``attn_q`` yields, per head, the query followed by an output gate (``[q_h | g_h]``, each
    head_dim wide); q and k get their own RMS norms before the (partial, multi-section)
    RoPE; the attention output is multiplied by ``sigmoid(gate)`` before ``attn_output``.
    """
    n_tok, hd, eps = x.shape[0], spec.head_dim, spec.rms_eps
    qg = matmul(x, p[f"{prefix}.attn_q.weight"], numerics).reshape(n_tok, spec.n_head, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    k = matmul(x, p[f"{prefix}.attn_k.weight"], numerics).reshape(n_tok, spec.n_head_kv, hd)
    v = matmul(x, p[f"{prefix}.attn_v.weight"], numerics).reshape(n_tok, spec.n_head_kv, hd)
    q = rms_norm(q, p[f"{prefix}.attn_q_norm.weight"], eps)
    k = rms_norm(k, p[f"{prefix}.attn_k_norm.weight"], eps)
    q, k = rope.apply(q, cos, sin, spec), rope.apply(k, cos, sin, spec)
    out = attend(q, k, v, visible, numerics) * jax.nn.sigmoid(gate.reshape(n_tok, -1))
    return matmul(out, p[f"{prefix}.attn_output.weight"], numerics)
