"""The projector's recogniser: a per-cell MLP (what ``mm.0`` / GELU / ``mm.2`` compute) that
writes, into dimensions of their own, a *key* saying which widget a cell is.

Trained before the text model, on simdesk's expert episodes at 640x384: each cell's features
(``cell_features``, what llama.cpp's merger reads) against the class of the widget a click at
its centre reaches (``cell_labels``). A key is matched against fixed random unit *codes*,
one per class (``logits = SHARPNESS · key · codes``), so a class's code is what a lookup
matches and what the text model's query must carry. Classes are weighted by the inverse
square root of their frequency (capped), so rare dialog buttons count. Only the luminance
and colour features are read: positions are random per seed and must not be memorised.

Deterministic from ``seed``; ~3 minutes for 1500 updates on one core.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from runtime.train.agents import AGENT_SCREEN
from runtime.train.cell_features import CELL, MERGED_FEATURES, cell_features, content_mask
from runtime.train.cell_labels import OTHER, cell_classes, click_class
from runtime.train.optim import AdamW, apply_updates, init_state
from vmenv.actions import Click
from vmenv.simdesk.demos import DemonstrationError, demonstration
from vmenv.simdesk.kinds import sample_task, task_kinds
from vmenv.simdesk.render import render

__all__ = ["CellData", "Recogniser", "cell_data", "lookup_accuracy", "train_recogniser"]

SCREEN = AGENT_SCREEN
SHARPNESS = 8.0
KEY_NORM = 3.0  # the keys' mean norm once exported (the codes are unit vectors)


@attrs.frozen(eq=False)
class CellData:
    """Screens as cells: ``features [n, rows, cols, 4E]``, ``labels [n, rows, cols]`` (class
    indices), and per screen the expert's click (``click_class`` index and ``click_cell``
    = row * cols + col; -1 when the step is not a click)."""

    features: np.ndarray = attrs.field(repr=False)
    labels: np.ndarray = attrs.field(repr=False)
    click_class: np.ndarray = attrs.field(repr=False)
    click_cell: np.ndarray = attrs.field(repr=False)
    classes: tuple[str, ...]


def _screens(seeds: Iterator[int], n_episodes: int) -> Iterator[tuple[np.ndarray, np.ndarray,
                                                                       str | None, int]]:
    done = 0
    for seed, kind in zip(seeds, itertools.cycle(task_kinds())):
        if done >= n_episodes:
            return
        try:
            demo = demonstration(sample_task(kind, seed), *SCREEN)
        except DemonstrationError:
            continue
        done += 1
        for step in demo:
            rgb = np.asarray(render(step.state).convert("RGB"))
            target, cell = None, -1
            if isinstance(step.action, Click):
                x, y = step.action.x, step.action.y
                target = click_class(step.state, x, y)
                cell = (y // CELL) * (SCREEN[0] // CELL) + x // CELL
            yield cell_features(rgb), cell_classes(step.state), target, cell


def cell_data(seeds: Iterator[int], n_episodes: int,
              classes: tuple[str, ...] | None = None) -> CellData:
    """The cells of ``n_episodes`` expert episodes (task kinds in turn, one seed each).
    ``classes``: a fixed class list (held-out data is read in the training data's classes;
    an unseen class becomes ``other``); None: ``other`` and every class seen, sorted."""
    feats, names, targets, cells = [], [], [], []
    for f, lab, target, cell in _screens(seeds, n_episodes):
        feats.append(f)
        names.append(lab)
        targets.append(target)
        cells.append(cell)
    if classes is None:
        seen = {str(n) for lab in names for n in lab.ravel()} | {t for t in targets if t}
        classes = (OTHER, *sorted(seen - {OTHER}))
    index = {c: i for i, c in enumerate(classes)}
    labels = np.stack([np.vectorize(lambda n: index.get(n, 0))(lab) for lab in names])
    return CellData(np.stack(feats), labels.astype(np.int32),
                    np.array([index.get(t, 0) if t else -1 for t in targets], np.int32),
                    np.array(cells, np.int32), tuple(classes))


@attrs.frozen(eq=False)
class Recogniser:
    """The trained MLP in the merger's terms: ``key = gelu(f @ w0 + b0) @ w2 + b2`` over the
    merged features ``f`` (the input standardisation folded into ``w0`` / ``b0``), the class
    ``codes [n_classes, key_dims]`` and their names."""

    w0: np.ndarray = attrs.field(repr=False)
    b0: np.ndarray = attrs.field(repr=False)
    w2: np.ndarray = attrs.field(repr=False)
    b2: np.ndarray = attrs.field(repr=False)
    codes: np.ndarray = attrs.field(repr=False)
    classes: tuple[str, ...]

    @property
    def hidden(self) -> int:
        return int(self.w0.shape[1])

    def keys(self, features: np.ndarray) -> np.ndarray:
        """[..., key_dims] for features [..., 4E] (tanh GELU, as ggml's)."""
        h = np.asarray(jax.nn.gelu(jnp.asarray(features @ self.w0 + self.b0)))
        return h @ self.w2 + self.b2


def train_recogniser(data: CellData, *, key_dims: int, hidden: int = 512,
                     updates: int = 1500, seed: int = 0,
                     progress: Callable[[int, float], None] | None = None) -> Recogniser:
    """Train on ``data``'s cells (4096 per update, AdamW 2e-3 with warmup and cosine decay).
    ``progress(update, loss)`` is called every 250 updates."""
    n_cls = len(data.classes)
    x_all = data.features.reshape(-1, MERGED_FEATURES)
    y_all = data.labels.reshape(-1)
    mask = content_mask()
    mean = np.where(mask, x_all.mean(0), 0.0)
    inv_std = np.where(mask, 1.0 / (x_all.std(0) + 1e-3), 0.0)
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    codes = jax.random.normal(k[2], (n_cls, key_dims))
    codes = codes / jnp.linalg.norm(codes, axis=1, keepdims=True)
    params = {"w0": jax.random.normal(k[0], (MERGED_FEATURES, hidden)) * mask.sum() ** -0.5,
              "b0": jnp.zeros(hidden),
              "w2": jax.random.normal(k[1], (hidden, key_dims)) * hidden**-0.5,
              "b2": jnp.zeros(key_dims)}
    freq = np.bincount(y_all, minlength=n_cls) + 1
    weight = jnp.asarray(np.minimum((freq.sum() / freq) ** 0.5, 30.0), jnp.float32)
    mean_j, inv_j = jnp.asarray(mean, jnp.float32), jnp.asarray(inv_std, jnp.float32)

    def keys(p, x):
        return jax.nn.gelu(((x - mean_j) * inv_j) @ p["w0"] + p["b0"]) @ p["w2"] + p["b2"]

    def loss(p, x, y):
        lp = jax.nn.log_softmax(keys(p, x) @ codes.T * SHARPNESS)
        w = weight[y]
        return -(jnp.take_along_axis(lp, y[:, None], 1)[:, 0] * w).sum() / w.sum()

    opt = AdamW(learning_rate=2e-3, b2=0.99, warmup_steps=100, decay_steps=updates,
                min_lr_ratio=0.1, clip_norm=1.0)

    @jax.jit
    def step(state, x, y):
        val, g = jax.value_and_grad(loss)(state.params, x, y)
        return apply_updates(state, g, opt)[0], val

    rng = np.random.default_rng(seed)
    state = init_state(params)
    for t in range(1, updates + 1):
        i = rng.integers(0, len(y_all), 4096)
        state, val = step(state, jnp.asarray(x_all[i]), jnp.asarray(y_all[i]))
        if progress is not None and (t % 250 == 0 or t == updates):
            progress(t, float(val))
    p = {name: np.asarray(v, np.float64) for name, v in state.params.items()}
    # fold the standardisation into the first layer: ((x - m) * s) @ w0 = x @ (s w0) - (m s) @ w0
    w0 = inv_std[:, None] * p["w0"]
    b0 = p["b0"] - (mean * inv_std) @ p["w0"]
    sample = x_all[rng.integers(0, len(x_all), 4096)]
    h = np.asarray(jax.nn.gelu(jnp.asarray(sample @ w0 + b0)))
    scale = KEY_NORM / np.linalg.norm(h @ p["w2"] + p["b2"], axis=-1).mean()
    return Recogniser(w0.astype(np.float32), b0.astype(np.float32),
                      (p["w2"] * scale).astype(np.float32), (p["b2"] * scale).astype(np.float32),
                      np.asarray(codes, np.float32), data.classes)


def lookup_accuracy(rec: Recogniser, data: CellData) -> float:
    """Per expert click in ``data``: is the cell the recogniser scores highest for the clicked
    class a cell of that class? (What an agent's lookup can at best find.)"""
    scores = rec.keys(data.features) @ rec.codes.T  # [n, rows, cols, classes]
    right = []
    for n in np.nonzero(data.click_class >= 0)[0]:
        c = data.click_class[n]
        best = np.unravel_index(scores[n, ..., c].argmax(), scores.shape[1:3])
        right.append(data.labels[n][best] == c)
    if not right:
        raise ValueError("no expert clicks in the data")
    return float(np.mean(right))
