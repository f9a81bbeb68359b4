"""What the agents' projector sees of a screenshot: per 32x32 cell, its four 16x16 patches'
features as llama.cpp's encoder front computes them — the designed weights, and their numpy
replica the trainer learns the merger on.

The front of the ``qwen3vl_merger`` projector is fixed, not trained: a conv kernel (the
second temporal kernel and the patch bias are zero), the learned-position grid (which mtmd
resizes bilinearly, with aligned corners, to the image's patch grid), one ViT block that is the
identity (zero output projections), and the post-LayerNorm (weight 1, bias 0). Per patch
(``VISION_EMBD`` features, the rest zero):

* ``0..63``: luminance at 2x2-pixel resolution (of mtmd's normalised pixels, in [-1, 1]);
* ``64..66``: the mean colour;
* ``ANCHOR`` ``±C`` (through the position grid): a constant pair that dominates the
  LayerNorm's variance, so the norm divides every patch by nearly the same number (the
  content and the position change it by < 0.1 %) — the features stay a near-linear function
  of the pixels;
* ``X``/``Y`` ``±K·(2u − 1)``: the patch's position on the grid, u in [0, 1] from the first
  patch's centre to the last's. Being linear in u, the bilinear resize reproduces it exactly;
  as a ± pair, the LayerNorm's mean cancels from their difference.

Merged cells concatenate their patches as clip.cpp does: (row 0, col 0), (0, 1), (1, 0), (1, 1).
"""

from __future__ import annotations

import numpy as np

__all__ = ["CELL", "MERGED_FEATURES", "PATCH", "POS_SCALE", "VISION_EMBD", "cell_features",
           "content_mask", "patch_kernel", "position_grid", "position_readout", "unit_readout"]

PATCH = 16
CELL = 2 * PATCH
POOL = 2
VISION_EMBD = 96
POS_SIDE = 64
LN_EPS = 1e-6
MERGED_FEATURES = 4 * VISION_EMBD
#: the size of a designed one-hot or flag in a row (cell_vision's position one-hots, the
#: menu read-out's cells, the text side's flags)
POS_SCALE = 3.0

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
_N_LUMA = (PATCH // POOL) ** 2  # 64
COLOUR = _N_LUMA  # 3 features
ANCHOR = COLOUR + 3  # +C, -C
X = ANCHOR + 2  # +K x, -K x
Y = X + 2  # +K y, -K y
C = 1000.0
K = 32.0
assert Y + 2 <= VISION_EMBD
#: the LayerNorm's divisor when the anchor dominates (the merger undoes it with this)
SIGMA = C * (2.0 / VISION_EMBD) ** 0.5


def patch_kernel() -> np.ndarray:
    """numpy order [E, 3, y, x]: luminance 2x2 averages, then mean R, G, B."""
    k = np.zeros((VISION_EMBD, 3, PATCH, PATCH), np.float32)
    side = PATCH // POOL
    for by in range(side):
        for bx in range(side):
            ys, xs = slice(by * POOL, (by + 1) * POOL), slice(bx * POOL, (bx + 1) * POOL)
            for c in range(3):
                k[by * side + bx, c, ys, xs] = LUMA[c] / POOL**2
    for c in range(3):
        k[COLOUR + c, c] = 1.0 / PATCH**2
    return k


def position_grid() -> np.ndarray:
    """numpy order [POS_SIDE**2, E]: row gy * POS_SIDE + gx."""
    g = np.zeros((POS_SIDE, POS_SIDE, VISION_EMBD), np.float32)
    u = np.linspace(0.0, 1.0, POS_SIDE)
    x, y = np.meshgrid(u, u)  # x varies along gx (columns), y along gy (rows)
    g[..., ANCHOR], g[..., ANCHOR + 1] = C, -C
    g[..., X], g[..., X + 1] = K * (2 * x - 1), -K * (2 * x - 1)
    g[..., Y], g[..., Y + 1] = K * (2 * y - 1), -K * (2 * y - 1)
    return g.reshape(POS_SIDE * POS_SIDE, VISION_EMBD)


def _front(rgb: np.ndarray) -> np.ndarray:
    """[ph, pw, E]: the conv and the resized grid, before the LayerNorm."""
    h, w = rgb.shape[:2]
    if h % CELL or w % CELL:
        raise ValueError(f"cell features need sides that are multiples of {CELL} px "
                         f"(no resize); got {w}x{h}")
    pixels = (rgb.astype(np.float32) / 255.0 - 0.5) / 0.5
    lum = pixels @ LUMA
    ph, pw, side = h // PATCH, w // PATCH, PATCH // POOL
    pooled = lum.reshape(h // POOL, POOL, w // POOL, POOL).mean(axis=(1, 3))
    luma = pooled.reshape(ph, side, pw, side).transpose(0, 2, 1, 3).reshape(ph, pw, side**2)
    colour = pixels.reshape(ph, PATCH, pw, PATCH, 3).mean(axis=(1, 3))
    f = np.zeros((ph, pw, VISION_EMBD), np.float32)
    f[..., :_N_LUMA], f[..., COLOUR:COLOUR + 3] = luma, colour
    uy, ux = np.meshgrid(np.linspace(0, 1, ph), np.linspace(0, 1, pw), indexing="ij")
    f[..., ANCHOR] += C
    f[..., ANCHOR + 1] -= C
    f[..., X] += K * (2 * ux - 1)
    f[..., X + 1] -= K * (2 * ux - 1)
    f[..., Y] += K * (2 * uy - 1)
    f[..., Y + 1] -= K * (2 * uy - 1)
    return f


def cell_features(rgb: np.ndarray) -> np.ndarray:
    """[rows, cols, 4E] float32: what the merger's ``mm.0`` reads for each 32x32 cell of an
    RGB image (uint8 [H, W, 3], sides multiples of 32 so mtmd does not resize)."""
    f = _front(rgb).astype(np.float64)
    mean = f.mean(-1, keepdims=True)
    var = ((f - mean) ** 2).mean(-1, keepdims=True)
    normed = ((f - mean) / np.sqrt(var + LN_EPS)).astype(np.float32)
    ph, pw = normed.shape[:2]
    cells = normed.reshape(ph // 2, 2, pw // 2, 2, VISION_EMBD).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(cells.reshape(ph // 2, pw // 2, MERGED_FEATURES))


def content_mask() -> np.ndarray:
    """[4E] bool: the merged features that say what a cell looks like — each of its 4
    patches' luminance and colour (not the anchor or the position pairs)."""
    mask = np.zeros(MERGED_FEATURES, bool)
    for slot in range(4):
        mask[slot * VISION_EMBD:slot * VISION_EMBD + COLOUR + 3] = True
    return mask


def position_readout(axis: str, n_patches: int) -> tuple[np.ndarray, float]:
    """(w, b) such that ``w · features + b`` is a merged cell's index along ``axis`` ("x":
    its column, "y": its row) on an image ``n_patches`` patches long on that axis: the mean
    over the cell's 4 patches of ``(f[+] − f[−]) / 2 · SIGMA / K`` is ``2u − 1``, with u the
    patch's grid position; a patch's index is ``u (n − 1)`` and a cell's is its patches' mean
    index (``2 cell + 0.5``) less 0.5, halved."""
    w = _pair_mean({"x": X, "y": Y}[axis])
    # 2u - 1 = (SIGMA / K) w·f  ->  cell = ((n - 1) u - 0.5) / 2
    scale = (SIGMA / K) * (n_patches - 1) / 4.0
    return w * scale, ((n_patches - 1) / 2.0 - 0.5) / 2.0


def unit_readout() -> np.ndarray:
    """w such that ``w · features`` is ``SIGMA / σ`` (about 1), σ the LayerNorm's divisor of
    the cell's patches (their mean): the anchor pair read the way ``position_readout`` reads
    the position pairs, so ``(c − b) (w_unit · f) − w · f`` is ``(c − p) SIGMA / σ`` — zero
    at the cell c itself whatever σ is, where ``c − (w · f + b)`` is off by up to 0.01
    (the content moves σ by up to 0.1 %)."""
    return _pair_mean(ANCHOR) * (SIGMA / C)


def _pair_mean(first: int) -> np.ndarray:
    """w such that ``w · features`` is the mean over a cell's 4 patches of
    ``(f[first] − f[first + 1]) / 2``: a ± pair's value, the LayerNorm's mean cancelled."""
    w = np.zeros(MERGED_FEATURES, np.float64)
    for slot in range(4):
        w[slot * VISION_EMBD + first] += 1.0 / 8.0
        w[slot * VISION_EMBD + first + 1] -= 1.0 / 8.0
    return w
