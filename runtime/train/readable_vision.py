"""A frozen vision projector made to be read: designed weights instead of random ones.

The trained agents keep the vision tower frozen (the trainer never differentiates through
llama.cpp's encoder). A *random* tower squeezes each 16x16 patch through random layers into 64
numbers, which loses the strokes of 15 px text; a tiny text model cannot learn to read that in
minutes. This module writes a ``qwen3vl_merger`` projector (a plain GGUF that llama.cpp's mtmd
runs like any other) whose weights are chosen so every merged 32x32 cell's embedding carries:

- where the cell is, as the agent writes it: on the 640x360 screen ``kvagent run`` uses, the
  decimal digits of the cell's centre in screen pixels (x: hundreds, tens, ones; y: the same),
  one-hot, in dedicated embedding dimensions — an agent that clicks cell centres (the trained
  agents do, ``runtime.train.aim``) copies a cell's digits into its answer — plus x and y
  themselves. The position grid (which mtmd resizes bilinearly to the image's patch grid) is
  solved so the resized values are exactly these per-cell features; at other screen sizes they
  are just features with the wrong digits;
- the cell's luminance at 2x2-pixel resolution (the conv kernel averages 2x2 blocks: 8x8 values
  per 16x16 patch, 16x16 per cell) and each patch's mean colour, through a fixed random
  projection (seeded) into the remaining dimensions.

The ViT block is the identity (its output projections are zero) and there is no post-norm (it
would rescale every patch by its own contrast), ``mm.0`` + GELU is a monotone per-feature map
(identity weights, a +3 bias that keeps GELU in its near-linear range: a one-hot feature comes
out within 0.005 of 0 or 1), and ``mm.2`` copies the position features (averaged over a cell's
four patches, which share them) and projects the rest. Invariant: nothing here is trained; the
same seed gives the same file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cachepolicy.engine.vision import POSITION_FEATURES_KEY
from cachepolicy.forge import TextSpec
from cachepolicy.forge.mmproj import mmproj_plans, write_mmproj
from cachepolicy.forge.specs import VisionSpec
from cachepolicy.forge.writer import TensorPlan, given

__all__ = ["DECIMAL_SCREEN", "VISION_EMBD", "cell_centres", "readable_vision_spec",
           "write_readable_mmproj"]

PATCH = 16
MERGE = 2  # the merger's 2x2 patches per cell
CELL = PATCH * MERGE
POOL = 2  # luminance is averaged over POOL x POOL pixel blocks
LUMA = (0.299, 0.587, 0.114)
#: kvagent run's default screen, the one whose coordinates the position digits spell
DECIMAL_SCREEN = (640, 360)
#: (axis, place value, digits) of the one-hot position features: x's hundreds, tens and ones,
#: then y's
DIGITS = ((0, 100, 7), (0, 10, 10), (0, 1, 10), (1, 100, 4), (1, 10, 10), (1, 1, 10))
POS_SIDE = 64  # the learned position grid (mtmd resizes it to the patch grid)
VISION_EMBD = 128
GELU_SHIFT = 3.0
PIXEL_GAIN = 0.4

_N_LUMA = (PATCH // POOL) ** 2  # 64
_COLOUR = _N_LUMA  # 3 mean-colour features start here
_N_PIXEL = _COLOUR + 3  # luminance and colour: the features that depend on the pixels
_POSITION = _N_PIXEL  # position features start here: the digits, then x and y
_N_DIGITS = sum(n for _, _, n in DIGITS)  # 51
_N_POSITION = _N_DIGITS + 2
assert _POSITION + _N_POSITION <= VISION_EMBD


def readable_vision_spec(spec: TextSpec) -> VisionSpec:
    """The projector's hyper-parameters for a text model of ``spec.n_embd``."""
    if spec.n_embd <= _N_POSITION:
        raise ValueError(f"a text model of width {spec.n_embd} has no room beside the "
                         f"{_N_POSITION} position features")
    return VisionSpec(projector="qwen3vl_merger", image_size=512, patch_size=PATCH,
                      n_embd=VISION_EMBD, n_ff=32, n_layer=1, n_head=2,
                      projection_dim=spec.n_embd, pos_side=POS_SIDE)


def cell_centres(screen: tuple[int, int] = DECIMAL_SCREEN) -> tuple[list[int], list[int]]:
    """The screen-pixel centres of the encoder's cells along x and along y: mtmd resizes an
    image to multiples of ``CELL`` pixels (640x360 -> 640x352) and merges ``CELL``-pixel
    squares into one embedding each."""
    out = []
    for size in screen:
        resized = max(CELL, round(size / CELL) * CELL)
        out.append([round((CELL * c + CELL / 2) * size / resized)
                    for c in range(resized // CELL)])
    return out[0], out[1]


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


def _cell_features(axis: int, centres: list[int], size: int) -> np.ndarray:
    """[cells, _N_POSITION]: per cell along ``axis``, its digits (one-hot, the other axis'
    digits zero) and its coordinate in [-1, 1] (the other axis' zero)."""
    f = np.zeros((len(centres), _N_POSITION), np.float64)
    for c, centre in enumerate(centres):
        col = 0
        for ax, place, n in DIGITS:
            if ax == axis:
                f[c, col + min(centre // place % 10, n - 1)] = 1.0
            col += n
        f[c, _N_DIGITS + axis] = 2.0 * centre / size - 1.0
    return f


def _resize_matrix(n_out: int) -> np.ndarray:
    """[n_out, POS_SIDE]: ggml's bilinear resize with aligned corners along one axis, in its
    float32 arithmetic (each output a blend of two neighbouring grid values)."""
    a = np.zeros((n_out, POS_SIDE), np.float64)
    sf = np.float32(n_out - 1) / np.float32(POS_SIDE - 1)
    for i in range(n_out):
        x = np.float32(i) / sf
        x0 = int(np.floor(x))
        dx = float(min(max(np.float32(x) - np.float32(x0), 0.0), 1.0))
        a[i, min(max(x0, 0), POS_SIDE - 1)] += 1.0 - dx
        a[i, min(max(x0 + 1, 0), POS_SIDE - 1)] += dx
    return a


def _position_grid() -> np.ndarray:
    """numpy order [POS_SIDE**2, E]: row gy * POS_SIDE + gx; zero outside the position dims.

    Per axis the grid values solve ``resize(grid) = features of each patch's cell`` exactly
    (min-norm: 64 grid samples, 40 or 22 patches, each patch reading two neighbours); the x
    features live on columns and are constant down them, so resizing along y keeps them."""
    g = np.zeros((POS_SIDE, POS_SIDE, VISION_EMBD), np.float32)
    for axis, centres in enumerate(cell_centres(DECIMAL_SCREEN)):
        per_patch = np.repeat(_cell_features(axis, centres, DECIMAL_SCREEN[axis]), MERGE, axis=0)
        grid = np.linalg.pinv(_resize_matrix(len(per_patch))) @ per_patch  # [POS_SIDE, F]
        if axis == 0:
            g[:, :, _POSITION:_POSITION + _N_POSITION] += grid[None, :, :].astype(np.float32)
        else:
            g[:, :, _POSITION:_POSITION + _N_POSITION] += grid[:, None, :].astype(np.float32)
    return g.reshape(POS_SIDE * POS_SIDE, VISION_EMBD)


def _designed_values(spec: VisionSpec, seed: int) -> dict[str, np.ndarray]:
    e, merged, out = spec.n_embd, spec.n_embd * MERGE**2, spec.projection_dim
    rng = np.random.default_rng(seed)
    w = np.zeros((out, merged), np.float32)
    for b in range(MERGE**2):  # the cell's four patches, side by side in the merged vector
        # position features: the mean of the four copies (they are equal) -> dims 0.._N_POSITION
        w[np.arange(_N_POSITION), b * e + _POSITION + np.arange(_N_POSITION)] = 1.0 / MERGE**2
    pixel_cols = np.concatenate([b * e + np.arange(_N_PIXEL) for b in range(MERGE**2)])
    # mtmd normalises pixels to [-1, 1] (mid-grey 0); the gain keeps a cell's pixel part about
    # as long as its position part (~2.5), so neither drowns the other in the text model's norm
    w[_N_POSITION:, pixel_cols] = rng.normal(0.0, PIXEL_GAIN * len(pixel_cols) ** -0.5,
                                             (out - _N_POSITION, len(pixel_cols)))
    return {
        "v.patch_embd.weight": _patch_kernel(),
        "v.position_embd.weight": _position_grid(),
        "mm.0.weight": np.eye(merged, dtype=np.float32),
        "mm.0.bias": np.full(merged, GELU_SHIFT, np.float32),
        "mm.2.weight": w,
        # undo the shift on the (near-linear) GELU's output: W (x + s) - W s = W x
        "mm.2.bias": -GELU_SHIFT * w.sum(axis=1),
    }


def _plan_values(plan: TensorPlan, designed: dict[str, np.ndarray]) -> TensorPlan:
    if plan.name in designed:
        return given(plan, designed[plan.name])
    shape = tuple(reversed(plan.dims))
    if plan.name.endswith(("ln1.weight", "ln2.weight")):
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
    # no post-norm: llama.cpp applies v.post_ln only when the file has it
    plans = [_plan_values(p, designed) for p in mmproj_plans(vspec)
             if not p.name.startswith("v.post_ln.")]
    write_mmproj(vspec, path, seed, plans, name="kvagent-readable-mmproj",
                 flags=(POSITION_FEATURES_KEY,))
    return path
