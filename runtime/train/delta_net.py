"""qwen35's recurrent block: the Gated DeltaNet, as llama.cpp computes it from a fresh state.

On the normed input ``x [T, E]`` (names as in the GGUF; nk key heads, nv value heads, head
size ds for both, conv = 2·nk·ds + nv·ds channels):

1. ``attn_qkv`` → ``[T, conv]``, then a causal depthwise conv1d of kernel 4 over time
   (``ssm_conv1d``, taps oldest first; the state before the first row is zero, as for a new
   sequence) and SiLU.  Channels split as ``[q (nk·ds) | k (nk·ds) | v (nv·ds)]``.
2. q and k are L2-normalised per head (``x / sqrt(Σx² + eps)``); value head h uses key/query
   head ``h mod nk`` (ggml tiles the key heads, it does not repeat each one).
3. ``beta = sigmoid(ssm_beta·x)``; the decay gate ``g = softplus(ssm_alpha·x + ssm_dt.bias) ·
   ssm_a`` (``ssm_a`` holds ``-exp(A_log)``, negative, so ``g ≤ 0``).
4. Per value head, a state ``S [ds_k, ds_v]`` from zero: ``S ← e^g S``; ``δ = β (v − Sᵀk)``;
   ``S ← S + k δᵀ``; output ``o = Sᵀq / sqrt(ds)``.
5. ``rms_norm(o) · ssm_norm · silu(attn_gate·x)`` per head, then ``ssm_out``.

Step 4 has two implementations that compute the same function: ``scan`` (one step per row,
the reference) and ``chunked`` (the WY form over chunks of rows: the rows of a chunk in
parallel with matmuls and one triangular solve, the state carried across chunks by a scan of
``T / chunk`` steps), which is what training uses.  Rows after the real ones (padding) never
influence earlier rows: the recurrence only runs forward.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from cachepolicy.forge import TextSpec
from runtime.train.numerics import Numerics, l2_norm, matmul, rms_norm

Recurrence = Literal["chunked", "scan"]
Params = dict[str, jax.Array]


def causal_conv(x: jax.Array, weight: jax.Array) -> jax.Array:
    """Depthwise causal conv over rows: ``out[t, c] = Σ_j w[c, j] · x[t - K + 1 + j, c]``
    (rows before the first are zero), ``weight`` in numpy order ``[channels, K]``."""
    kernel = weight.shape[1]
    padded = jnp.pad(x, ((kernel - 1, 0), (0, 0)))
    n = x.shape[0]
    out = padded[0:n] * weight[:, 0]
    for j in range(1, kernel):  # ggml sums the taps oldest first
        out = out + padded[j:j + n] * weight[:, j]
    return out


def delta_rule_scan(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
                    beta: jax.Array) -> jax.Array:
    """Reference recurrence, one row per step.  ``q, k, v [T, H, d]`` (q, k normalised),
    ``g, beta [T, H]``; returns ``o [T, H, d]`` (already scaled by ``d^-1/2``)."""
    n_head, d = v.shape[1], v.shape[2]
    hp = jax.lax.Precision.HIGHEST

    def step(state: jax.Array, row: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        q_t, k_t, v_t, g_t, b_t = row
        state = state * jnp.exp(g_t)[:, None, None]
        delta = (v_t - jnp.einsum("hkv,hk->hv", state, k_t, precision=hp)) * b_t[:, None]
        state = state + k_t[:, :, None] * delta[:, None, :]
        return state, jnp.einsum("hkv,hk->hv", state, q_t, precision=hp)

    init = jnp.zeros((n_head, d, d), dtype=jnp.float32)
    _, out = jax.lax.scan(step, init, (q, k, v, g, beta))
    return out * (1.0 / d ** 0.5)


@jax.custom_vjp
def unit_lower_inverse(a: jax.Array) -> jax.Array:
    """``X = (I + a)^-1`` for strictly lower-triangular ``a [..., C, C]``.

    Forward substitution, one row per step of a ``fori_loop`` (row t of X is ``e_t − a[t] X``:
    ``a[t]`` is zero from column t on, so only finished rows contribute); the gradient is
    ``−Xᵀ dX Xᵀ`` on the strict lower triangle (``a``'s support).  Not ``solve_triangular``:
    XLA's CPU version is a LAPACK custom call that is ~500x slower per element above 32x32
    and, under load, was seen to leave a step waiting forever; a matmul-only block inversion
    compiled 4x slower than this.
    """
    return _substitute(a)


def _substitute(a: jax.Array) -> jax.Array:
    c = a.shape[-1]
    row_axis = a.ndim - 2
    eye = jnp.eye(c, dtype=a.dtype)

    def body(t: jax.Array, x: jax.Array) -> jax.Array:
        a_t = jax.lax.dynamic_index_in_dim(a, t, axis=row_axis, keepdims=False)
        row = eye[t] - jnp.einsum("...j,...jk->...k", a_t, x, precision=jax.lax.Precision.HIGHEST)
        return jax.lax.dynamic_update_index_in_dim(x, row, t, axis=row_axis)

    return jax.lax.fori_loop(1, c, body, jnp.broadcast_to(eye, a.shape))


def _inverse_fwd(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    x = _substitute(a)
    return x, x


def _inverse_bwd(x: jax.Array, dx: jax.Array) -> tuple[jax.Array]:
    da = -jnp.einsum("...ji,...jk,...lk->...il", x, dx, x, precision=jax.lax.Precision.HIGHEST)
    return (jnp.tril(da, -1),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def delta_rule_chunked(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
                       beta: jax.Array, chunk: int = 64) -> jax.Array:
    """The same recurrence as ``delta_rule_scan``, chunk by chunk.

    Within a chunk with cumulative gates ``G`` and start state ``S0`` the updates ``Δ`` (rows
    of δ) solve ``(I + A) Δ = β ⊙ (V − e^G ⊙ K S0)`` with
    ``A[t,i] = β_t e^(G_t−G_i) k_t·k_i`` for ``i < t``; then
    ``O = e^G ⊙ (Q S0) + (D ⊙ Q Kᵀ) Δ`` with ``D[t,i] = e^(G_t−G_i)`` (``i ≤ t``) and
    ``S_end = e^(G_last) S0 + Kᵀ (e^(G_last−G) ⊙ Δ)``.
    """
    n_tok, n_head, d = v.shape
    pad = (-n_tok) % chunk
    n_chunks = (n_tok + pad) // chunk
    hp = jax.lax.Precision.HIGHEST

    def split(a: jax.Array) -> jax.Array:  # [T, H, ...] -> [chunks, H, C, ...]
        a = jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1))  # zero rows: no update
        a = a.reshape((n_chunks, chunk) + a.shape[1:])
        return jnp.moveaxis(a, 2, 1) if a.ndim == 4 else jnp.swapaxes(a, 1, 2)

    qc, kc, vc, gc, bc = split(q), split(k), split(v), split(g), split(beta)
    cum = jnp.cumsum(gc, axis=-1)  # G, [n, H, C]
    rows = jnp.arange(chunk)
    lower_incl = rows[:, None] >= rows[None, :]
    # exponent masked BEFORE exp: G_t - G_i > 0 for i > t could overflow
    diff = jnp.where(lower_incl, cum[..., :, None] - cum[..., None, :], -jnp.inf)
    decay = jnp.exp(diff)  # D, zero above the diagonal
    kk = jnp.einsum("nhtd,nhid->nhti", kc, kc, precision=hp)
    strict = rows[:, None] > rows[None, :]
    a = jnp.where(strict, bc[..., :, None] * decay * kk, 0.0)
    inv = unit_lower_inverse(a)
    exp_cum = jnp.exp(cum)
    w = jnp.einsum("nhti,nhid->nhtd", inv, (bc * exp_cum)[..., None] * kc, precision=hp)
    u = jnp.einsum("nhti,nhid->nhtd", inv, bc[..., None] * vc, precision=hp)
    qk = decay * jnp.einsum("nhtd,nhid->nhti", qc, kc, precision=hp)
    last = cum[..., -1]  # [n, H]
    k_to_end = jnp.exp(last[..., None] - cum)[..., None] * kc  # e^(G_last - G_i) k_i

    def step(state: jax.Array, c: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
        w_c, u_c, q_c, qk_c, ec_c, last_c, kend_c = c
        delta = u_c - jnp.einsum("htk,hkv->htv", w_c, state, precision=hp)
        out = (ec_c[..., None] * jnp.einsum("htk,hkv->htv", q_c, state, precision=hp)
               + jnp.einsum("hti,hiv->htv", qk_c, delta, precision=hp))
        state = (jnp.exp(last_c)[:, None, None] * state
                 + jnp.einsum("htk,htv->hkv", kend_c, delta, precision=hp))
        return state, out

    init = jnp.zeros((n_head, d, d), dtype=jnp.float32)
    _, out = jax.lax.scan(step, init, (w, u, qc, qk, exp_cum, last, k_to_end))
    out = jnp.moveaxis(out, 2, 1).reshape(n_chunks * chunk, n_head, d)[:n_tok]
    return out * (1.0 / d ** 0.5)


def delta_net(p: Params, prefix: str, x: jax.Array, spec: TextSpec, numerics: Numerics,
              recurrence: Recurrence = "chunked", chunk: int = 64) -> jax.Array:
    """The recurrent block on the normed input ``x [T, E]``; returns ``[T, E]``."""
    n_tok = x.shape[0]
    nk, nv, ds, eps = spec.ssm_groups, spec.ssm_v_heads, spec.ssm_state, spec.rms_eps
    qkv = matmul(x, p[f"{prefix}.attn_qkv.weight"], numerics)
    z = matmul(x, p[f"{prefix}.attn_gate.weight"], numerics)
    beta = jax.nn.sigmoid(matmul(x, p[f"{prefix}.ssm_beta.weight"], numerics))
    alpha = matmul(x, p[f"{prefix}.ssm_alpha.weight"], numerics) + p[f"{prefix}.ssm_dt.bias"]
    g = jax.nn.softplus(alpha) * p[f"{prefix}.ssm_a"]
    conv = jax.nn.silu(causal_conv(qkv, p[f"{prefix}.ssm_conv1d.weight"]))
    q = l2_norm(conv[:, : nk * ds].reshape(n_tok, nk, ds), eps)
    k = l2_norm(conv[:, nk * ds: 2 * nk * ds].reshape(n_tok, nk, ds), eps)
    v = conv[:, 2 * nk * ds:].reshape(n_tok, nv, ds)
    q, k = jnp.tile(q, (1, nv // nk, 1)), jnp.tile(k, (1, nv // nk, 1))  # head h -> h mod nk
    if recurrence == "scan":
        o = delta_rule_scan(q, k, v, g, beta)
    else:
        o = delta_rule_chunked(q, k, v, g, beta, chunk)
    gated = rms_norm(o, p[f"{prefix}.ssm_norm.weight"], eps) * jax.nn.silu(z.reshape(n_tok, nv, ds))
    return matmul(gated.reshape(n_tok, nv * ds), p[f"{prefix}.ssm_out.weight"], numerics)
