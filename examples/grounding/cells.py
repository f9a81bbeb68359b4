"""Issue 21 research: per-cell data from simdesk on the vision encoder's grid.

At 640x384 simdesk's layout unit is 16 px (``placement.unit_for``), the encoder's patch size,
and mtmd does not resize (both sides are multiples of 32), so every widget sits at the same
sub-cell offset wherever the layout puts it.  For every state of the expert's episodes this
writes, per merged 32x32 cell (20 x 12 of them):

* ``features``: what the designed projector's conv computes per cell — each 16x16 patch's
  luminance at 2x2-pixel resolution (64 values) and mean colour (3), for the 4 patches;
* ``label``: the class of the widget a click at the cell's centre reaches (``widgets.hit``):
  launchers, menu entries, dialog and recall buttons (of every app, decoys included) and the
  Notes and Terminal windows' parts by name; everything else is ``other``;
* per state: the task kind's index and seed, the expert's click (if the action is a click:
  the target class and the cell the click falls in; else -1), the step's index in its
  episode, and the expert's action there as its ``repr`` (``actions``, one per state).

Run: ``python examples/grounding/cells.py OUT.npz N_EPISODES SPLIT`` (SPLIT train | eval).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from vmenv.actions import Click
from vmenv.simdesk.demos import demonstration
from vmenv.simdesk.kinds import sample_task, task_kinds
from vmenv.simdesk.seeds import eval_seeds, train_seeds
from vmenv.simdesk.render import render
from vmenv.simdesk.widgets import hit_in, widgets

W, H, CELL, PATCH, POOL = 640, 384, 32, 16, 2
LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def widget_class(name: str | None) -> str:
    """A widget's class: its name for launchers (one class per app and style), menu
    entries, dialog and recall buttons and the Notes / Terminal windows' parts; ``other``
    for the bare desktop, the taskbar and decoy windows."""
    if name is not None and name.startswith(("icon.", "desk.", "menu.", "dialog.", "recall.",
                                             "notes.", "terminal.")):
        return name
    return "other"


def cell_features(img: np.ndarray) -> np.ndarray:
    """[rows, cols, 4 * 67]: per cell, its 4 patches' pooled luminance and mean colour."""
    rgb = img.astype(np.float32) / 255.0
    lum = rgb @ LUMA
    h, w = lum.shape
    pooled = lum.reshape(h // POOL, POOL, w // POOL, POOL).mean(axis=(1, 3))
    side = PATCH // POOL
    # patches: [ph, pw, side, side]
    pl = pooled.reshape(h // PATCH, side, w // PATCH, side).transpose(0, 2, 1, 3)
    pl = pl.reshape(h // PATCH, w // PATCH, side * side)
    col = rgb.reshape(h // PATCH, PATCH, w // PATCH, PATCH, 3).mean(axis=(1, 3))
    patch = np.concatenate([pl, col], axis=-1)  # [ph, pw, 67]
    ph, pw = h // PATCH, w // PATCH
    cells = patch.reshape(ph // 2, 2, pw // 2, 2, -1).transpose(0, 2, 1, 3, 4)
    return cells.reshape(ph // 2, pw // 2, -1)


def main(out: str, n: int, split: str) -> None:
    seeds = train_seeds() if split == "train" else iter(eval_seeds(10 * n))
    kinds = task_kinds()
    feats, labels, states, actions = [], [], [], []
    classes: dict[str, int] = {"other": 0}
    count = 0
    for seed, kind in zip(seeds, itertools.cycle(kinds)):
        if count >= n:
            break
        task = sample_task(kind, seed)
        try:
            demo = demonstration(task, W, H)
        except Exception as exc:  # noqa: BLE001 - research script: skip a bad draw
            print("skip", kind, seed, exc)
            continue
        count += 1
        for n_step, step in enumerate(demo):
            img = np.asarray(render(step.state).convert("RGB"))
            ws = widgets(step.state)
            rows, cols = H // CELL, W // CELL
            lab = np.zeros((rows, cols), np.int32)
            for r in range(rows):
                for c in range(cols):
                    w = hit_in(ws, c * CELL + CELL // 2, r * CELL + CELL // 2)
                    name = widget_class(w.name if w else None)
                    lab[r, c] = classes.setdefault(name, len(classes))
            target, tcell = -1, -1
            if isinstance(step.action, Click):
                x, y = step.action.x, step.action.y
                w = hit_in(ws, x, y)
                target = classes.setdefault(widget_class(w.name if w else None), len(classes))
                tcell = (y // CELL) * cols + x // CELL
            feats.append(cell_features(img))
            labels.append(lab)
            states.append((kinds.index(kind), seed, target, tcell, n_step))
            actions.append(repr(step.action))
        if count % 20 == 0:
            print(f"{count}/{n} episodes, {len(feats)} screens", flush=True)
    np.savez_compressed(out, features=np.stack(feats).astype(np.float16),
                        labels=np.stack(labels), states=np.array(states, np.int64),
                        classes=np.array(list(classes)), actions=np.array(actions))
    print("classes", list(classes))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
