"""How long one training step takes: forward + backward (+ AdamW) of the shipping step.

``python -m runtime.train.bench [--arch qwen35] [--rows 1000,2000] [--embd 256] [--layers 6]``
builds a model of the given size (``bench_spec``), random rows with an image-like block of
embedding rows, and times ``make_train_step``'s jitted step (the code that trains, not a
copy): compile once, then the minimum over ``--repeats`` runs (the machine is shared;
the minimum is the least disturbed run).  Prints one JSON line per row count.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.example import Batch
from runtime.train.model import ForwardOptions, Rows
from runtime.train.optim import AdamW, init_state, make_train_step
from runtime.train.params import count_params, init_params


def bench_spec(arch: str, n_embd: int = 256, n_layer: int = 6, n_vocab: int = 2048) -> TextSpec:
    """A trainer-sized model: head_dim 64, FFN 2·n_embd, qwen35 with attention every 3rd
    layer and 64-wide delta-net heads (n_embd/64 value heads, half as many key heads)."""
    heads = max(1, n_embd // 64)
    spec = TextSpec(arch=arch, size=f"bench-{n_embd}x{n_layer}", n_vocab=n_vocab,
                    n_embd=n_embd, n_layer=n_layer, n_head=heads, n_head_kv=max(1, heads // 2),
                    head_dim=64, n_ff=2 * n_embd,
                    rope_freq_base=10_000.0 if arch == "llama" else 1_000_000.0)
    if arch == "qwen35":
        import attrs

        spec = attrs.evolve(spec, full_attention_interval=3, ssm_state=64,
                            ssm_groups=max(1, heads // 2), ssm_v_heads=heads)
    return spec


def bench_batch(spec: TextSpec, n_rows: int, image_rows: int = 0, seed: int = 0) -> Batch:
    """One sequence of ``n_rows`` rows; ``image_rows`` of them an embedding block laid out like
    a screenshot (M-RoPE grid positions on qwen35), the last 32 trained."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, spec.n_vocab, n_rows).astype(np.int32)
    is_embed = np.zeros(n_rows, dtype=bool)
    is_embed[8: 8 + image_rows] = True
    embeds = (rng.standard_normal((n_rows, spec.n_embd)) * 0.05).astype(np.float32)
    cols = 4 if spec.is_hybrid else 1
    positions = np.zeros((n_rows, cols), dtype=np.int32)
    side = max(1, int(np.sqrt(image_rows)))
    pos = 0
    for i in range(n_rows):
        if is_embed[i] and cols == 4:
            r, c = divmod(i - 8, side)
            positions[i] = (8, 8 + r, 8 + c, 0)
            pos = 8 + max(side, -(-image_rows // side))
        else:
            positions[i] = pos if cols == 1 else (pos, pos, pos, 0)
            pos += 1
    mask = np.zeros((1, n_rows), dtype=np.float32)
    mask[0, -32:] = 1.0
    rows = Rows(*(jnp.asarray(a[None]) for a in
                  (tokens, embeds, is_embed, positions, np.ones(n_rows, dtype=bool))))
    return Batch(rows, jnp.asarray(np.roll(tokens, -1)[None]), jnp.asarray(mask))


def time_step(spec: TextSpec, n_rows: int, *, repeats: int = 3,
              options: ForwardOptions = ForwardOptions()) -> dict[str, float]:
    """Compile seconds and the fastest of ``repeats`` steps on one ``n_rows`` sequence."""
    step = make_train_step(spec, AdamW(), options)
    state = init_state(init_params(spec, seed=0))
    batch = bench_batch(spec, n_rows, image_rows=min(n_rows // 2, 900))
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    compile_s = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics["loss"])
        runs.append(time.perf_counter() - t0)
    return {"compile_s": compile_s, "step_s": min(runs), "step_s_median": float(np.median(runs))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen35", choices=("llama", "qwen35"))
    ap.add_argument("--rows", default="1000,2000")
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--recurrence", default="chunked", choices=("chunked", "scan"))
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--remat", action="store_true")
    args = ap.parse_args(argv)
    spec = bench_spec(args.arch, args.embd, args.layers, args.vocab)
    options = ForwardOptions(recurrence=args.recurrence, chunk=args.chunk, remat=args.remat)
    n_params = count_params(init_params(spec, seed=0))
    for n in (int(r) for r in args.rows.split(",")):
        result = time_step(spec, n, repeats=args.repeats, options=options)
        print(json.dumps({"arch": spec.arch, "n_embd": spec.n_embd, "n_layer": spec.n_layer,
                          "n_params": n_params, "rows": n, "recurrence": args.recurrence,
                          "chunk": args.chunk, "remat": args.remat,
                          **{k: round(v, 3) for k, v in result.items()}}), flush=True)


if __name__ == "__main__":
    main()
