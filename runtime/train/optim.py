"""AdamW and the jitted training step.

A small, explicit AdamW (no optax): per parameter first and second moments, bias
correction, decoupled weight decay on matrices only (norm scales, biases, ``ssm_a`` and
other 1-D tensors are not decayed), optional global-norm gradient clipping, and a learning
rate with linear warmup then cosine decay to ``min_lr_ratio`` of the peak.

Determinism: the step has no randomness; the same initial state and the same batches give
the same parameters (XLA on CPU reduces in a fixed order for fixed shapes).  Initial
weights come from a seed (``params.init_params``) or a GGUF (``gguf_io.load_gguf``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import attrs
import jax
import jax.numpy as jnp

from cachepolicy.forge import TextSpec
from runtime.train.example import Batch
from runtime.train.loss import loss_fn
from runtime.train.model import ForwardOptions, Params


@attrs.frozen
class AdamW:
    """Optimizer hyper-parameters (hashable: a static argument)."""

    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0
    #: cosine decay over this many steps after warmup (None: constant after warmup)
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1
    #: clip the global gradient norm to this (None: no clipping)
    clip_norm: float | None = 1.0

    def lr_at(self, step: jax.Array) -> jax.Array:
        """The learning rate of update number ``step`` (0-based)."""
        step = step.astype(jnp.float32)
        warm = jnp.minimum(1.0, (step + 1) / max(1, self.warmup_steps))
        if self.decay_steps is None:
            return self.learning_rate * warm
        frac = jnp.clip((step - self.warmup_steps) / self.decay_steps, 0.0, 1.0)
        cosine = self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + jnp.cos(jnp.pi * frac))
        return self.learning_rate * warm * cosine


class TrainState(NamedTuple):
    """Everything a step changes (a pytree: checkpoint it with ``jax.device_get``)."""

    step: jax.Array  # int32 scalar: updates done
    params: Params
    mu: Params  # first moments
    nu: Params  # second moments


def init_state(params: Params) -> TrainState:
    """Step 0 with zero moments.  The parameters are copied: the step donates the state's
    buffers, and the caller's ``params`` must stay usable."""
    return TrainState(step=jnp.zeros((), jnp.int32),
                      params={k: jnp.array(v, dtype=jnp.float32, copy=True)
                              for k, v in params.items()},
                      mu=jax.tree.map(jnp.zeros_like, dict(params)),
                      nu=jax.tree.map(jnp.zeros_like, dict(params)))


def apply_updates(state: TrainState, grads: Params, opt: AdamW) -> tuple[TrainState, jax.Array]:
    """One AdamW update; returns the new state and the gradient's global norm (pre-clip)."""
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    if opt.clip_norm is not None:
        scale = jnp.minimum(1.0, opt.clip_norm / (norm + 1e-12))
        grads = jax.tree.map(lambda g: g * scale, grads)
    step = state.step + 1
    lr = opt.lr_at(state.step)
    mu = jax.tree.map(lambda m, g: opt.b1 * m + (1 - opt.b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: opt.b2 * v + (1 - opt.b2) * g * g, state.nu, grads)
    c1 = 1 - opt.b1 ** step.astype(jnp.float32)
    c2 = 1 - opt.b2 ** step.astype(jnp.float32)

    def update(p: jax.Array, m: jax.Array, v: jax.Array) -> jax.Array:
        delta = (m / c1) / (jnp.sqrt(v / c2) + opt.eps)
        if p.ndim >= 2:  # decoupled decay on matrices only
            delta = delta + opt.weight_decay * p
        return p - lr * delta

    params = {k: update(state.params[k], mu[k], nu[k]) for k in state.params}
    return TrainState(step=step, params=params, mu=mu, nu=nu), norm


StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]


def make_train_step(spec: TextSpec, opt: AdamW = AdamW(),
                    options: ForwardOptions = ForwardOptions()) -> StepFn:
    """A jitted ``step(state, batch) -> (state, metrics)``: loss and gradients of
    ``loss.loss_fn`` on ``batch``, then one AdamW update.  Metrics: ``loss``, ``accuracy``,
    ``n_tokens`` (before the update), ``grad_norm``, ``lr``.  The input state's buffers are
    donated (do not reuse it after the call).  One compilation per batch shape (bucket)."""

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch, spec, options)
        lr = opt.lr_at(state.step)
        new_state, norm = apply_updates(state, grads, opt)
        return new_state, {**metrics, "grad_norm": norm, "lr": lr}

    return step


def make_eval_step(spec: TextSpec, options: ForwardOptions = ForwardOptions(),
                   ) -> Callable[[Params, Batch], dict[str, jax.Array]]:
    """A jitted ``eval(params, batch) -> metrics`` (the loss without an update)."""

    @jax.jit
    def evaluate(params: Params, batch: Batch) -> dict[str, jax.Array]:
        return loss_fn(params, batch, spec, options)[1]

    return evaluate
