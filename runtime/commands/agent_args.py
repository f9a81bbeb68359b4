"""The command-line face of ``AgentConfig``: the same options, names and defaults in
``kvagent run`` and ``kvagent bench`` (the bench states its own measurement defaults
explicitly: a fixed number of decoded tokens, no grammar, so arms compare).

Also the bounds every command applies before a model loads (threads, context sizes): sizes
that reach llama.cpp or memory are checked here, with a message naming the option.
"""

from __future__ import annotations

import argparse
import os
import re

import attrs

from cachepolicy.engine.records import MAX_THREADS
from runtime.config import MAX_DECODE_TOKENS, MAX_WINDOW, AgentConfig



def default_threads() -> int:
    return os.cpu_count() or 1


def add_agent_arguments(p: argparse.ArgumentParser, *, defaults: AgentConfig | None = None,
                        ) -> None:
    """``--profile --policy --window --overlap --temperature --seed --grammar
    --decode-tokens --stop-at-eog``, defaulting to ``defaults`` (``AgentConfig()`` if None;
    the window defaults to the profile's)."""
    from cachepolicy.policies import names
    from runtime.profiles import names as profile_names

    d = defaults or AgentConfig()
    p.add_argument("--profile", default=d.profile, choices=profile_names(),
                   help="the model family's prompt, output format and history layout "
                        "(kvagent: kvagent's own action language; qwen3vl: Qwen3-VL "
                        "computer_use tool calls; uitars / uitars-v1: UI-TARS 1.5 / 1.0)")
    p.add_argument("--policy", default=d.policy, choices=names(), help="the cache policy")
    p.add_argument("--window", type=int, default=None,
                   help=f"screenshots the model sees (K, 1..{MAX_WINDOW}; default: the "
                        "profile's, 3 for kvagent, 5 for qwen3vl and uitars)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=d.overlap,
                   help="prefetch the next step while the VM executes the action")
    p.add_argument("--temperature", type=float, default=d.temperature,
                   help="sampling temperature (0 = greedy)")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed")
    p.add_argument("--grammar", action=argparse.BooleanOptionalAction, default=d.grammar,
                   help="constrain decoding to the profile's output format")
    p.add_argument("--decode-tokens", type=int, default=d.decode_tokens,
                   help=f"tokens an action may take (1..{MAX_DECODE_TOKENS}; default: what "
                        "the grammar needs)")
    p.add_argument("--stop-at-eog", action=argparse.BooleanOptionalAction,
                   default=d.stop_at_eog,
                   help="stop decoding at end-of-generation (off: always --decode-tokens)")


def agent_config(args: argparse.Namespace, *, policy: str | None = None) -> AgentConfig:
    """The ``AgentConfig`` of parsed arguments; ValueError naming the option at fault."""
    fields = {"profile": args.profile, "policy": policy or args.policy,
              "overlap": args.overlap, "temperature": args.temperature, "seed": args.seed,
              "grammar": args.grammar, "decode_tokens": args.decode_tokens,
              "stop_at_eog": args.stop_at_eog}
    if args.window is not None:  # else the profile's
        fields["window"] = args.window
    for name in ("window", "temperature", "decode_tokens"):  # one at a time: name the culprit
        if name not in fields:
            continue
        try:
            attrs.evolve(AgentConfig(), **{name: fields[name]})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--{name.replace('_', '-')} {fields[name]}: {exc}") from None
    return AgentConfig(**fields)


def check_threads(threads: int) -> str | None:
    if not 1 <= threads <= MAX_THREADS:
        return f"--threads must be 1..{MAX_THREADS} (this machine has {default_threads()} cores)"
    return None


def bench_agent_defaults() -> AgentConfig:
    """What the bench decodes: 16 tokens every step, greedy, no grammar, end-of-generation
    ignored — a fixed amount of decode work per step, so arms compare."""
    return attrs.evolve(AgentConfig(), grammar=False, decode_tokens=16, stop_at_eog=False)


def parse_wxh(text: str, low: tuple[int, int],
              high: tuple[int, int]) -> tuple[int, int] | None:
    """'1280x720' (spaces and a capital X allowed) → (1280, 720); None unless it is WxH
    with ``low <= (w, h) <= high`` side by side."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if m is None:
        return None
    w, h = int(m[1]), int(m[2])
    return (w, h) if low[0] <= w <= high[0] and low[1] <= h <= high[1] else None
