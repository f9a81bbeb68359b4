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
from collections.abc import Callable, Mapping
from typing import NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np

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


def apply_updates(state: TrainState, grads: Params, opt: AdamW,
                  frozen: Mapping[str, jax.Array] | None = None) -> tuple[TrainState, jax.Array]:
    """One AdamW update; returns the new state and the gradient's global norm (pre-clip).
    ``frozen``: per parameter, a mask of the entries kept exactly as they are (1.0): their
    gradient is dropped before the norm and their update (weight decay included) is zero."""
    if frozen:
        grads = {k: g * (1.0 - frozen[k]) if k in frozen else g for k, g in grads.items()}
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
    if frozen:  # exactly the old value, not p - lr * 0 * delta (weight decay rounds)
        params = {k: jnp.where(frozen[k] > 0, state.params[k], v) if k in frozen else v
                  for k, v in params.items()}
    return TrainState(step=step, params=params, mu=mu, nu=nu), norm


StepFn = Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]


def make_train_step(spec: TextSpec, opt: AdamW = AdamW(),
                    options: ForwardOptions = ForwardOptions(),
                    frozen: Mapping[str, np.ndarray] | None = None) -> StepFn:
    """A jitted ``step(state, batch) -> (state, metrics)``: loss and gradients of
    ``loss.loss_fn`` on ``batch``, then one AdamW update (``frozen``: masks of entries kept
    fixed, ``apply_updates``; only the parameters with a nonzero mask need one).  Metrics: ``loss``, ``accuracy``,
    ``n_tokens`` (before the update), ``grad_norm``, ``lr``.  The input state's buffers are
    donated (do not reuse it after the call).  One compilation per batch shape (bucket)."""

    masks = None if not frozen else {k: jnp.asarray(m, jnp.float32)
                                      for k, m in frozen.items() if np.any(m)}

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, batch, spec, options)
        lr = opt.lr_at(state.step)
        new_state, norm = apply_updates(state, grads, opt, masks)
        return new_state, {**metrics, "grad_norm": norm, "lr": lr}

    return step


def make_eval_step(spec: TextSpec, options: ForwardOptions = ForwardOptions(),
                   ) -> Callable[[Params, Batch], dict[str, jax.Array]]:
    """A jitted ``eval(params, batch) -> metrics`` (the loss without an update)."""

    @jax.jit
    def evaluate(params: Params, batch: Batch) -> dict[str, jax.Array]:
        return loss_fn(params, batch, spec, options)[1]

    return evaluate


def merge_masks(*masks: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The union of frozen masks (elementwise maximum)."""
    out: dict[str, np.ndarray] = {}
    for m in masks:
        for name, a in m.items():
            out[name] = np.maximum(out[name], a) if name in out else np.array(a, np.float32)
    return out
