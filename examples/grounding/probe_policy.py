"""Issue 21 research: the designed lookup with the *policy* learnt — no class token given.

As ``probe.py`` (designed keys, initialised lookup/copy head, the query scaffold), but the
rows after the screenshot are what an agent with one screenshot sees: the task's instruction,
one ``Step i: <action>`` line per past step (a past click as ``click`` and its cell's two
coordinate tokens, any other action as its Python ``repr`` — not the profile's spelling),
then ``click`` — where x is predicted — and
the x token, where y is. So the model must work out *which* widget the task needs next from
the instruction, the history and the screen; the scaffold asks for that widget's code in
the query dims at both rows.

Run: ``python examples/grounding/probe_policy.py TRAIN.npz EVAL.npz [UPDATES]`` (data from
``cells.py``, which stores each state's step and the episode's actions).
"""

from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import llama_cpp
import numpy as np

from probe import (COLS, CONTENT, KEY, LR, QUERY, ROWS, X_TOK, Y_TOK, constrained, design,
                   forward_reading, hits, image_rows, optimiser, scaffolded_loss,
                   train_recogniser)
from recognise import load
from runtime.train.agents import agent_shape
from runtime.train.optim import apply_updates, init_state
from runtime.train.params import init_params
from vmenv.simdesk.kinds import sample_task, task_kinds

T_MAX = 384
MODEL = "runtime/agent_models/agent-qwen35.gguf"


class Texts:
    def __init__(self) -> None:
        self.llm = llama_cpp.Llama(MODEL, vocab_only=True, verbose=False)
        self.click = self.tok(" click")[0]

    def tok(self, s: str) -> list[int]:
        return self.llm.tokenize(s.encode(), add_bos=False, special=False)


def episode_actions(path: str) -> list[str]:
    return list(np.load(path)["actions"])


def build(rows_img, states, actions, texts: Texts, n_embd):
    """Per click state: rows, the two target tokens, the two rows to read, the target class."""
    kinds = task_kinds()
    n_img = ROWS * COLS
    out_tok, out_emb, out_pos, out_valid, out_sel, out_y, out_cls, out_idx = ([] for _ in range(8))
    for i, (kind, seed, target, tcell, step) in enumerate(states):
        if target <= 0:
            continue
        instruction = sample_task(kinds[kind], int(seed)).instruction
        text = texts.tok("\n" + instruction + "\n")
        for j in range(int(step)):  # the same episode's earlier states are the rows before
            k = i - step + j
            prev = actions[k]
            text += texts.tok(f"Step {j + 1}:")
            if states[k][2] > 0:
                r, c = divmod(int(states[k][3]), COLS)
                text += [texts.click, X_TOK + c, Y_TOK + r]
            else:
                text += texts.tok(" " + prev)
            text += texts.tok("\n")
        r, c = divmod(int(tcell), COLS)
        text += [texts.click, X_TOK + c, Y_TOK + r]
        T = n_img + len(text)
        if T > T_MAX:
            continue
        tok = np.zeros(T_MAX, np.int32)
        tok[n_img:T] = text
        emb = np.zeros((T_MAX, n_embd), np.float32)
        emb[:n_img] = rows_img[i]
        pos = np.zeros((T_MAX, 4), np.int32)
        rr, cc = np.meshgrid(np.arange(ROWS), np.arange(COLS), indexing="ij")
        pos[:n_img, 1], pos[:n_img, 2] = rr.reshape(-1), cc.reshape(-1)
        pos[n_img:, :3] = (COLS + np.arange(T_MAX - n_img))[:, None]
        valid = np.arange(T_MAX) < T
        out_tok.append(tok), out_emb.append(emb), out_pos.append(pos), out_valid.append(valid)
        out_sel.append([T - 3, T - 2])  # "click" predicts x, x predicts y
        out_y.append([X_TOK + c, Y_TOK + r])
        out_cls.append(target)
        out_idx.append(i)
    is_embed = np.zeros((len(out_tok), T_MAX), bool)
    is_embed[:, :n_img] = True
    x = (np.stack(out_tok), np.stack(out_emb), is_embed, np.stack(out_pos), np.stack(out_valid),
         np.array(out_sel, np.int32))
    return x, np.array(out_y, np.int32), np.array(out_cls), np.array(out_idx)


def main() -> None:
    names: list[str] = ["other"]
    ftr, ltr, str_ = load(sys.argv[1], names)
    fev, lev, sev = load(sys.argv[2], names)
    updates = int(sys.argv[3]) if len(sys.argv) > 3 else 1500
    atr, aev = episode_actions(sys.argv[1]), episode_actions(sys.argv[2])
    kinds = task_kinds()
    t0 = time.time()
    recog, code = train_recogniser(ftr, ltr, len(names))
    d = ftr.shape[-1]
    ktr = np.asarray(recog(jnp.asarray(ftr.reshape(-1, d)))).reshape(*ftr.shape[:3], KEY)
    kev = np.asarray(recog(jnp.asarray(fev.reshape(-1, d)))).reshape(*fev.shape[:3], KEY)
    print(f"recogniser {time.time() - t0:.0f}s", flush=True)
    spec = agent_shape("qwen35").spec
    proj = np.random.default_rng(3).normal(0, d**-0.5, (d, QUERY - CONTENT))
    texts = Texts()
    xtr, ytr, ctr, _ = build(image_rows(ktr, ftr, proj, spec.n_embd), str_, atr, texts,
                             spec.n_embd)
    xev, yev, cev, iev = build(image_rows(kev, fev, proj, spec.n_embd), sev, aev, texts,
                             spec.n_embd)
    del ftr, fev
    print(f"{len(ytr)} train clicks, {len(yev)} held-out", flush=True)
    params = design(init_params(spec, seed=0), spec, code, len(names), True)
    state = init_state(params)
    opt = optimiser(LR, updates)

    def seq(p, tok, emb, ise, pos, valid, sel):
        return forward_reading(p, spec, tok, emb, ise, pos, valid, sel)

    batched = jax.vmap(seq, in_axes=(None, 0, 0, 0, 0, 0, 0))

    def loss(p, x, y, cls):
        return scaffolded_loss(*batched(p, *x), y, cls, code)

    @jax.jit
    def step(state, x, y, cls):
        (val, cosine), g = jax.value_and_grad(loss, has_aux=True)(state.params, x, y, cls)
        return apply_updates(state, g, opt)[0], val, cosine

    def predict_both(p, x):
        logits, seen = batched(p, *x)
        # which class the query at the x row asks for: its nearest code
        asked = (seen[:, 0, QUERY:QUERY + KEY] @ jnp.asarray(code).T).argmax(-1)
        return constrained(logits), asked

    predict = jax.jit(predict_both)
    rng = np.random.default_rng(0)
    t0 = time.time()
    for t in range(1, updates + 1):
        i = rng.integers(0, len(ytr), 4)
        state, val, cosine = step(state, tuple(jnp.asarray(a[i]) for a in xtr),
                                  jnp.asarray(ytr[i]), jnp.asarray(ctr[i]))
        if t % 250 == 0 or t == updates:
            outs = [predict(state.params, tuple(jnp.asarray(a[s:s + 16]) for a in xev))
                    for s in range(0, len(yev), 16)]
            pred = np.concatenate([np.asarray(o[0]) for o in outs])
            asked = np.concatenate([np.asarray(o[1]) for o in outs])
            hit = hits(pred, iev, lev, sev)
            print(f"{t:5d} {time.time() - t0:5.0f}s loss {float(val):.3f} query cos "
                  f"{float(cosine):.2f}  x {(pred[:, 0] == yev[:, 0]).mean():.3f}  y "
                  f"{(pred[:, 1] == yev[:, 1]).mean():.3f}  hit {hit.mean():.3f}  asked the "
                  f"right widget {(asked == cev).mean():.3f}", flush=True)
            per_kind = {}
            for n, i in enumerate(iev):
                a, b = per_kind.get(kinds[sev[i][0]], (0, 0))
                per_kind[kinds[sev[i][0]]] = (a + hit[n], b + 1)
            print("      " + "  ".join(f"{k} {a}/{b}" for k, (a, b) in per_kind.items()),
                  flush=True)


if __name__ == "__main__":
    main()
