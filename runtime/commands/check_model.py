"""``kvagent check-model MODEL.gguf --mmproj P``: will it run my model? — the architecture,
the profile to use, what a screenshot and a window cost in context, which cache policies
apply and are exact, from the files alone (``runtime.model_check``; no weights are loaded).

A command of its own rather than a section of ``check-exact``: check-exact loads the model
and computes on it (minutes on a 30B model, and worth running once the answer here is yes),
this answers in about a second from the metadata and takes the agent's options (profile,
window, screen) that check-exact has no use for."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.model_check import ModelCheck

HELP = ("will it run my model? — from a GGUF and its projector, without loading the weights: "
        "the architecture, the profile to use, the context a window needs, the cache "
        "policies that apply and which are exact")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from cachepolicy.policies import names as policy_names
    from runtime.config import MAX_WINDOW
    from runtime.profiles import names as profile_names

    p.add_argument("model", type=Path, nargs="?",
                   help="the text model's GGUF (default: kvagent's shipped demo agent)")
    p.add_argument("--mmproj", type=Path, help="its vision projector GGUF")
    p.add_argument("--profile", choices=profile_names(), default=None,
                   help="the profile to judge with (default: the one the files suggest)")
    p.add_argument("--policy", choices=policy_names(), default="terminal-slot",
                   help="the cache policy to size the context for (default %(default)s)")
    p.add_argument("--window", type=int, default=None,
                   help=f"screenshots the model sees (1..{MAX_WINDOW}; default: the "
                        "profile's)")
    p.add_argument("--screen", default="1920x1080", metavar="WxH",
                   help="the screenshots' size (default %(default)s, OSWorld's)")
    p.add_argument("--max-steps", type=int, default=15,
                   help="steps an episode's context is sized for (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _error(message: str) -> int:
    print(f"kvagent check-model: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from cachepolicy.engine.errors import ModelLoadError
    from runtime.arg_parsers import parse_wxh
    from runtime.engine_setup import resolve_model
    from runtime.model_check import check_model  # loads libllama: only when run

    if not 1 <= args.max_steps <= 1000:
        return _error("--max-steps must be 1..1000")
    try:
        screen = parse_wxh(args.screen, option="--screen", low=(320, 240), high=(7680, 4320))
        if args.model is None:
            if args.mmproj is not None:
                return _error("--mmproj without a model: give the model's GGUF too")
            files = resolve_model(None, None)
            model, mmproj = files.model, files.mmproj
        else:
            model, mmproj = args.model, args.mmproj
        report = check_model(model, mmproj, profile=args.profile, policy=args.policy,
                             window=args.window, steps=args.max_steps, screen=screen)
    except (ModelLoadError, ValueError) as exc:
        return _error(str(exc))
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print("\n".join(lines(report)))
    return 0 if report.runs else 1


def lines(report: ModelCheck) -> list[str]:
    """The text report, one fact a line."""
    from runtime.model_check import KIND_TEXT  # loads libllama: only when run
    from scheduler.sizes import format_bytes

    f = report.facts
    out = [f"model: {report.model}",
           f"  architecture: {f.arch} ({KIND_TEXT[f.kind]}), {f.n_layer} layers, trained "
           f"context {f.n_ctx_train or 'not stated'}; llama.cpp reads it",
           f"  RoPE: {'multi-section (M-RoPE)' if f.mrope else 'one position per token'}"]
    if report.mmproj is None:
        out.append("projector: none given")
    else:
        pairs = "pairs with the model" if f.pairing_problem is None else "does NOT pair"
        out.append(f"projector: {report.mmproj} ({f.projector or 'type not stated'}): {pairs}")
    out.append(f"profile: {report.profile} — {report.profile_reason}")
    w, h = report.screen
    if report.image_tokens is not None and report.context is not None:
        size = ("" if report.context_kv_bytes is None
                else f"; KV cache and workspace ~{format_bytes(report.context_kv_bytes)} "
                     f"with the decode lanes")
        out += [f"screenshot: {w}x{h} costs ~{report.image_tokens} tokens",
                f"context: a window of {report.window} screenshots under {report.policy}, "
                f"{report.steps} steps: {report.context} positions per episode "
                f"(--ctx / n_ctx){size}"]
    out.append("policies:")
    width = max(len(p.name) for p in report.policies)
    for p in report.policies:
        kind = f"{p.quality}, {'bounded' if p.bounded else 'unbounded'}"
        verdict = "applies" if p.applies else "refused"
        out.append(f"  {p.name:<{width}}  {kind:<24} {verdict}: {p.why}")
    out += [f"warning: {warning}" for warning in report.warnings]
    out += [f"problem: {problem}" for problem in report.problems]
    out.append(f"runs: {str(report.runs).lower()}"
               + ("" if not report.runs else
                  f" — next: kvagent check-exact --model {report.model}"
                  + (f" --mmproj {report.mmproj}" if report.mmproj else "")
                  + " (bitwise on this machine)"))
    return out
