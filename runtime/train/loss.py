"""The training objective: next-token cross-entropy on response rows only.

``loss_fn(params, batch, spec, options)`` runs the forward on every sequence of the batch
(``jax.vmap``), takes ``-log softmax(logits[t])[targets[t]]`` at each row and averages it
over the rows whose ``loss_mask`` is 1 (across the whole batch: every response token weighs
the same, whatever its sequence's length).  Padding rows and prompt rows have mask 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from cachepolicy.forge import TextSpec
from runtime.train.example import Batch
from runtime.train.model import (ForwardOptions, Params, forward, hidden_and_residual,
                                 lookup_layer, project)


def token_losses(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-row cross-entropy ``[..., T]`` of ``logits [..., T, V]`` against ``targets``."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return logz - picked


def loss_fn(params: Params, batch: Batch, spec: TextSpec,
            options: ForwardOptions = ForwardOptions()) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean response-token cross-entropy of ``batch`` and metrics (``loss``, ``accuracy``: the
    share of response tokens that are the argmax, ``n_tokens``).  Differentiable in
    ``params``; ``spec`` and ``options`` must be static under jit."""
    mask = batch.loss_mask
    n = jnp.maximum(mask.sum(), 1.0)
    if batch.query_weight is None:
        logits = jax.vmap(lambda rows: forward(params, spec, rows, options))(batch.rows)
        scaffold = jnp.zeros(())
    else:
        logits, scaffold = _with_scaffold(params, batch, spec, options)
    tokens = (token_losses(logits, batch.targets) * mask).sum() / n
    correct = (jnp.argmax(logits, axis=-1) == batch.targets).astype(jnp.float32)
    return tokens + scaffold, {"loss": tokens, "accuracy": (correct * mask).sum() / n,
                               "n_tokens": mask.sum(), "scaffold": scaffold}


def _with_scaffold(params: Params, batch: Batch, spec: TextSpec,
                   options: ForwardOptions) -> tuple[jax.Array, jax.Array]:
    """Logits, and the query scaffold: ``Σ weight · (1 − cos(residual[query dims], code))``
    over the weighted rows, divided by their count (the residual entering the lookup layer;
    the query dims are the last ``key`` dims of the row, ``cell_vision.RowLayout``)."""
    assert batch.query_codes is not None and batch.query_weight is not None
    layer = lookup_layer(spec)
    width = batch.query_codes.shape[-1]

    def one(rows):
        hidden, residual = hidden_and_residual(params, spec, rows, options, layer)
        return project(params, hidden, options.numerics), residual[:, -width:]

    logits, query = jax.vmap(one)(batch.rows)
    cos = (query * batch.query_codes).sum(-1) / (jnp.linalg.norm(query, axis=-1) + 1e-6)
    w = batch.query_weight
    count = jnp.maximum((w > 0).sum(), 1.0)
    return logits, (w * (1.0 - cos)).sum() / count
