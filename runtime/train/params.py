"""A model's parameters as a pytree: a flat dict from GGUF tensor name to an f32 array.

Keys are exactly the names in the GGUF file (``token_embd.weight``, ``blk.3.ssm_a`` …) and
shapes are the numpy shapes of those tensors (GGUF dims reversed: a matrix ``{n_in, n_out}``
is ``[n_out, n_in]``, applied as ``x @ W.T``).  So loading and exporting are renames-free, and
``text_plans(spec)`` (the forge's tensor list) is the single description of what a model of a
given ``TextSpec`` holds.  An optional ``output.weight [n_vocab, n_embd]`` unties the LM head.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from cachepolicy.forge import TextSpec
from cachepolicy.forge.text_model import OUTPUT, text_plans
from cachepolicy.forge.writer import materialize, normal

Params = dict[str, jax.Array]


def param_shapes(spec: TextSpec, *, untied: bool = False) -> dict[str, tuple[int, ...]]:
    """Name → numpy shape of every parameter of a ``spec`` model, in file order."""
    shapes = {plan.name: tuple(reversed(plan.dims)) for plan in text_plans(spec)}
    if untied:
        shapes[OUTPUT] = (spec.n_vocab, spec.n_embd)
    return shapes


def init_params(spec: TextSpec, seed: int = 0, *, untied: bool = False) -> Params:
    """Parameters drawn as the forge draws them (``materialize``: per-tensor generators keyed
    by ``seed`` and the tensor's name; f16-rounded matrices, f32 vectors), as f32 arrays.

    So ``init_params(text_spec(arch, size), seed)`` equals the weights of
    ``forge(arch, size, seed=seed)``'s model, and the same seed always gives the same pytree.
    """
    out: Params = {}
    for plan in text_plans(spec):
        out[plan.name] = jnp.asarray(materialize(plan, seed), dtype=jnp.float32)
    if untied:  # an independent head, drawn like token_embd but from its own name
        out[OUTPUT] = jnp.asarray(materialize(normal(OUTPUT, spec.n_embd, spec.n_vocab), seed),
                                  dtype=jnp.float32)
    return out


def check_params(spec: TextSpec, params: Mapping[str, jax.Array | np.ndarray]) -> None:
    """Raise ValueError unless ``params`` has exactly the tensors of a ``spec`` model (an
    optional untied head allowed) with the right shapes."""
    expected = param_shapes(spec, untied=OUTPUT in params)
    missing = sorted(set(expected) - set(params))
    unknown = sorted(set(params) - set(expected))
    if missing or unknown:
        raise ValueError(f"parameters missing: {missing[:5]}, unknown: {unknown[:5]}")
    bad = [(n, tuple(params[n].shape), s) for n, s in expected.items()
           if tuple(params[n].shape) != s]
    if bad:
        raise ValueError(f"parameter shapes differ from the spec (name, got, want): {bad[:5]}")


def count_params(params: Mapping[str, jax.Array | np.ndarray]) -> int:
    """Number of scalars in ``params`` (llama.cpp's ``n_params`` for a tied model)."""
    return int(sum(int(np.prod(v.shape)) for v in params.values()))
