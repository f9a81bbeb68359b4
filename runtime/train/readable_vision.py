"""A frozen vision projector made to be read: designed weights instead of random ones.

The trained agents keep the vision tower frozen (the trainer never differentiates through
llama.cpp's encoder). A *random* tower squeezes each 16x16 patch through random layers into 64
numbers, which loses the strokes of 15 px text; a tiny text model cannot learn to read that in
minutes. This module writes a ``qwen3vl_merger`` projector (a plain GGUF that llama.cpp's mtmd
runs like any other) whose weights are chosen so every merged 32x32 cell's embedding carries:

- the cell's luminance at 2x2-pixel resolution (the conv kernel averages 2x2 blocks: 8x8 values
  per 16x16 patch, 16x16 per cell), so glyphs and widget edges survive;
- each patch's mean colour (themes, highlighted buttons);
- where the cell is: sines and cosines of its x and y at 0.5..8 cycles per screen, at a 100 px
  period on a 640x360 screen (the tens digit of a coordinate), plus x and y themselves,
  through the learned-position grid (which mtmd resizes to the image bilinearly), so a model
  with plain 1-D positions (llama) can still say where a cell is.

The ViT block is the identity (its output projections are zero), ``mm.0`` + GELU is a monotone
per-feature map (identity weights, a +3 bias that keeps GELU in its near-linear range), and
``mm.2`` is a fixed random projection (seeded) from the 4 x ``VISION_EMBD`` cell features to the
text model's width, which the text model learns to read. Invariant: nothing here is trained;
the same seed gives the same file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cachepolicy.engine.vision import POSITION_FEATURES_KEY
from cachepolicy.forge import TextSpec
from cachepolicy.forge.mmproj import mmproj_plans, write_mmproj
from cachepolicy.forge.specs import VisionSpec
from cachepolicy.forge.writer import TensorPlan, given

__all__ = ["VISION_EMBD", "readable_vision_spec", "write_readable_mmproj"]

PATCH = 16
POOL = 2  # luminance is averaged over POOL x POOL pixel blocks
LUMA = (0.299, 0.587, 0.114)
FREQUENCIES = (0.5, 1.0, 2.0, 4.0, 8.0)  # cycles per screen width / height
#: kvagent run's default screen: on it two more features give the phase of x mod 100 and
#: y mod 100 at each patch's centre (the tens digit of a coordinate the agent writes); at other
#: sizes they are just two more frequencies
DECIMAL_SCREEN = (640, 360)
POS_SIDE = 64  # the position grid; 8 samples per cycle at the highest frequency
VISION_EMBD = 96
GELU_SHIFT = 3.0

_N_LUMA = (PATCH // POOL) ** 2  # 64
_COLOUR = _N_LUMA  # 3 mean-colour features start here
_POSITION = _COLOUR + 3  # position features start here
_N_POSITION = 2 + 4 * len(FREQUENCIES) + 4  # x, y, sin/cos per axis and frequency, phases
assert _POSITION + _N_POSITION <= VISION_EMBD


def readable_vision_spec(spec: TextSpec) -> VisionSpec:
    """The projector's hyper-parameters for a text model of ``spec.n_embd``."""
    return VisionSpec(projector="qwen3vl_merger", image_size=512, patch_size=PATCH,
                      n_embd=VISION_EMBD, n_ff=32, n_layer=1, n_head=2,
                      projection_dim=spec.n_embd, pos_side=POS_SIDE)


def _patch_kernel() -> np.ndarray:
    """numpy order [E, 3, y, x]: luminance 2x2 averages, then mean R, G, B."""
    k = np.zeros((VISION_EMBD, 3, PATCH, PATCH), np.float32)
    side = PATCH // POOL
    for by in range(side):
        for bx in range(side):
            ys, xs = slice(by * POOL, (by + 1) * POOL), slice(bx * POOL, (bx + 1) * POOL)
            for c, w in enumerate(LUMA):
                k[by * side + bx, c, ys, xs] = w / POOL**2
    for c in range(3):
        k[_COLOUR + c, c] = 1.0 / PATCH**2
    return k


def _position_grid() -> np.ndarray:
    """numpy order [POS_SIDE**2, E]: row gy * POS_SIDE + gx; zero outside the position dims."""
    g = np.zeros((POS_SIDE, POS_SIDE, VISION_EMBD), np.float32)
    u = np.linspace(0.0, 1.0, POS_SIDE, dtype=np.float64)
    x, y = np.meshgrid(u, u)  # x varies along gx (columns), y along gy (rows)
    feats = [2 * x - 1, 2 * y - 1]
    for f in FREQUENCIES:
        for axis in (x, y):
            feats += [np.sin(2 * np.pi * f * axis), np.cos(2 * np.pi * f * axis)]
    # grid point u = 0 / 1 is the first / last patch's centre (mtmd resizes the grid with
    # aligned corners); on DECIMAL_SCREEN the image is resized to multiples of 32 px first
    for size, axis in zip(DECIMAL_SCREEN, (x, y)):
        resized = size // 32 * 32
        centre = (PATCH / 2 + (resized - PATCH) * axis) * size / resized
        feats += [np.sin(2 * np.pi * centre / 100), np.cos(2 * np.pi * centre / 100)]
    for i, values in enumerate(feats):
        g[:, :, _POSITION + i] = values
    return g.reshape(POS_SIDE * POS_SIDE, VISION_EMBD)


def _designed_values(spec: VisionSpec, seed: int) -> dict[str, np.ndarray]:
    e4 = 4 * spec.n_embd
    rng = np.random.default_rng(seed)
    projection = rng.normal(0.0, e4**-0.5, (spec.projection_dim, e4)).astype(np.float32)
    return {
        "v.patch_embd.weight": _patch_kernel(),
        "v.position_embd.weight": _position_grid(),
        "mm.0.weight": np.eye(e4, dtype=np.float32),
        "mm.0.bias": np.full(e4, GELU_SHIFT, np.float32),
        "mm.2.weight": projection,
        # undo the shift on the (near-linear) GELU's output: W (x + s) - W s = W x
        "mm.2.bias": -GELU_SHIFT * projection.sum(axis=1),
    }


def _plan_values(plan: TensorPlan, designed: dict[str, np.ndarray]) -> TensorPlan:
    if plan.name in designed:
        return given(plan, designed[plan.name])
    shape = tuple(reversed(plan.dims))
    if plan.name.endswith(("ln1.weight", "ln2.weight", "post_ln.weight")):
        return given(plan, np.ones(shape, np.float32))
    # everything else is zero: the second temporal kernel, the patch bias, every block's
    # q/k/v and output projections and FFN (so the block adds nothing: the identity)
    return given(plan, np.zeros(shape, np.float32))


def write_readable_mmproj(spec: TextSpec, path: str | Path, *, seed: int = 0) -> Path:
    """Write the designed projector for ``spec`` to ``path`` (deterministic in ``seed``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vspec = readable_vision_spec(spec)
    designed = _designed_values(vspec, seed)
    plans = [_plan_values(p, designed) for p in mmproj_plans(vspec)]
    write_mmproj(vspec, path, seed, plans, name="kvagent-readable-mmproj",
                 flags=(POSITION_FEATURES_KEY,))
    return path
