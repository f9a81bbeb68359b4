"""The command line's shared options: the model files, the engine's sizes and the agent's
configuration — the same names, defaults and bounds in every command.

``add_model_arguments`` / ``add_engine_arguments`` / ``add_agent_arguments`` attach the flags;
``model_files`` / ``engine_fields`` / ``agent_config`` read them back, raising ``ValueError``
naming the option at fault (values are parsed and bounded by ``runtime.arg_parsers``; the
model is resolved and the engine sized by ``runtime.engine_setup``).  The bench states its
own measurement defaults explicitly (``bench_agent_defaults``, from
``runtime.bench.agent_defaults``: a fixed number of decoded tokens, no grammar, so arms
compare).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs

from cachepolicy.engine.records import (
    MAX_DECODE_ROWS, MAX_GPU_LAYERS, MAX_N_BATCH, default_threads,
)
from cachepolicy.policies import names
from cachepolicy.tail import BASES
from runtime.arg_parsers import check_decode_rows, check_threads
from runtime.bench.agent_defaults import bench_agent_defaults  # re-exported: the bench's flags
from runtime.config import (
    GUESS_MODES, MAX_DECODE_TOKENS, MAX_WINDOW, AgentConfig, PinningError, PolicyChoice,
)
from runtime.engine_setup import DefaultModel, ModelFiles, resolve_model
from runtime.profiles import names as profile_names


def add_model_arguments(p: argparse.ArgumentParser, default: DefaultModel, *,
                        vision: bool = True) -> None:
    """``--model`` (and ``--mmproj`` when screenshots are involved)."""
    p.add_argument("--model", type=Path, help=f"GGUF model (default: {default.describe()})")
    if vision:
        p.add_argument("--mmproj", type=Path,
                       help="vision projector GGUF (required with --model)")


def model_files(args: argparse.Namespace, default: DefaultModel, *,
                vision: bool = True) -> ModelFiles:
    """The model the options name, or ``default`` (forged once); ValueError for a model
    without its projector."""
    return resolve_model(args.model, getattr(args, "mmproj", None), default=default,
                         vision=vision)


def add_engine_arguments(p: argparse.ArgumentParser, *, n_batch: bool = False,
                         ctx: int | None = None) -> None:
    """``--threads``, ``--decode-rows``, ``--decode-shape`` and ``--gpu-layers``;
    ``--n-batch`` if asked; ``--ctx`` (context tokens per sequence, defaulting to ``ctx``)
    if given."""
    if ctx is not None:
        p.add_argument("--ctx", type=int, default=ctx, help="context tokens per episode")
    if n_batch:
        p.add_argument("--n-batch", type=int, default=512,
                       help=f"rows per prefill call, 2..{MAX_N_BATCH}")
    p.add_argument("--threads", type=int, default=default_threads(),
                   help="engine threads (default: $KVAGENT_THREADS, else every core)")
    p.add_argument("--decode-rows", type=int, default=None,
                   help=f"decode lanes, 1..{MAX_DECODE_ROWS}: up to this many generations "
                        "decode at once (default 4; mixture-of-experts models at most 7)")
    p.add_argument("--decode-shape", choices=("auto", "lanes", "runs"), default="auto",
                   help="how decode calls are formed: runs (one generation's tokens per "
                        "call, grammar-forced text and drafts verified in it) or lanes "
                        "(generations share calls, one token each, padded to their row "
                        "class); auto: lanes where a lone generation needs no pad row in "
                        "them (Q8_0, K-quants, one lane), else runs for generations under a "
                        "grammar and one-row calls for the others.  Each is exact; they may "
                        "compute other bits on some models (see docs/benchmarks.md section 4)")
    add_gpu_argument(p)


def add_gpu_argument(p: argparse.ArgumentParser) -> None:
    """``--gpu-layers N|all`` (``EngineConfig.n_gpu_layers``; read by ``gpu_layers``)."""
    p.add_argument("--gpu-layers", default="0", metavar="N|all",
                   help="layers llama.cpp places on the GPU, as llama-server's -ngl (the "
                        "last N blocks and the output layer; all or -1: every layer; default "
                        "0, CPU only).  Needs llama-cpp-python built with CUDA or Metal "
                        "(docs/gpu.md); on a CPU build nothing is offloaded and the load says "
                        "so.  Exact on the GPU as far as check-exact reports there")


def gpu_layers(args: argparse.Namespace) -> int:
    """``--gpu-layers`` as ``n_gpu_layers`` (all → -1); ValueError naming the option."""
    raw = str(args.gpu_layers).strip().lower()
    if raw == "all":
        return -1
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not -1 <= value <= MAX_GPU_LAYERS:
        raise ValueError(f"--gpu-layers must be a layer count 0..{MAX_GPU_LAYERS}, or all "
                         f"(-1), got {args.gpu_layers!r}")
    return value


def engine_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EngineConfig`` fields the engine options give (checked; ValueError naming the
    option)."""
    fields: dict[str, Any] = {"n_threads": check_threads(args.threads),
                              "decode_rows": check_decode_rows(args.decode_rows),
                              "decode_runs": DECODE_SHAPES[args.decode_shape],
                              "n_gpu_layers": gpu_layers(args)}
    if hasattr(args, "n_batch"):
        if not 2 <= args.n_batch <= MAX_N_BATCH:
            raise ValueError(f"--n-batch must be 2..{MAX_N_BATCH} (a 1-row batch takes "
                             "another kernel)")
        fields["n_batch"] = args.n_batch
    return fields


#: ``--decode-shape`` → ``EngineConfig.decode_runs``
DECODE_SHAPES: dict[str, bool | None] = {"auto": None, "lanes": False, "runs": True}


def add_agent_arguments(p: argparse.ArgumentParser, *, defaults: AgentConfig | None = None,
                        ) -> None:
    """``--profile --policy --window --overlap --temperature --seed --grammar
    --decode-tokens --stop-at-eog --replay-budget --replay-base --replay-rung
    --replay-drift``, defaulting to ``defaults`` (``AgentConfig()`` if None;
    the window defaults to the profile's)."""
    d = defaults or AgentConfig()
    p.add_argument("--profile", default=d.profile, choices=profile_names(),
                   help="the model family's prompt, output format and history layout "
                        "(kvagent: kvagent's own action language; qwen3vl: Qwen3-VL "
                        "computer_use tool calls; uitars / uitars-v1: UI-TARS 1.5 / 1.0)")
    p.add_argument("--policy", default=d.policy, metavar="NAME[@BUDGET|@OPTION]",
                   type=policy_spelling,
                   help=f"the cache policy ({', '.join(names())}), optionally "
                        "@<replay budget> if approximate (tail-replay@10%%) or @<option> "
                        "if it takes one (kamera@m32), spelled as bench arms are")
    p.add_argument("--window", type=int, default=None,
                   help=f"screenshots the model sees (K, 1..{MAX_WINDOW}; default: the "
                        "profile's, 3 for kvagent, 5 for qwen3vl and uitars)")
    p.add_argument("--pin-first", type=int, default=d.pinned, metavar="N", dest="pinned",
                   help="keep the episode's first N screenshots in the window to its end, "
                        "beside the newest K-N (a look-back at the starting screen; the "
                        "terminal layouts: not evict, noevict, faithful; default %(default)s)")
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
    p.add_argument("--replay-budget", default=d.replay_budget, metavar="TOKENS|PCT%",
                   help="tail replay on hybrid models: rows of a matched prefix an approximate "
                        "step re-prefills, as tokens (64) or a share of the prefix (10%%); for "
                        "the approximate policies (tail-replay, noevict-tail, faithful-tail) "
                        "and --replay-rung (default %(default)s)")
    p.add_argument("--replay-base", default=d.replay_base, choices=BASES,
                   help="where a replay's recurrent state starts: the nearest older "
                        "checkpoint (else zero), or always zero")
    p.add_argument("--replay-rung", action=argparse.BooleanOptionalAction,
                   default=d.replay_rung,
                   help="allow approximation under memory pressure: the fallback ladder may "
                        "drop an idle episode's checkpoints and recurrent state instead of "
                        "its whole cache; its next steps replay a tail (marked approximate)")
    p.add_argument("--replay-drift", action=argparse.BooleanOptionalAction,
                   default=d.replay_drift,
                   help="an approximate policy measures every step against its exact prompt "
                        "prefilled from scratch (next-token KL, top-1): a full prefill more "
                        "per step")
    p.add_argument("--policy-option", default=d.policy_option, metavar="OPTION",
                   help="the option of a policy that takes one: kamera's patch rank (m0, "
                        "m32, full; default m32; +recall<N>, as m8+recall4: keep the N store "
                        "entries last used and place a new screenshot's image from the one "
                        "with its pixels), random-evict's / recency-evict's share of "
                        "the retained screenshots' tokens kept (50%%, the default)")
    p.add_argument("--jump-forward", action=argparse.BooleanOptionalAction,
                   default=d.jump_forward,
                   help="feed text the grammar forces without sampling it token by token "
                        "(runs shape; the tokens are the same)")
    p.add_argument("--drafts", action=argparse.BooleanOptionalAction, default=d.drafts,
                   help="verify prompt-lookup drafts in the same call (runs shape; the "
                        "tokens are the same)")
    p.add_argument("--guess", choices=GUESS_MODES, default=d.guess,
                   help="with overlap, prefill the current screenshot as the guess for the "
                        "next one (auto: when the VM's actions leave time; the outputs are "
                        "the same either way)")


def policy_spelling(text: str) -> str:
    """``--policy``'s value, checked as ``PolicyChoice`` reads it (argparse names the
    reason)."""
    try:
        PolicyChoice.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def agent_config(args: argparse.Namespace, *, policy: str | None = None) -> AgentConfig:
    """The ``AgentConfig`` of parsed arguments; ValueError naming the option at fault."""
    choice = PolicyChoice.parse(policy or args.policy, what="--policy")
    fields = {"profile": args.profile, "policy": choice.policy,
              "overlap": args.overlap, "temperature": args.temperature, "seed": args.seed,
              "grammar": args.grammar, "decode_tokens": args.decode_tokens,
              "stop_at_eog": args.stop_at_eog, "jump_forward": args.jump_forward,
              "drafts": args.drafts, "guess": args.guess,
              "replay_budget": args.replay_budget, "replay_base": args.replay_base,
              "replay_rung": args.replay_rung, "replay_drift": args.replay_drift,
              "policy_option": args.policy_option, "pinned": args.pinned}
    # the spelling's budget or option (tail-replay@10%, kamera@m32) over --replay-budget /
    # --policy-option
    if choice.budget is not None:
        fields["replay_budget"] = choice.budget
    if choice.option is not None:
        fields["policy_option"] = choice.option
    if args.window is not None:  # else the profile's
        fields["window"] = args.window
    for name in ("window", "temperature", "decode_tokens",  # one at a time: name the culprit
                 "replay_budget"):
        if name not in fields:
            continue
        try:
            attrs.evolve(AgentConfig(), **{name: fields[name]})
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--{name.replace('_', '-')} {fields[name]}: {exc}") from None
    try:
        return AgentConfig(**fields)
    except PinningError as exc:  # checked against the policy and the window: name the option
        raise ValueError(f"--pin-first {fields['pinned']}: {exc}") from None
