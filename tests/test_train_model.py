"""The JAX forward's own invariants: the chunked delta rule is the per-row recurrence (values
and gradients), padding never reaches a real row, and the forward is jit-able and
differentiable on fixed shapes."""

from __future__ import annotations

import functools

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cachepolicy.forge import text_spec
from runtime.train import ForwardOptions, Rows, forward, init_params
from runtime.train.delta_net import delta_rule_chunked, delta_rule_scan
from runtime.train.model import jit_forward


def random_rows(spec, n: int, n_valid: int | None = None, seed: int = 0) -> Rows:
    """Text rows around a 3x4 grid of embedding rows, at positions as build_example lays them
    out (M-RoPE: the image's rows share t = its start, y/x = start + grid row/col, and the
    text after it continues at start + 4)."""
    rng = np.random.default_rng(seed)
    n_valid = n if n_valid is None else n_valid
    tokens = rng.integers(0, spec.n_vocab, n).astype(np.int32)
    first = n // 4
    is_embed = (np.arange(n) >= first) & (np.arange(n) < first + 12)
    embeds = (rng.standard_normal((n, spec.n_embd)) * 0.05).astype(np.float32)
    positions = np.zeros((n, 4 if spec.is_hybrid else 1), dtype=np.int32)
    pos = 0
    for i in range(n):
        if is_embed[i] and spec.is_hybrid:
            row, col = divmod(i - first, 4)
            positions[i] = (first, first + row, first + col, 0)
            pos = first + 4
        elif spec.is_hybrid:
            positions[i] = (pos, pos, pos, 0)
            pos += 1
        else:
            positions[i] = i
    valid = np.arange(n) < n_valid
    return Rows(*(jnp.asarray(a) for a in (tokens, embeds, is_embed, positions, valid)))


def test_chunked_delta_rule_equals_the_scan_values_and_gradients() -> None:
    rng = np.random.default_rng(1)
    t, h, d = 45, 4, 16  # 45 rows: chunks of 16 with a padded tail

    def unit(a: np.ndarray) -> jax.Array:
        return jnp.asarray(a / np.linalg.norm(a, axis=-1, keepdims=True), dtype=jnp.float32)

    q = unit(rng.standard_normal((t, h, d)))
    k = unit(rng.standard_normal((t, h, d)))
    v = jnp.asarray(rng.standard_normal((t, h, d)), dtype=jnp.float32)
    g = jnp.asarray(-rng.uniform(0.0, 3.0, (t, h)), dtype=jnp.float32)
    beta = jnp.asarray(rng.uniform(0.0, 1.0, (t, h)), dtype=jnp.float32)
    chunked = functools.partial(delta_rule_chunked, chunk=16)
    ref = jax.jit(delta_rule_scan)(q, k, v, g, beta)
    got = jax.jit(chunked)(q, k, v, g, beta)
    assert float(jnp.abs(ref - got).max()) < 1e-5
    weights = jnp.asarray(rng.standard_normal((t, h, d)), dtype=jnp.float32)

    def grads(fn):  # noqa: ANN001, ANN202
        return jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * weights), argnums=(0, 1, 2, 3, 4)))

    grads_ref = grads(delta_rule_scan)(q, k, v, g, beta)
    grads_got = grads(chunked)(q, k, v, g, beta)
    for a, b in zip(grads_ref, grads_got):
        scale = float(jnp.abs(a).max())
        assert float(jnp.abs(a - b).max()) < 1e-4 * max(1.0, scale)


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_padding_rows_never_change_real_rows(arch: str) -> None:
    spec = text_spec(arch, "tiny")
    params = init_params(spec, seed=3)
    n_real = 50
    rows = random_rows(spec, 80, n_valid=n_real)
    real = jax.tree.map(lambda a: a[:n_real], rows)
    full = jit_forward(params, spec, rows)[:n_real]
    alone = jit_forward(params, spec, real)
    assert float(jnp.abs(full - alone).max()) < 1e-5
    # and whatever the padding holds
    noisy = rows._replace(tokens=rows.tokens.at[n_real:].set(7),
                          embeds=rows.embeds.at[n_real:].set(3.0))
    assert float(jnp.abs(jit_forward(params, spec, noisy)[:n_real] - alone).max()) < 1e-5


def test_forward_jits_vmaps_and_differentiates() -> None:
    spec = attrs.evolve(text_spec("qwen35", "tiny"), n_layer=2)  # one recurrent, one attention
    params = init_params(spec, seed=0)
    rows = jax.tree.map(lambda *a: jnp.stack(a), random_rows(spec, 40, seed=1),
                        random_rows(spec, 40, n_valid=30, seed=2))
    options = ForwardOptions(remat=True)

    def loss(p):  # noqa: ANN001, ANN202
        out = jax.vmap(lambda r: forward(p, spec, r, options))(rows)
        return jnp.mean(jax.nn.logsumexp(out, axis=-1)), out

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    assert logits.shape == (2, 40, spec.n_vocab) and bool(jnp.isfinite(logits).all())
    assert set(grads) == set(params)
    assert all(bool(jnp.isfinite(g).all()) for g in grads.values())
    # every parameter the forward reads gets a gradient (the recurrent ones included)
    assert float(jnp.abs(grads["blk.0.ssm_a"]).max()) > 0
    assert float(jnp.abs(grads["blk.0.ssm_conv1d.weight"]).max()) > 0
    assert float(jnp.abs(grads["blk.1.attn_q_norm.weight"]).max()) > 0
    assert spec.recurrent_layers == (0,) and spec.attention_layers == (1,)
