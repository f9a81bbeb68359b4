"""Issue 21 diagnosis: a trained agent's click coordinates, teacher-forced on a dataset's click
examples — with the query the model itself writes, and with the *oracle* query (the clicked
class's code written into the lookup layer's query dims at the x and y rows) — overall and per
clicked class.  Separates "asks for the wrong widget" (own < oracle) from "the lookup cannot
pick the cell" (both low), docs/training.md "What fails now".

    python examples/grounding/forced_clicks.py AGENT.gguf OUT/data [N_CLICKS]

``OUT`` is a ``kvagent train --out`` directory (its recipe.json names the recogniser's classes;
the class codes are the recogniser's, rebuilt from seed 0 as ``train_recogniser`` makes them).
"""
import json, sys
import numpy as np, jax, jax.numpy as jnp
from pathlib import Path
from runtime.train.gguf_io import load_gguf
from runtime.train.dataset import shards
from runtime.train.fit import StoredImages, row_buckets
from runtime.train.example import build_example, collate, bucket_for
from runtime.train.model import _block, lookup_layer, project
from runtime.train import rope, attention
from runtime.train.numerics import rms_norm
from runtime.train.agents import agent_vocab, X_PIECES, Y_PIECES
from runtime.train.grounding import piece_ids
from runtime.train.codes import spread_codes
from runtime.train.cell_vision import KEY_DIMS
from runtime.train.model import ForwardOptions

model, data = sys.argv[1], Path(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 60
rec = json.load(open(Path(data).parent / "recipe.json"))["mmproj"]["recogniser"]["classes"]
codes = spread_codes(len(rec), KEY_DIMS, 0)
code_of = dict(zip(rec, codes))
lm = load_gguf(model); spec, p = lm.spec, {k: jnp.asarray(v) for k, v in lm.params.items()}
v = agent_vocab()
xs, ys = np.array(piece_ids(v.tokens, X_PIECES)), np.array(piece_ids(v.tokens, Y_PIECES))
L = lookup_layer(spec); opts = ForwardOptions()

@jax.jit
def run(rows, inject, code):
    h = jnp.where(rows.is_embed[:, None], rows.embeds, p["token_embd.weight"][rows.tokens])
    cos, sin = rope.angles(rows.positions, spec)
    vis = attention.visibility(rows.positions, rows.valid)
    for il in range(spec.n_layer):
        if il == L:
            h = h.at[:, -36:].set(jnp.where(inject[:, None], 3.0 * code[None], h[:, -36:]))
        h = _block(p, il, h, cos, sin, vis, spec, opts)
    return project(p, rms_norm(h, p["output_norm.weight"], spec.rms_eps))

loaded = list(shards(data))
images = StoredImages(loaded, uses_mrope=spec.is_hybrid, n_embd=spec.n_embd)
stats = {"own": [0, 0, 0], "oracle": [0, 0, 0]}
by_class = {}
seen = 0
for sh in loaded:
    for e in range(len(sh)):
        cl = str(sh.meta(e)["clicked"])
        if not cl or cl not in code_of or seen >= n: continue
        seen += 1
        ex = build_example(images, sh.pieces(e))
        b = collate([ex], bucket_for(ex.n_rows, row_buckets(ex.n_rows)))
        rows = jax.tree.map(lambda a: a[0], b.rows)
        t = np.asarray(b.targets[0]); m = np.asarray(b.loss_mask[0]) > 0
        xr = np.flatnonzero(m & np.isin(t, xs)); yr = np.flatnonzero(m & np.isin(t, ys))
        if not len(xr) or not len(yr): continue
        xr, yr = xr[-1], yr[-1]
        inject = np.zeros(len(t), bool); inject[[xr, yr]] = True
        for mode in ("own", "oracle"):
            lg = np.asarray(run(rows, jnp.asarray(inject & (mode == "oracle")), jnp.asarray(code_of[cl])))
            xok = xs[lg[xr][xs].argmax()] == t[xr] and lg[xr].argmax() == t[xr]
            yok = ys[lg[yr][ys].argmax()] == t[yr]
            stats[mode][0] += 1; stats[mode][1] += xok; stats[mode][2] += yok
            if mode == "own": by_class.setdefault(cl, []).append(int(xok and yok))
for mode, (c, x, y) in stats.items():
    print(f"{mode}: {c} clicks, x {x/c:.2f}, y {y/c:.2f}")
print(sorted(((k, f"{sum(v)}/{len(v)}") for k, v in by_class.items()), key=lambda z: -len(by_class[z[0]])))
