"""Issue 21 research: grounding with *designed keys* — the recognised widget class as a clean
code in the image row, matched by an initialised query/key pair, with an initialised copy of
the cell's position code (the agents' qwen35 shape, ``runtime.train.model.forward``).

Per held-out expert click on the grid layout (``cells.py``): rows = the screenshot's 240 cells,
then ``"\\n" <class> <x> <y>`` — the clicked widget's class as one token, then one token per
coordinate (the cell's column, the cell's row). The image row of a cell is
``[key | position | content]``:

* key (dims 0..35): the output of a per-cell MLP over the designed projector's features,
  trained first as a classifier whose logits are ``key · code[class]`` (``code``: fixed random
  unit vectors), then frozen; the class tokens' embeddings carry ``code[class]`` in dims of
  their own (``QUERY``..: in the key dims a class token's key would match its own query);
* position (dims 36..67): the column one-hot (20) and row one-hot (12), scaled; the x and y
  tokens' embeddings are the same one-hots, so the tied LM head reads a copied code directly;
* content (dims 68..): a fixed random projection of the features (what the model would also
  see), small.

The last attention layer's first KV head is initialised to look up and copy: its query reads
the query dims and its key the key dims (both into the head's unrotated dims, so position
does not enter); the query scaffold asks for the target's code in the query dims; its value
reads the position dims and its output writes them back. Everything is then trained.

Reported on held-out screens: x / y / both right, and **hit** — the predicted cell's centre
reaches the target widget (what a click needs).

Run: ``python examples/grounding/probe.py TRAIN.npz EVAL.npz [UPDATES] [INIT]`` (INIT 0: the
forge's random init everywhere, the control).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from runtime.train import attention, rope
from runtime.train.agents import agent_shape
from runtime.train.model import ForwardOptions, _block, project
from runtime.train.numerics import rms_norm
from runtime.train.optim import AdamW, apply_updates, init_state
from runtime.train.params import init_params

from recognise import load  # noqa: E402  (same folder)

KEY, POS, CONTENT = 36, 32, 68
QUERY = 156  # the class tokens' code lives in dims QUERY.. (not the key dims: no self-match)
COLS, ROWS = 20, 12
AUX = float(os.environ.get("AUX", "1.0"))  # the query scaffold's weight
LR = float(os.environ.get("LR", "1e-3"))
#: ``TIE_Y=1``: y is looked up by a second head whose key also carries the cell's column and
#: whose query, at the x token's row, also carries the chosen x — so y comes from a cell of the
#: instance x was copied from when a class has two instances on screen (Terminal's two
#: launchers).  Head 0 then copies the column only and the second head the row only.
TIE_Y = os.environ.get("TIE_Y") == "1"
Y_CODE = 16  # the class code's projection the y head matches (its other 20 dims: the column)
CLASS_TOK, X_TOK, Y_TOK, NL_TOK = 1000, 1100, 1120, 13


def train_recogniser(ftr, ltr, n_cls, updates=None):
    updates = updates or int(os.environ.get("RECOG", "1500"))
    d_in = ftr.shape[-1]
    x_all, y_all = ftr.reshape(-1, d_in), ltr.reshape(-1)
    mean, std = x_all.mean(0), x_all.std(0) + 1e-3
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    code = jax.random.normal(k[2], (n_cls, KEY))
    code = code / jnp.linalg.norm(code, axis=1, keepdims=True)
    p = {"w0": jax.random.normal(k[0], (d_in, 512)) * d_in**-0.5, "b0": jnp.zeros(512),
         "w2": jax.random.normal(k[1], (512, KEY)) * 512**-0.5, "b2": jnp.zeros(KEY)}

    def out(p, x):
        return jax.nn.gelu((x - mean) / std @ p["w0"] + p["b0"]) @ p["w2"] + p["b2"]

    freq = np.bincount(y_all, minlength=n_cls) + 1
    weight = jnp.asarray(np.minimum((freq.sum() / freq) ** 0.5, 30.0), jnp.float32)

    def loss(p, x, y):
        lp = jax.nn.log_softmax(out(p, x) @ code.T * 8.0)
        w = weight[y]
        return -(jnp.take_along_axis(lp, y[:, None], 1)[:, 0] * w).sum() / w.sum()

    opt = optimiser(2e-3, updates)

    @jax.jit
    def step(state, x, y):
        return apply_updates(state, jax.grad(loss)(state.params, x, y), opt)[0]

    rng = np.random.default_rng(0)
    state = init_state(p)
    for _ in range(updates):
        i = rng.integers(0, len(y_all), 4096)
        state = step(state, jnp.asarray(x_all[i]), jnp.asarray(y_all[i]))
    return jax.jit(lambda x: out(state.params, x)), code


def forward_reading(p, spec, tok, emb, ise, pos, valid, select):
    """Logits at the rows ``select``, and the lookup layer's input there: the forward of
    ``runtime.train.model``, unrolled to read the residual on the way."""
    lookup_layer = max(i for i in range(spec.n_layer) if spec.is_attention(i))
    h = jnp.where(ise[:, None], emb, p["token_embd.weight"][tok])
    cos, sin = rope.angles(pos, spec)
    visible = attention.visibility(pos, valid)
    seen = None
    for il in range(spec.n_layer):
        if il == lookup_layer:
            seen = h[select]
        h = _block(p, il, h, cos, sin, visible, spec, ForwardOptions())
    return project(p, rms_norm(h[select], p["output_norm.weight"], spec.rms_eps)), seen


def scaffolded_loss(logits, seen, y, cls, code):
    """Cross-entropy of the coordinate tokens plus the query scaffold: the lookup layer's
    input should carry the target's code in the query dims at both coordinate rows (1 −
    cosine; the head RMS-norms its query anyway).  Returns (loss, mean cosine)."""
    lp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(lp, y[..., None], -1).mean()
    qv = seen[..., QUERY:QUERY + KEY]
    want = jnp.asarray(code)[cls][:, None, :]
    cosine = (qv * want).sum(-1) / (jnp.linalg.norm(qv, axis=-1) + 1e-6)
    return nll + AUX * (1.0 - cosine).mean(), cosine.mean()


def optimiser(lr: float, updates: int) -> AdamW:
    """The trainer's AdamW as the probes use it: warmup 100, cosine to a tenth, clip 1."""
    return AdamW(learning_rate=lr, b2=0.99, warmup_steps=100, decay_steps=updates,
                 min_lr_ratio=0.1, clip_norm=1.0)


def hits(pred, iev, lev, sev) -> np.ndarray:
    """Per example: does the predicted cell's centre reach the target widget?"""
    px = np.clip(pred[:, 0] - X_TOK, 0, COLS - 1)
    py = np.clip(pred[:, 1] - Y_TOK, 0, ROWS - 1)
    return np.array([lev[i][py[n], px[n]] == sev[i][2] for n, i in enumerate(iev)])


def image_rows(keys, feats, proj, n_embd, pos_scale=3.0, content_scale=0.3):
    n = keys.shape[0]
    rows = np.zeros((n, ROWS, COLS, n_embd), np.float32)
    kn = keys / (np.linalg.norm(keys, axis=-1, keepdims=True) + 1e-6)
    rows[..., :KEY] = kn * 3.0
    for r in range(ROWS):
        for c in range(COLS):
            rows[:, r, c, KEY + c] = pos_scale
            rows[:, r, c, KEY + COLS + r] = pos_scale
    rows[..., CONTENT:QUERY] = content_scale * np.tanh(feats @ proj)
    return rows.reshape(n, ROWS * COLS, n_embd)


def design(params, spec, code, n_cls, on: bool):
    p = {k: np.array(v) for k, v in params.items()}
    e = p["token_embd.weight"]
    rng = np.random.default_rng(2)
    for c in range(n_cls):
        e[CLASS_TOK + c] = 0.05 * rng.normal(size=spec.n_embd)
        e[CLASS_TOK + c, QUERY:QUERY + KEY] = np.asarray(code[c]) * 3.0
    for c in range(COLS):
        e[X_TOK + c] = 0.05 * rng.normal(size=spec.n_embd)
        e[X_TOK + c, KEY + c] = 3.0
    for r in range(ROWS):
        e[Y_TOK + r] = 0.05 * rng.normal(size=spec.n_embd)
        e[Y_TOK + r, KEY + COLS + r] = 3.0
    if on:
        il = max(i for i in range(spec.n_layer) if spec.is_attention(i))
        hd, rot, pre = spec.head_dim, spec.rope_dims, f"blk.{il}"
        free = hd - rot  # unrotated dims of a head: rot..hd
        q, k = p[f"{pre}.attn_q.weight"], p[f"{pre}.attn_k.weight"]
        v, o = p[f"{pre}.attn_v.weight"], p[f"{pre}.attn_output.weight"]
        q[:2 * hd] = 0.0  # head 0: query and gate
        k[:hd] = 0.0
        v[:hd] = 0.0
        o[:, :hd] = 0.0
        q[rot:rot + min(free, KEY), QUERY:QUERY + KEY] = np.eye(min(free, KEY), KEY)
        k[rot:rot + min(free, KEY), :KEY] = np.eye(min(free, KEY), KEY)
        copied = COLS if TIE_Y else POS  # head 0 copies the column (and the row, untied)
        v[:copied, KEY:KEY + copied] = np.eye(copied)
        o[KEY:KEY + copied, :copied] = 2.0 * 4.0 * np.eye(copied)  # x2 for sigmoid(0) = 0.5
        if TIE_Y:
            design_y_head(q, k, v, o, spec)
        p[f"{pre}.attn_q_norm.weight"][rot:] = 2.5
        p[f"{pre}.attn_k_norm.weight"][rot:] = 2.5
    return {k: jnp.asarray(v) for k, v in p.items()}


def design_y_head(q, k, v, o, spec) -> None:
    """Query head 2 (KV head 1) of the lookup layer: key = the cell's class key projected to
    ``Y_CODE`` dims and its column one-hot; query = the class query projected the same way
    and the column one-hot of the x token (its embedding carries it in the same dims as an
    image row's column); value/output copy the row one-hot.  The class half is weighted 1.5
    against the column's 1, so the right instance (both) beats a same-column cell of another
    class and a same-class cell in another column."""
    hd, rot = spec.head_dim, spec.rope_dims
    groups = spec.n_head // spec.n_head_kv
    qh, kh = groups, 1  # the first query head of KV head 1
    basis = np.linalg.qr(np.random.default_rng(4).normal(size=(KEY, KEY)))[0][:Y_CODE]
    project = basis * 1.5 * (KEY / Y_CODE) ** 0.5  # a projected unit code keeps norm ~1.5
    qs, ks = slice(2 * hd * qh, 2 * hd * (qh + 1)), slice(hd * kh, hd * (kh + 1))
    q[qs], k[ks], v[ks], o[:, hd * qh:hd * (qh + 1)] = 0.0, 0.0, 0.0, 0.0
    q0, k0 = 2 * hd * qh + rot, hd * kh + rot
    q[q0:q0 + Y_CODE, QUERY:QUERY + KEY] = project
    k[k0:k0 + Y_CODE, :KEY] = project
    q[q0 + Y_CODE:q0 + Y_CODE + COLS, KEY:KEY + COLS] = np.eye(COLS)
    k[k0 + Y_CODE:k0 + Y_CODE + COLS, KEY:KEY + COLS] = np.eye(COLS)
    v[hd * kh:hd * kh + ROWS, KEY + COLS:KEY + POS] = np.eye(ROWS)
    o[KEY + COLS:KEY + POS, hd * qh:hd * qh + ROWS] = 2.0 * 4.0 * np.eye(ROWS)


def build(rows_img, states, n_embd, mask):
    """Rows for the click examples: image rows then \\n, class, x, y; targets at 3 rows."""
    idx = np.nonzero(mask)[0]
    n_img = ROWS * COLS
    T = n_img + 4
    tokens = np.zeros((len(idx), T), np.int32)
    embeds = np.zeros((len(idx), T, n_embd), np.float32)
    is_embed = np.zeros((len(idx), T), bool)
    positions = np.zeros((len(idx), T, 4), np.int32)
    rr, cc = np.meshgrid(np.arange(ROWS), np.arange(COLS), indexing="ij")
    positions[:, :n_img, 1] = rr.reshape(-1)
    positions[:, :n_img, 2] = cc.reshape(-1)
    for j in range(4):
        positions[:, n_img + j, :3] = COLS + j
    targets = np.zeros((len(idx), 2), np.int32)
    for n, i in enumerate(idx):
        target, tcell = states[i][2], states[i][3]
        r, c = divmod(int(tcell), COLS)
        embeds[n, :n_img] = rows_img[i]
        is_embed[n, :n_img] = True
        tokens[n, n_img:] = [NL_TOK, CLASS_TOK + target, X_TOK + c, Y_TOK + r]
        targets[n] = [X_TOK + c, Y_TOK + r]
    return (tokens, embeds, is_embed, positions), targets, idx


def main() -> None:
    names: list[str] = ["other"]
    ftr, ltr, str_ = load(sys.argv[1], names)
    fev, lev, sev = load(sys.argv[2], names)
    updates = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
    init_on = (sys.argv[4] != "0") if len(sys.argv) > 4 else True
    n_cls = len(names)
    t0 = time.time()
    recog, code = train_recogniser(ftr, ltr, n_cls)
    d = ftr.shape[-1]
    ktr = np.asarray(recog(jnp.asarray(ftr.reshape(-1, d)))).reshape(*ftr.shape[:3], KEY)
    kev = np.asarray(recog(jnp.asarray(fev.reshape(-1, d)))).reshape(*fev.shape[:3], KEY)
    pred_ev = (kev @ np.asarray(code).T).argmax(-1)
    click = lev > 0
    print(f"recogniser {time.time() - t0:.0f}s: held-out cell acc "
          f"{(pred_ev[click] == lev[click]).mean():.3f}", flush=True)
    spec = agent_shape("qwen35").spec
    proj = np.random.default_rng(3).normal(0, d**-0.5, (d, QUERY - CONTENT))
    rtr = image_rows(ktr, ftr, proj, spec.n_embd)
    rev = image_rows(kev, fev, proj, spec.n_embd)
    xtr, ytr, itr = build(rtr, str_, spec.n_embd, (str_[:, 2] > 0))
    ctr = str_[itr, 2]
    xev, yev, iev = build(rev, sev, spec.n_embd, (sev[:, 2] > 0))
    print(f"{len(ytr)} train clicks, {len(yev)} held-out", flush=True)
    params = design(init_params(spec, seed=0), spec, code, n_cls, init_on)
    n_img = ROWS * COLS
    select = jnp.array([n_img + 1, n_img + 2])

    def seq_logits(p, tok, emb, ise, pos):
        return forward_reading(p, spec, tok, emb, ise, pos, jnp.ones(tok.shape[0], bool),
                               select)

    batched = jax.vmap(seq_logits, in_axes=(None, 0, 0, 0, 0))

    def loss(p, x, y, cls):
        return scaffolded_loss(*batched(p, *x), y, cls, code)[0]

    state = init_state(params)
    opt = optimiser(LR, updates)

    @jax.jit
    def step(state, x, y, cls):
        val, g = jax.value_and_grad(loss)(state.params, x, y, cls)
        return apply_updates(state, g, opt)[0], val

    predict = jax.jit(lambda p, x: constrained(batched(p, *x)[0]))
    evaluate(0, 0.0, 0.0, predict, params, xev, yev, iev, lev, sev)
    rng = np.random.default_rng(0)
    B = 4
    t0 = time.time()
    for t in range(1, updates + 1):
        i = rng.integers(0, len(ytr), B)
        state, val = step(state, tuple(jnp.asarray(a[i]) for a in xtr), jnp.asarray(ytr[i]),
                          jnp.asarray(ctr[i]))
        if t % 250 == 0 or t == updates:
            evaluate(t, time.time() - t0, float(val), predict, state.params, xev, yev, iev, lev,
                     sev)


def constrained(logits):
    """argmax of x among the x tokens and of y among the y tokens (the grammar's role)."""
    x = logits[:, 0, X_TOK:X_TOK + COLS].argmax(-1) + X_TOK
    y = logits[:, 1, Y_TOK:Y_TOK + ROWS].argmax(-1) + Y_TOK
    return jnp.stack([x, y], axis=1)


def evaluate(t, secs, val, predict, params, xev, yev, iev, lev, sev) -> None:
    preds = []
    for s in range(0, len(yev), 16):
        preds.append(np.asarray(predict(params, tuple(jnp.asarray(a[s:s + 16]) for a in xev))))
    pred = np.concatenate(preds)
    xok, yok = pred[:, 0] == yev[:, 0], pred[:, 1] == yev[:, 1]
    hit = hits(pred, iev, lev, sev)
    print(f"{t:5d} {secs:5.0f}s loss {val:.3f}  x {xok.mean():.3f}  y {yok.mean():.3f}  "
          f"both {(xok & yok).mean():.3f}  hit {hit.mean():.3f}", flush=True)


if __name__ == "__main__":
    main()
