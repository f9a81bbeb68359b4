"""The recogniser's *sub-cell read-out*: where in its cell a cell's point is — what lets an
agent click 8 px off a cell's centre (``cell_labels.sub_cell_grid``) on a target too small
or too far off the grid to hold a cell's centre (the classic OK button, 16 px tall).

Per axis, ``units`` GELU units of their own over the merged features and a linear read-out
(``SubReadout``), trained with the recogniser as a term of its loss (``sub_loss``) to say the
cell point's step from the centre: -1, 0 or 1 (``cell_labels.cell_targets``), on the cells
whose point reaches a class (the bare desktop's cells are never looked up).  The projector
writes each axis's value gated by the cell's column (x) or row (y), one dim per column / row
(``cell_vision``), so a lookup that copies several cells of a class keeps each column's
step apart.  The gate needs every unit's pre-activation inside ``±bound`` (measured on the
training cells when exported).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["OFF_CENTRE_WEIGHT", "SubReadout", "export_sub", "init_sub", "sub_loss"]

#: the off-centre cells' weight in the loss (about one labelled cell in ten is off-centre)
OFF_CENTRE_WEIGHT = 4.0
#: the exported bound's margin over the largest pre-activation seen
BOUND_MARGIN = 1.5


@attrs.frozen(eq=False)
class SubReadout:
    """``values = gelu(f @ w0 + b0) @ w2 + b2`` ``[..., 2]`` (x, y steps) over the merged
    features ``f`` (the standardisation folded in); ``w0``'s first ``units`` columns are the
    x units, the rest the y units, and ``w2`` reads each axis from its own."""

    w0: np.ndarray = attrs.field(repr=False)
    b0: np.ndarray = attrs.field(repr=False)
    w2: np.ndarray = attrs.field(repr=False)  # [2 units, 2]
    b2: np.ndarray = attrs.field(repr=False)  # [2]
    bound: float

    @property
    def units(self) -> int:
        return int(self.w0.shape[1]) // 2

    def pre(self, features: np.ndarray) -> np.ndarray:
        return features @ self.w0 + self.b0

    def values(self, features: np.ndarray) -> np.ndarray:
        """[..., 2] for features [..., F] (tanh GELU, as ggml's)."""
        return np.asarray(jax.nn.gelu(jnp.asarray(self.pre(features)))) @ self.w2 + self.b2

    def steps(self, features: np.ndarray) -> np.ndarray:
        """[..., 2] int8: -1, 0 or 1 per axis (a value past ±½)."""
        v = self.values(features)
        return (np.sign(v) * (np.abs(v) > 0.5)).astype(np.int8)


def init_sub(key: jax.Array, features: int, units: int, fan_in: float) -> dict[str, jax.Array]:
    """The read-out's parameters (``ws0`` / ``bs0`` / ``ws2`` / ``bs2``), before training."""
    k0, k1 = jax.random.split(key)
    return {"ws0": jax.random.normal(k0, (features, 2 * units)) * fan_in ** -0.5,
            "bs0": jnp.zeros(2 * units),
            "ws2": jax.random.normal(k1, (2, units)) * units ** -0.5,
            "bs2": jnp.zeros(2)}


def _values(p: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ p["ws0"] + p["bs0"])
    units = p["ws2"].shape[1]
    return jnp.stack([h[..., :units] @ p["ws2"][0], h[..., units:] @ p["ws2"][1]], -1) + p["bs2"]


def sub_loss(p: Mapping[str, jax.Array], x: jax.Array, steps: jax.Array,
             labelled: jax.Array) -> jax.Array:
    """Squared error of each axis's value against the cell point's step, over the cells
    with a class (``labelled``), off-centre axes weighted ``OFF_CENTRE_WEIGHT``. ``x``: the
    standardised features ``[..., F]``; ``steps`` ``[..., 2]``."""
    v = _values(p, x)
    t = steps.astype(jnp.float32)
    w = jnp.where(t != 0, OFF_CENTRE_WEIGHT, 1.0) * labelled[..., None]
    return (w * (v - t) ** 2).sum() / jnp.maximum(w.sum(), 1.0)


def export_sub(p: Mapping[str, np.ndarray], mean: np.ndarray, inv_std: np.ndarray,
               sample: np.ndarray) -> SubReadout:
    """The trained read-out with the standardisation folded into its first layer, its
    bound measured on ``sample`` (raw merged features)."""
    w0 = inv_std[:, None] * p["ws0"]
    b0 = p["bs0"] - (mean * inv_std) @ p["ws0"]
    units = p["ws2"].shape[1]
    w2 = np.zeros((2 * units, 2))
    w2[:units, 0], w2[units:, 1] = p["ws2"][0], p["ws2"][1]
    bound = float(np.abs(sample @ w0 + b0).max()) * BOUND_MARGIN
    return SubReadout(w0.astype(np.float32), b0.astype(np.float32), w2.astype(np.float32),
                      np.asarray(p["bs2"], np.float32), bound)
