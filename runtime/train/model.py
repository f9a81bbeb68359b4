"""The forward pass of the two text architectures the forge writes: ``llama`` and ``qwen35``.

``forward(params, spec, rows)`` computes what llama.cpp computes for the same rows fed to a
new sequence (``runtime.train.parity`` checks it against the real engine):

* input: ``token_embd[token]`` for text rows, the given vector for embedding rows (image
  rows: the vision projector's output, fed as llama.cpp's ``batch.embd``), no scaling;
* per block: ``h += mixer(rms_norm(h) · attn_norm)``, then
  ``h += down(silu(gate(n)) · up(n))`` with ``n = rms_norm(h) · ffn_norm`` (qwen35 calls
  that norm ``post_attention_norm``); the mixer is attention (``llama``; qwen35's layers with
  ``(i + 1) % full_attention_interval == 0``) or the Gated DeltaNet (qwen35's other layers);
* output: ``rms_norm(h) · output_norm`` times ``output.weight``, or ``token_embd`` when the
  model has no ``output.weight`` (tied, as llama.cpp duplicates it).

Everything is f32 (see ``numerics`` for the optional f16 rounding), jit-able with static
``spec`` and ``options``, differentiable in ``params``, and works on fixed (padded) shapes:
rows are a prefix of real rows followed by padding (``valid`` False), and padding influences
no real row.  One sequence per call; ``jax.vmap`` it for a batch (``loss.loss_fn`` does).
"""

from __future__ import annotations

from typing import NamedTuple

import attrs
import jax
import jax.numpy as jnp

from cachepolicy.forge import TextSpec
from runtime.train import attention, rope
from runtime.train.delta_net import Recurrence, delta_net
from runtime.train.numerics import Numerics, matmul, rms_norm

Params = dict[str, jax.Array]

#: The untied LM head; absent means tied to token_embd.
OUTPUT = "output.weight"


class Rows(NamedTuple):
    """One sequence of input rows (a pytree of arrays; leading batch axis when batched).

    ``tokens [T]`` int32: the token id of a text row (ignored on embedding rows);
    ``embeds [T, n_embd]`` f32: the input vector of an embedding row (ignored on text rows);
    ``is_embed [T]`` bool; ``positions [T, P]`` int32 with P = 1 (llama) or 4 (qwen35:
    t, y, x, z); ``valid [T]`` bool, True for a prefix of real rows.
    """

    tokens: jax.Array
    embeds: jax.Array
    is_embed: jax.Array
    positions: jax.Array
    valid: jax.Array


@attrs.frozen
class ForwardOptions:
    """Static choices of the forward (hashable: a jit static argument)."""

    numerics: Numerics = Numerics()
    #: the delta-net recurrence: "chunked" (fast, training) or "scan" (row by row, reference)
    recurrence: Recurrence = "chunked"
    chunk: int = 64
    #: recompute each block's activations in the backward pass (less memory, ~30% more time)
    remat: bool = False


def _ffn(p: Params, prefix: str, x: jax.Array, numerics: Numerics) -> jax.Array:
    gate = matmul(x, p[f"{prefix}.ffn_gate.weight"], numerics)
    up = matmul(x, p[f"{prefix}.ffn_up.weight"], numerics)
    return matmul(jax.nn.silu(gate) * up, p[f"{prefix}.ffn_down.weight"], numerics)


def _block(p: Params, il: int, h: jax.Array, cos: jax.Array, sin: jax.Array,
           visible: jax.Array, spec: TextSpec, options: ForwardOptions) -> jax.Array:
    prefix, num, eps = f"blk.{il}", options.numerics, spec.rms_eps
    x = rms_norm(h, p[f"{prefix}.attn_norm.weight"], eps)
    if not spec.is_hybrid:
        h = h + attention.llama_attention(p, prefix, x, cos, sin, visible, spec, num)
    elif spec.is_attention(il):
        h = h + attention.gated_attention(p, prefix, x, cos, sin, visible, spec, num)
    else:
        h = h + delta_net(p, prefix, x, spec, num, options.recurrence, options.chunk)
    norm = "post_attention_norm" if spec.is_hybrid else "ffn_norm"
    return h + _ffn(p, prefix, rms_norm(h, p[f"{prefix}.{norm}.weight"], eps), num)


def hidden_states(params: Params, spec: TextSpec, rows: Rows,
                  options: ForwardOptions = ForwardOptions()) -> jax.Array:
    """The output-normed hidden state of every row, ``[T, n_embd]``."""
    return hidden_and_residual(params, spec, rows, options, 0)[0]


def hidden_and_residual(params: Params, spec: TextSpec, rows: Rows,
                        options: ForwardOptions, layer: int) -> tuple[jax.Array, jax.Array]:
    """``hidden_states`` and the residual stream entering block ``layer`` (``[T, n_embd]``
    each): what a training loss on an intermediate layer reads."""
    check_spec(spec)
    h = jnp.where(rows.is_embed[:, None], rows.embeds.astype(jnp.float32),
                  params["token_embd.weight"][rows.tokens])
    cos, sin = rope.angles(rows.positions, spec)
    visible = attention.visibility(rows.positions, rows.valid)
    residual = h
    for il in range(spec.n_layer):
        if il == layer:
            residual = h
        block = jax.checkpoint(_block, static_argnums=(1, 6, 7)) if options.remat else _block
        h = block(params, il, h, cos, sin, visible, spec, options)
    return rms_norm(h, params["output_norm.weight"], spec.rms_eps), residual


def project(params: Params, hidden: jax.Array, numerics: Numerics = Numerics()) -> jax.Array:
    """Logits ``[..., n_vocab]`` of output-normed hidden states (the LM head)."""
    head = params.get(OUTPUT, params["token_embd.weight"])
    return matmul(hidden, head, numerics)


def forward(params: Params, spec: TextSpec, rows: Rows,
            options: ForwardOptions = ForwardOptions(),
            select: jax.Array | None = None) -> jax.Array:
    """Logits of every row, ``[T, n_vocab]``, or of the rows ``select [K]`` picks, ``[K, ...]``
    (the LM head is the largest matmul: a trainer that needs few rows saves it)."""
    hidden = hidden_states(params, spec, rows, options)
    if select is not None:
        hidden = hidden[select]
    return project(params, hidden, options.numerics)


#: ``forward`` compiled per (spec, options, shapes): what the parity check and tests call
jit_forward = jax.jit(forward, static_argnames=("spec", "options"))


def lookup_layer(spec: TextSpec) -> int:
    """The layer whose attention looks cells up (``grounding``): the last attention layer."""
    return max(i for i in range(spec.n_layer) if spec.is_attention(i))


def check_spec(spec: TextSpec) -> None:
    """Raise ValueError for what this forward does not implement (qwen35moe's experts)."""
    if spec.arch not in ("llama", "qwen35"):
        raise ValueError(f"no JAX forward for arch {spec.arch!r} (llama and qwen35 only)")
    if spec.is_moe:
        raise ValueError("mixture-of-experts models are not supported by the trainer")
