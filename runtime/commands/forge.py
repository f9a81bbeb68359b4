"""``kvagent forge``: write a deterministic random-weight GGUF model (and mmproj)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cachepolicy.forge import ARCHES, QUANTS, SIZES, ForgeError, forge

HELP = ("forge a tiny random-weight GGUF model (+ mmproj with --vision, quantized with --quant) "
        "for tests and benchmarks")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", required=True, choices=ARCHES,
                   help="llama; qwen35 / qwen35moe (hybrid); qwen2vl (Qwen2.5-VL: UI-TARS-1.5, "
                        "OpenCUA), qwen3vl / qwen3vlmoe (Qwen3-VL, deepstack)")
    p.add_argument("--size", required=True, choices=SIZES)
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--vision", action="store_true", help="also write a matching mmproj.gguf")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quant", default="f16", choices=QUANTS,
                   help="quantize the text model with llama.cpp's own quantizer (K-quants and "
                        "iq4_xs need size XS or larger); the mmproj stays f16")


def run(args: argparse.Namespace) -> int:
    try:
        result = forge(args.arch, args.size, args.out, vision=args.vision, seed=args.seed,
                       quant=args.quant)
    except ForgeError as exc:
        print(f"kvagent forge: error: {exc}")
        return 2
    print(f"wrote {result.model_path} ({result.model_bytes / 2**20:.1f} MiB, "
          f"{result.n_params / 1e6:.2f}M params, arch {result.arch}, size {result.size}, "
          f"{result.quant}, seed {result.seed})")
    if result.mmproj_path is not None:
        print(f"wrote {result.mmproj_path} ({result.mmproj_bytes / 2**20:.1f} MiB)")
    return 0
