"""``kvagent demo``: one screenshot step on the embedded tiny model, cached and restored.

Forges (once, cached) the tiny qwen35 vision model unless a model is given, prefills
``[preamble][screenshot][generation prompt]``, checkpoints at the start of the screenshot
region, generates an action, then rolls back to the checkpoint and replays the window to show
the output is token-for-token identical while only the window is re-prefilled.
"""

from __future__ import annotations

import argparse
import sys
import time

from cachepolicy.engine.records import default_threads

HELP = "run one cached screenshot step on the embedded tiny model and print what happened"

SYSTEM = "You are a GUI agent. Reply with one pyautogui action."
INSTRUCTION = "Open the terminal and type ls."


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import add_model_arguments
    from runtime.engine_setup import DEMO_MODEL

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--arch", default="qwen35", choices=["llama", "qwen35", "qwen35moe"],
                   help="arch of the forged model when no --model is given")
    p.add_argument("--tokens", type=int, default=12, help="tokens to generate")
    p.add_argument("--threads", type=int, default=default_threads())


def run(args: argparse.Namespace) -> int:
    import attrs

    from cachepolicy.engine.checkpoint import CheckpointKind
    from cachepolicy.oracle.checks import oracle_screenshot
    from runtime.engine_setup import DEMO_MODEL, engine_config, load_engine, resolve_model

    try:
        files = resolve_model(args.model, args.mmproj,
                              default=attrs.evolve(DEMO_MODEL, arch=args.arch))
        config = engine_config(files.model, what="--threads", n_ctx_per_seq=4096,
                               n_seq_max=2, n_threads=args.threads)
    except ValueError as exc:
        print(f"kvagent demo: error: {exc}", file=sys.stderr)
        return 2
    if files.default is not None:
        print(f"using {files.default.describe()} (random weights: the output is valid "
              f"tokens, not intelligence): {files.model.parent}")
    with load_engine(files, config, vision=False) as engine:
        print(f"loaded {files.model.name}: {engine.kind.value} model, {engine.n_params / 1e6:.2f}M "
              f"params, KV {engine.kv_bytes_per_token} B/token, recurrent state "
              f"{engine.recurrent_bytes_per_seq} B/sequence")
        if not engine.has_vision:
            print("no mmproj: the demo needs a vision projector (--mmproj)")
            return 2
        t0 = time.perf_counter()
        shot = engine.encode_image(oracle_screenshot(256, 160))
        print(f"encoded a 256x160 screenshot: {shot.n_tokens} image tokens at {shot.n_pos} "
              f"positions in {time.perf_counter() - t0:.3f} s")
        preamble = engine.tokenize(
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{INSTRUCTION}\n"
        ) + shot.prefix_tokens
        gen_prompt = shot.suffix_tokens + engine.tokenize("<|im_end|>\n<|im_start|>assistant\n")
        engine.prefill_tokens(0, preamble, logits=False)
        kind = (CheckpointKind.PARTIAL_ONLY if engine.kind.has_recurrent_state
                else CheckpointKind.FULL)
        ckpt = engine.checkpoint(0, kind)
        print(f"prefilled the preamble ({len(preamble)} tokens); {kind.value} checkpoint at "
              f"position {ckpt.pos}: {ckpt.nbytes} bytes")

        def window_and_generate() -> list[int]:
            engine.prefill_image(0, shot)
            logits = engine.prefill_tokens(0, gen_prompt)
            assert logits is not None
            return engine.generate(0, logits, args.tokens)

        t0 = time.perf_counter()
        first = window_and_generate()
        t1 = time.perf_counter()
        print(f"step 1: prefilled the window ({shot.n_tokens + len(gen_prompt)} tokens) and "
              f"generated {len(first)} tokens in {t1 - t0:.3f} s: {engine.detokenize(first)!r}")
        engine.truncate(0, ckpt.pos, via=ckpt if engine.kind.has_recurrent_state else None)
        print(f"rolled sequence 0 back to the checkpoint (position {ckpt.pos})")
        t0 = time.perf_counter()
        second = window_and_generate()
        t1 = time.perf_counter()
        print(f"step 2: re-prefilled only the window and generated {len(second)} tokens in "
              f"{t1 - t0:.3f} s")
        same = first == second
        print(f"outputs identical token for token: {'yes' if same else 'NO'}")
        mem = engine.memory()
        print(f"engine holds {mem.total_held} bytes: sequences {mem.seq_state_bytes}, "
              f"{mem.live_checkpoints} checkpoint(s) {mem.live_checkpoint_bytes} B, image cache "
              f"{mem.image_cache_bytes} B ({engine.image_cache_stats().hits} hit(s))")
        return 0 if same else 1
