"""Issue 21 research: can a per-cell MLP (what the projector's ``mm.0`` / ``mm.2`` hold) tell
which widget a cell belongs to, on the grid layout?

Reads ``cells.py``'s train and eval files, trains ``features -> GELU(W0 x + b0) -> W2 h + b2``
over the widget classes, and reports on the held-out screens:
* cell accuracy on cells of a clickable class (not ``other``), and the ``other`` cells' rate of
  being taken for a clickable class;
* **lookup**: for every expert click, the cell with the highest probability of the clicked
  class — is it a cell of that class (a click at its centre reaches the widget)?

Run: ``python examples/grounding/recognise.py TRAIN.npz EVAL.npz [UPDATES] [HIDDEN] [CONTEXT]``.
CONTEXT=1 also gives each cell its left and right neighbours' features (what a block that
mixes neighbouring cells would see; the plain merger sees only its own cell).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from runtime.train.optim import AdamW, apply_updates, init_state


def canonical(name: str) -> str:
    """With ``MERGE_LAUNCHERS=1`` an app's taskbar button and desktop icon are one class
    (``launch.<app>``): a task names the app, not the launcher's style."""
    if os.environ.get("MERGE_LAUNCHERS") == "1" and name.startswith(("icon.", "desk.")):
        return "launch." + name.split(".", 1)[1]
    return name


def load(path: str, names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = np.load(path)
    own = [canonical(str(n)) for n in d["classes"]]
    for n in own:
        if n not in names:
            names.append(n)
    remap = np.array([names.index(n) for n in own], np.int32)
    states = d["states"].copy()
    states[:, 2] = np.where(states[:, 2] >= 0, remap[np.maximum(states[:, 2], 0)], -1)
    return d["features"].astype(np.float32), remap[d["labels"]], states


def with_context(f: np.ndarray) -> np.ndarray:
    left = np.concatenate([np.zeros_like(f[:, :, :1]), f[:, :, :-1]], axis=2)
    right = np.concatenate([f[:, :, 1:], np.zeros_like(f[:, :, :1])], axis=2)
    return np.concatenate([f, left, right], axis=-1)


def main() -> None:
    names: list[str] = ["other"]
    ftr, ltr, _ = load(sys.argv[1], names)
    fev, lev, sev = load(sys.argv[2], names)
    updates = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    hidden = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    if len(sys.argv) > 5 and sys.argv[5] == "1":
        ftr, fev = with_context(ftr), with_context(fev)
    n_cls, d_in = len(names), ftr.shape[-1]
    print(f"{ftr.shape[0]} train screens, {fev.shape[0]} eval screens, {n_cls} classes, "
          f"{d_in} features", flush=True)
    xtr, ytr = ftr.reshape(-1, d_in), ltr.reshape(-1)
    mean, std = xtr.mean(0), xtr.std(0) + 1e-3
    key = jax.random.PRNGKey(0)
    k0, k2 = jax.random.split(key)
    params = {"w0": jax.random.normal(k0, (d_in, hidden)) * d_in**-0.5,
              "b0": jnp.zeros(hidden),
              "w2": jax.random.normal(k2, (hidden, n_cls)) * hidden**-0.5,
              "b2": jnp.zeros(n_cls)}

    def logits(p, x):
        h = jax.nn.gelu((x - mean) / std @ p["w0"] + p["b0"])
        return h @ p["w2"] + p["b2"]

    # clickable cells are rare: weight them up so the classifier does not just say "other"
    freq = np.bincount(ytr, minlength=n_cls) + 1
    weight = jnp.asarray(np.minimum((freq.sum() / freq) ** 0.5, 30.0), jnp.float32)

    def loss(p, x, y):
        lp = jax.nn.log_softmax(logits(p, x))
        nll = -jnp.take_along_axis(lp, y[:, None], axis=1)[:, 0]
        w = weight[y]
        return (nll * w).sum() / w.sum()

    # the trainer's AdamW: warmup 200, cosine to zero, no clipping
    opt = AdamW(learning_rate=2e-3, b2=0.99, warmup_steps=200, decay_steps=updates,
                min_lr_ratio=0.0, clip_norm=None)

    @jax.jit
    def step(state, x, y):
        return apply_updates(state, jax.grad(loss)(state.params, x, y), opt)[0]

    predict = jax.jit(lambda p, x: jax.nn.softmax(logits(p, x)))
    rng = np.random.default_rng(0)
    state = init_state(params)
    t0 = time.time()
    for t in range(1, updates + 1):
        idx = rng.integers(0, len(ytr), 4096)
        state = step(state, jnp.asarray(xtr[idx]), jnp.asarray(ytr[idx]))
        if t % 500 == 0 or t == updates:
            report(t, time.time() - t0, names, predict, state.params, fev, lev, sev)


def report(t, secs, names, predict, params, fev, lev, sev) -> None:
    n, rows, cols, d = fev.shape
    prob = np.asarray(predict(params, jnp.asarray(fev.reshape(-1, d)))).reshape(n, rows, cols, -1)
    pred = prob.argmax(-1)
    click = lev > 0
    acc = (pred[click] == lev[click]).mean()
    false_click = (pred[~click] > 0).mean()
    hits, total, per = 0, 0, {}
    for i, (_, _, target, _) in enumerate(sev):
        if target <= 0:
            continue
        best = np.unravel_index(prob[i, :, :, target].argmax(), (rows, cols))
        ok = lev[i][best] == target
        hits += ok
        total += 1
        name = names[target].split(".")[0] + "." + names[target].split(".")[1][:8]
        a, b = per.get(name, (0, 0))
        per[name] = (a + ok, b + 1)
    worst = sorted(per.items(), key=lambda kv: kv[1][0] / kv[1][1])[:6]
    print(f"{t:5d} {secs:6.0f}s  cell acc {acc:.3f}  other->click {false_click:.4f}  "
          f"lookup {hits}/{total} = {hits / max(total, 1):.3f}  worst "
          + " ".join(f"{k}:{a}/{b}" for k, (a, b) in worst), flush=True)


if __name__ == "__main__":
    main()
