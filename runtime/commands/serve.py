"""``kvagent serve``: one model host for many agents, over HTTP (see ``runtime/serve``).

With no arguments it serves the forged tiny model on 127.0.0.1:8000.  When the model is
loaded and the socket listens it prints one JSON line to stdout —
``{"event": "serve_ready", "url": ..., "port": ..., "model": ...}`` — which scripts (and the
tests, with ``--port 0``) wait for.  SIGINT / SIGTERM shut it down gracefully: new requests
are refused, in-flight steps finish (or roll back after the grace period), every episode
closes and the ledger returns to zero.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys

import anyio

HELP = ("serve the model to many agents over HTTP: an OpenAI-compatible chat API and kvagent's "
        "episode API, one engine, scheduler and memory budget")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import (
        add_agent_arguments, add_engine_arguments, add_model_arguments,
    )
    from runtime.engine_setup import DEMO_MODEL

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--model-name", help="the model id clients send (default: the file stem)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port")
    p.add_argument("--memory-budget", default=None,
                   help="ledger budget (2GiB, 512MiB; default: the memory available now)")
    p.add_argument("--max-episodes", type=int, default=4,
                   help="episodes (and chat conversations) held at once; more get 429")
    p.add_argument("--max-completion-tokens", type=int, default=4096,
                   help="a chat completion decodes at most this many tokens (a larger "
                        "max_tokens is capped to it)")
    p.add_argument("--idle-seconds", type=float, default=900.0,
                   help="an episode idle this long gives its slot to a new one when all "
                        "are taken (its client may be gone without ending it)")
    add_engine_arguments(p, n_batch=True, ctx=16384)
    p.add_argument("--mode", default="terminal", choices=("terminal", "faithful"),
                   help="chat completions: re-lay prompts in kvagent's terminal layout, or "
                        "keep them exactly as sent")
    p.add_argument("--grace-seconds", type=float, default=30.0,
                   help="on SIGINT/SIGTERM, how long in-flight requests may finish")
    add_agent_arguments(p)
    from runtime.commands.cluster import add_cluster_arguments

    add_cluster_arguments(p)


def _config(args: argparse.Namespace) -> object:
    from cachepolicy.engine import EngineConfig
    from runtime.arg_parsers import parse_memory_budget
    from runtime.commands.options import agent_config, engine_fields
    from runtime.engine_setup import available_memory, check_memory, resolve_model
    from runtime.serve.config import Limits, ServeConfig, check_slots

    if not 0 <= args.port <= 65535:
        raise ValueError("--port must be 0..65535")
    if not 0 <= args.grace_seconds <= 3600:
        raise ValueError("--grace-seconds must be 0..3600")
    if not 1 <= args.max_completion_tokens <= 1 << 16:
        raise ValueError("--max-completion-tokens must be 1..65536")
    if not 0 < args.idle_seconds <= 7 * 86400:
        raise ValueError("--idle-seconds must be more than 0 and at most a week")
    budget = parse_memory_budget(args.memory_budget)
    check_slots(args.max_episodes)
    try:
        engine = EngineConfig(n_ctx_per_seq=args.ctx, n_seq_max=args.max_episodes,
                              **engine_fields(args))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--ctx / --n-batch / --max-episodes: {exc}") from None
    if not args.ray:  # a cluster's hosts size themselves on their own nodes
        files = resolve_model(args.model, args.mmproj)
        check_memory(files.model, engine, what="--ctx and --max-episodes")
    return ServeConfig(
        model_path=args.model, mmproj_path=args.mmproj, model_name=args.model_name,
        engine=engine,
        memory_budget=available_memory() if budget.unlimited else budget.resolve(),
        agent=agent_config(args), mode=args.mode, idle_s=args.idle_seconds,
        limits=Limits(max_tokens=args.max_completion_tokens))


def run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except ValueError as exc:
        print(f"kvagent serve: error: {exc}", file=sys.stderr)
        return 2
    if args.ray:
        from runtime.commands.cluster import run_cluster

        return run_cluster(args, config)
    import uvicorn

    from runtime.serve.http.app import create_app

    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as exc:
        print(f"kvagent serve: error: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2
    port = sock.getsockname()[1]

    def ready(host: object) -> None:
        print(json.dumps({"event": "serve_ready", "url": f"http://{args.host}:{port}",
                          "port": port, "model": host.model_name}), flush=True)  # type: ignore[attr-defined]

    app = create_app(config, on_ready=ready)  # type: ignore[arg-type]
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", timeout_graceful_shutdown=args.grace_seconds,
        lifespan="on"))
    # kvagent owns the signals (uvicorn would re-raise them after its shutdown, turning a
    # clean SIGTERM into a traceback): the first asks for a graceful shutdown, a second
    # forces it.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    try:
        anyio.run(_serve, server, sock)
    finally:
        sock.close()
    return 0 if server.started else 2  # not started: the model did not load (logged)


async def _serve(server: object, sock: socket.socket) -> None:
    async with anyio.create_task_group() as tg:
        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    print(f"kvagent serve: {signal.Signals(sig).name}: shutting down",
                          file=sys.stderr, flush=True)
                    if server.should_exit:  # type: ignore[attr-defined]
                        server.force_exit = True  # type: ignore[attr-defined]
                    server.should_exit = True  # type: ignore[attr-defined]

        tg.start_soon(on_signals)
        await server.serve(sockets=[sock])  # type: ignore[attr-defined]
        tg.cancel_scope.cancel()
