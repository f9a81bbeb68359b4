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
from runtime.train.model import ForwardOptions, Params, forward


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
    logits = jax.vmap(lambda rows: forward(params, spec, rows, options))(batch.rows)
    mask = batch.loss_mask
    n = jnp.maximum(mask.sum(), 1.0)
    loss = (token_losses(logits, batch.targets) * mask).sum() / n
    correct = (jnp.argmax(logits, axis=-1) == batch.targets).astype(jnp.float32)
    return loss, {"loss": loss, "accuracy": (correct * mask).sum() / n, "n_tokens": mask.sum()}
