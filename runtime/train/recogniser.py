"""The projector's recogniser: a per-cell MLP (what ``mm.0`` / GELU / ``mm.2`` compute) that
writes, into dimensions of their own, a *key* saying which widget a cell is.

Trained before the text model, on simdesk's expert episodes at 640x384: each cell's features
(``cell_features``, what llama.cpp's merger reads) against the class of the widget a click at
its centre reaches (``cell_labels``). A key is matched against fixed unit *codes*, one per
class, pushed apart (``codes.spread_codes``), so a class's code is what a lookup matches and
what the text model's query must carry. Its terms, over whole screens (16 per update):

* per cell, its class: ``log_softmax(SHARPNESS · KEY_NORM · cos(key, codes))``, classes
  weighted by the inverse square root of their frequency (capped), so rare dialog buttons
  count;
* per screen and class on it, the *lookup*: a softmax over the screen's cells of
  ``LOOKUP_SHARPNESS · cos(key, code)`` (what the hybrid's q/k-normed attention computes)
  must put its mass on that class's cells. The per-cell term alone let a cell of another
  class outscore every right one (held-out lookup 0.90 by cosine; 0.97 with this term, the
  codes pushed apart and near-unit keys — docs/training.md "The recogniser trained as the
  lookup uses it");
* with ``menu`` (``kvagent train --menu-flag``), the menu read-out's (``menu_readout``);
* the keys' norms are held near 1 (exported at ``KEY_NORM``), so a dot product (llama's
  un-normed attention) ranks cells nearly as the cosine does.

Only the luminance and colour features are read: positions are random per seed and must not
be memorised. Deterministic from ``seed``; ~3 minutes for 1500 updates on one core.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from runtime.train.agents import AGENT_SCREEN
from runtime.train.cell_features import CELL, MERGED_FEATURES, cell_features, content_mask
from runtime.train.cell_labels import OTHER, MenuEntries, cell_targets, click_class
from runtime.train.codes import spread_codes
from runtime.train.menu_readout import MenuReadout, menu_cells, menu_loss
from runtime.train.optim import AdamW, apply_updates, init_state
from runtime.train.sub_readout import SubReadout, export_sub, init_sub, sub_loss
from vmenv.actions import Click
from vmenv.simdesk.demos import DemonstrationError, demonstration
from vmenv.simdesk.grid_clicks import ClickGrid
from vmenv.simdesk.kinds import sample_task, task_kinds
from vmenv.simdesk.render import render

__all__ = ["CellData", "Recogniser", "cell_data", "lookup_accuracy", "train_recogniser"]

SCREEN = AGENT_SCREEN
SHARPNESS = 8.0
KEY_NORM = 3.0  # the keys' mean norm once exported (the codes are unit vectors)
#: the lookup term's scale: q/k norm weight 2.5 squared times sqrt(head_dim 48), as the
#: hybrid's designed lookup head scores a unit query against a unit key (``grounding``)
LOOKUP_SHARPNESS = 43.0
SCREENS_PER_UPDATE = 16


@attrs.frozen(eq=False)
class CellData:
    """Screens as cells: ``features [n, rows, cols, 4E]``, ``labels [n, rows, cols]`` (class
    indices), and per screen the expert's click (``click_class`` index and ``click_cell``
    = row * cols + col; -1 when the step is not a click); ``menu [n, rows, cols]``: the cells
    of the open menu (``menu_readout.menu_cells``)."""

    features: np.ndarray = attrs.field(repr=False)
    labels: np.ndarray = attrs.field(repr=False)
    click_class: np.ndarray = attrs.field(repr=False)
    click_cell: np.ndarray = attrs.field(repr=False)
    menu: np.ndarray = attrs.field(repr=False)
    classes: tuple[str, ...]
    #: [n, rows, cols, 2]: each cell's point in steps from its centre (``cell_targets``;
    #: all 0 on the centre grid)
    steps: np.ndarray = attrs.field(repr=False)

    def concat(self, other: CellData) -> CellData:
        """These screens, then ``other``'s (read in the same classes)."""
        if other.classes != self.classes:
            raise ValueError("screens read in different class lists")
        return CellData(*(np.concatenate([getattr(self, f), getattr(other, f)])
                          for f in ("features", "labels", "click_class", "click_cell",
                                    "menu")),
                        classes=self.classes,
                        steps=np.concatenate([self.steps, other.steps]))


def _screens(seeds: Iterator[int], n_episodes: int, kinds: Sequence[str], entries: MenuEntries,
             grid: ClickGrid | None,
             ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, str | None, int,
                                 np.ndarray]]:
    done = 0
    for seed, kind in zip(seeds, itertools.cycle(kinds)):
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
                target = click_class(step.state, x, y, entries)
                cell = (y // CELL) * (SCREEN[0] // CELL) + x // CELL
            classes, steps = cell_targets(step.state, entries, grid)
            yield (cell_features(rgb), classes, steps, target, cell, menu_cells(step.state))


def cell_data(seeds: Iterator[int], n_episodes: int, classes: tuple[str, ...] | None = None,
              kinds: Sequence[str] | None = None, entries: MenuEntries = "menu",
              grid: ClickGrid | None = None) -> CellData:
    """The cells of ``n_episodes`` expert episodes (``kinds``, default every task kind, in
    turn, one seed each). ``classes``: a fixed class list (held-out data is read in the
    training data's classes; an unseen class becomes ``other``); None: ``other`` and every
    class seen, sorted. ``entries``: how menu entries are classed (``cell_labels``);
    ``grid``: whose cell points the labels are (``cell_targets``; default the centres)."""
    feats, names, steps, targets, cells, menus = [], [], [], [], [], []
    for f, lab, st, target, cell, menu in _screens(seeds, n_episodes, kinds or task_kinds(),
                                                   entries, grid):
        feats.append(f)
        names.append(lab)
        steps.append(st)
        targets.append(target)
        cells.append(cell)
        menus.append(menu)
    if classes is None:
        seen = {str(n) for lab in names for n in lab.ravel()} | {t for t in targets if t}
        classes = (OTHER, *sorted(seen - {OTHER}))
    index = {c: i for i, c in enumerate(classes)}
    labels = np.stack([np.vectorize(lambda n: index.get(n, 0))(lab) for lab in names])
    return CellData(np.stack(feats), labels.astype(np.int32),
                    np.array([index.get(t, 0) if t else -1 for t in targets], np.int32),
                    np.array(cells, np.int32), np.stack(menus), tuple(classes),
                    np.stack(steps))


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
    #: the menu read-out of the hidden units (``menu_readout``), when trained with it
    menu: MenuReadout | None = None
    #: the sub-cell read-out (``sub_readout``), when trained with it
    sub: SubReadout | None = None

    @property
    def hidden(self) -> int:
        return int(self.w0.shape[1])

    def hidden_units(self, features: np.ndarray) -> np.ndarray:
        """[..., hidden] for features [..., 4E] (tanh GELU, as ggml's)."""
        return np.asarray(jax.nn.gelu(jnp.asarray(features @ self.w0 + self.b0)))

    def keys(self, features: np.ndarray) -> np.ndarray:
        """[..., key_dims] for features [..., 4E]."""
        return self.hidden_units(features) @ self.w2 + self.b2


def train_recogniser(data: CellData, *, key_dims: int, hidden: int = 512,
                     updates: int = 1500, seed: int = 0, menu: bool = False,
                     sub_units: int = 0,
                     progress: Callable[[int, float], None] | None = None) -> Recogniser:
    """Train on ``data``'s screens (``SCREENS_PER_UPDATE`` whole screens per update, AdamW
    2e-3 with warmup and cosine decay; the module docstring's terms). ``menu``: also the menu
    flag's read-out (``Recogniser.menu``); ``sub_units`` > 0: also the sub-cell read-out
    with that many units per axis, learning ``data.steps`` (``Recogniser.sub``).
    ``progress(update, loss)`` is called every 250 updates."""
    n_cls = len(data.classes)
    n_screens = len(data.features)
    x_all = data.features.reshape(-1, MERGED_FEATURES)
    y_all = data.labels.reshape(-1)
    mask = content_mask()
    mean = np.where(mask, x_all.mean(0), 0.0)
    inv_std = np.where(mask, 1.0 / (x_all.std(0) + 1e-3), 0.0)
    k = jax.random.split(jax.random.PRNGKey(seed), 2)
    codes = jnp.asarray(spread_codes(n_cls, key_dims, seed))
    params = {"w0": jax.random.normal(k[0], (MERGED_FEATURES, hidden)) * mask.sum() ** -0.5,
              "b0": jnp.zeros(hidden),
              "w2": jax.random.normal(k[1], (hidden, key_dims)) * hidden**-0.5,
              "b2": jnp.zeros(key_dims)}
    if menu:  # only then: without it, the same parameters and loss as before the option
        params |= {"wm": jnp.zeros(hidden), "bm": jnp.zeros(())}
    if sub_units:  # likewise: its own key, drawn only then
        params |= init_sub(jax.random.PRNGKey(seed + 1), MERGED_FEATURES, sub_units,
                           float(mask.sum()))
    freq = np.bincount(y_all, minlength=n_cls) + 1
    weight = jnp.asarray(np.minimum((freq.sum() / freq) ** 0.5, 30.0), jnp.float32)
    mean_j, inv_j = jnp.asarray(mean, jnp.float32), jnp.asarray(inv_std, jnp.float32)
    # each update's screens are gathered here and passed in: closed over, every screen
    # would be compiled into the step as a constant (gigabytes; JAX warns about it)
    screens = data.features.reshape(n_screens, -1, MERGED_FEATURES)
    labels = data.labels.reshape(n_screens, -1)
    menus = data.menu.reshape(n_screens, -1).astype(np.float32)
    steps = data.steps.reshape(n_screens, -1, 2)

    def loss(p, x, y, m, st):  # x [screens, cells, F], y / m [screens, cells], st [.., 2]
        xs = (x - mean_j) * inv_j
        h = jax.nn.gelu(xs @ p["w0"] + p["b0"])
        key = h @ p["w2"] + p["b2"]
        norm = jnp.linalg.norm(key, axis=-1, keepdims=True)
        cos = (key / (norm + 1e-6)) @ codes.T  # [screens, cells, classes]
        lp = jax.nn.log_softmax(cos * (SHARPNESS * KEY_NORM))
        w = weight[y]
        per_cell = -(jnp.take_along_axis(lp, y[..., None], -1)[..., 0] * w).sum() / w.sum()
        member = jax.nn.one_hot(y, n_cls) > 0
        over_cells = jax.nn.log_softmax(cos * LOOKUP_SHARPNESS, axis=1)
        found = jax.nn.logsumexp(jnp.where(member, over_cells, -jnp.inf), axis=1)
        present = member.any(axis=1).at[:, 0].set(False)  # every class on screen but other
        lookup = -jnp.where(present, found, 0.0).sum() / jnp.maximum(present.sum(), 1)
        total = per_cell + lookup + ((norm - 1.0) ** 2).mean()
        if sub_units:
            total = total + sub_loss(p, xs, st, (y > 0).astype(jnp.float32))
        return total + menu_loss(p, h, m) if menu else total

    opt = AdamW(learning_rate=2e-3, b2=0.99, warmup_steps=100, decay_steps=updates,
                min_lr_ratio=0.1, clip_norm=1.0)

    @jax.jit
    def step(state, x, y, m, st):
        val, g = jax.value_and_grad(loss)(state.params, x, y, m, st)
        return apply_updates(state, g, opt)[0], val

    rng = np.random.default_rng(seed)
    state = init_state(params)
    for t in range(1, updates + 1):
        pick = rng.integers(0, n_screens, SCREENS_PER_UPDATE)
        state, val = step(state, screens[pick], labels[pick], menus[pick], steps[pick])
        if progress is not None and (t % 250 == 0 or t == updates):
            progress(t, float(val))
    p = {name: np.asarray(v, np.float64) for name, v in state.params.items()}
    # fold the standardisation into the first layer: ((x - m) * s) @ w0 = x @ (s w0) - (m s) @ w0
    w0 = inv_std[:, None] * p["w0"]
    b0 = p["b0"] - (mean * inv_std) @ p["w0"]
    sample = x_all[rng.integers(0, len(x_all), 4096)]
    h = np.asarray(jax.nn.gelu(jnp.asarray(sample @ w0 + b0)))
    scale = KEY_NORM / np.linalg.norm(h @ p["w2"] + p["b2"], axis=-1).mean()
    readout = (MenuReadout(p["wm"].astype(np.float32), float(p["bm"])) if menu else None)
    sub = export_sub(p, mean, inv_std, x_all) if sub_units else None
    return Recogniser(w0.astype(np.float32), b0.astype(np.float32),
                      (p["w2"] * scale).astype(np.float32), (p["b2"] * scale).astype(np.float32),
                      np.asarray(codes, np.float32), data.classes, readout, sub)


def lookup_accuracy(rec: Recogniser, data: CellData) -> float:
    """Per expert click in ``data``: is the cell whose key is nearest (cosine) the clicked
    class's code a cell of that class? (What the hybrid's lookup can at best find.)"""
    k = rec.keys(data.features)
    scores = (k / np.linalg.norm(k, axis=-1, keepdims=True)) @ rec.codes.T
    right = []
    for n in np.nonzero(data.click_class >= 0)[0]:
        c = data.click_class[n]
        best = np.unravel_index(scores[n, ..., c].argmax(), scores.shape[1:3])
        right.append(data.labels[n][best] == c)
    if not right:
        raise ValueError("no expert clicks in the data")
    return float(np.mean(right))
