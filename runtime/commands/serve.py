"""``kvagent serve``: one model host for many agents, over HTTP (see ``runtime/serve``).

With no arguments it serves the forged tiny model on 127.0.0.1:8000.  With API keys
(``--api-key``, ``$KVAGENT_API_KEY``, ``--api-key-file``) every route but ``/health`` needs
one; without, the server listens on loopback only (another ``--host`` is refused unless
``--insecure-no-auth``).  When the model is loaded and the socket listens it prints one JSON
line to stdout —
``{"event": "serve_ready", "url": ..., "port": ..., "model": ...}`` — which scripts (and the
tests, with ``--port 0``) wait for.  SIGINT / SIGTERM shut it down gracefully: new requests
are refused, in-flight steps finish (or roll back after the grace period), every episode
closes and the ledger returns to zero.  A step still running when ``--grace-seconds`` ends
is stopped and rolled back, its request answered ``503 server_shutting_down`` (a stream ends
with an error event); uvicorn cancels whatever is left only ``STOP_MARGIN_S`` later.  Exit
status: 0 after a clean shutdown, 2 when it cannot start (a bad option, the model, the
port), 1 when the shutdown failed (the cause is printed last).
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import json
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

HELP = ("serve the model to many agents over HTTP: an OpenAI-compatible chat API and kvagent's "
        "episode API, one engine, scheduler and memory budget")


#: Seconds past ``--grace-seconds`` that the steps stopped then have to roll back and answer
#: before uvicorn cancels what still runs (a cut response: the last resort).
STOP_MARGIN_S = 10.0

#: The environment variable holding API keys (comma-separated), for the server and clients.
KEY_ENV = "KVAGENT_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import (
        add_agent_arguments, add_engine_arguments, add_model_arguments,
    )
    from runtime.engine_setup import DEMO_MODEL
    from runtime.profiles import names as profile_names
    from runtime.serve.config import Limits

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--model-name", help="the model id clients send (default: the file stem; "
                   "kvagent-agent-qwen35 for the default model)")
    p.add_argument("--host", default="127.0.0.1",
                   help="where to listen; other than loopback needs an API key (or "
                        "--insecure-no-auth)")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port")
    a = p.add_argument_group("access (docs/serving.md, Security)")
    a.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a key clients send as 'Authorization: Bearer KEY' (repeatable; "
                        f"also ${KEY_ENV}, comma-separated, and --api-key-file)")
    a.add_argument("--api-key-file", action="append", default=[], type=Path, metavar="FILE",
                   help="keys, one a line (keeps them out of ps)")
    a.add_argument("--insecure-no-auth", action="store_true",
                   help="listen on a non-loopback --host without any API key")
    a.add_argument("--max-image-pixels", type=int, default=Limits().max_image_pixels,
                   help="pixels of one image, read from its header before decoding; more: "
                        "413 (default: a 3840x2160 screen)")
    a.add_argument("--max-request-pixels", type=int, default=Limits().max_request_pixels,
                   help="pixels of all of a request's images (default: 16 x 1920x1080)")
    a.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="without API keys the server takes requests only for a loopback "
                        "name or its own address (Host header: DNS rebinding); this name "
                        "too (repeatable)")
    a.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="without API keys the server refuses requests from web pages of "
                        "other origins (Origin header); this one too, e.g. "
                        "http://localhost:3000 (repeatable)")
    a.add_argument("--max-connections", type=int, default=Limits().max_connections,
                   help="open connections; at the cap a new one closes the one that has "
                        "waited longest for its request head")
    a.add_argument("--body-budget", default=None, metavar="BYTES",
                   help="bytes of request bodies being read at once, server-wide (e.g. "
                        "256MiB, the default); a body that does not fit waits "
                        f"{Limits().body_budget_wait_s:g} s, then 503")
    a.add_argument("--header-timeout", type=float, default=Limits().header_timeout_s,
                   help="seconds a connection has to send a request's head")
    a.add_argument("--body-timeout", type=float, default=Limits().body_timeout_s,
                   help="seconds a request has to send its body (then 408)")
    p.add_argument("--memory-budget", default=None,
                   help="ledger budget (2GiB, 512MiB; default: the memory available now)")
    p.add_argument("--max-episodes", type=int, default=4,
                   help="episodes (and chat conversations) held at once; more get 429")
    p.add_argument("--max-completion-tokens", type=int, default=4096,
                   help="a chat completion decodes at most this many tokens (a larger "
                        "max_tokens is capped to it)")
    p.add_argument("--idle-seconds", type=float, default=300.0,
                   help="an episode idle this long gives its slot to a new one when all "
                        "are taken (its client may be gone without ending it; keep it "
                        "below the clients' retry window, KvAgent's 600 s)")
    p.add_argument("--lease-grace-seconds", type=float, default=10.0,
                   help="an episode whose client's lease dropped (the client ended) is "
                        "ended this long after, unless the lease comes back")
    add_engine_arguments(p, n_batch=True, ctx=16384)
    p.add_argument("--mode", default="terminal", choices=("terminal", "faithful"),
                   help="chat completions: re-lay prompts in kvagent's terminal layout, or "
                        "keep them exactly as sent")
    p.add_argument("--chat-action-grammar", default=None, choices=profile_names(),
                   metavar="PROFILE",
                   help="constrain chat completions that bring no grammar of their own to "
                        "this profile's action format (e.g. qwen3vl for OSWorld's "
                        "Qwen3VLAgent)")
    p.add_argument("--grace-seconds", type=float, default=30.0,
                   help="on SIGINT/SIGTERM, how long in-flight requests may finish")
    add_agent_arguments(p)
    # no --policy: terminal-slot for the episodes, chrono-slot for the chat API's terminal
    # mode (``_config``); a policy given runs both
    p.set_defaults(policy=None)
    from runtime.commands.cluster import add_cluster_arguments

    add_cluster_arguments(p)


def _config(args: argparse.Namespace) -> object:
    from cachepolicy.engine import EngineConfig
    from runtime.arg_parsers import parse_memory_budget
    from runtime.commands.options import agent_config, engine_fields
    from runtime.config import AgentConfig
    from runtime.serve.terminal import chat_policy
    from runtime.engine_setup import available_memory, check_memory, resolve_model
    from runtime.serve.config import Limits, ServeConfig, check_slots
    from runtime.serve.http.local_only import normal_origin

    if not 0 <= args.port <= 65535:
        raise ValueError("--port must be 0..65535")
    if not 0 <= args.grace_seconds <= 3600:
        raise ValueError("--grace-seconds must be 0..3600")
    if not 1 <= args.max_completion_tokens <= 1 << 16:
        raise ValueError("--max-completion-tokens must be 1..65536")
    if not 0 < args.idle_seconds <= 7 * 86400:
        raise ValueError("--idle-seconds must be more than 0 and at most a week")
    if not 0 <= args.lease_grace_seconds <= 3600:
        raise ValueError("--lease-grace-seconds must be 0..3600")
    if not (1 <= args.max_image_pixels <= 1 << 31 and 1 <= args.max_request_pixels <= 1 << 31):
        raise ValueError("--max-image-pixels / --max-request-pixels must be 1..2**31")
    if not 8 <= args.max_connections <= 1 << 20:
        raise ValueError("--max-connections must be 8..2**20")
    if not (0 < args.header_timeout <= 3600 and 0 < args.body_timeout <= 3600):
        raise ValueError("--header-timeout / --body-timeout must be more than 0 and at "
                         "most an hour")
    budget = parse_memory_budget(args.memory_budget)
    body_budget = Limits().body_budget_bytes
    if args.body_budget is not None:
        body_budget = parse_memory_budget(args.body_budget, option="--body-budget").resolve()
        if not 1 << 20 <= body_budget <= 1 << 40:
            raise ValueError("--body-budget must be 1MiB..1TiB")
    origins = [o for o in args.allow_origin if normal_origin(o) is None]
    if origins:
        raise ValueError(f"--allow-origin {origins[0]!r} is not an origin "
                         "(scheme://host[:port], e.g. http://localhost:3000)")
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
        agent=agent_config(args, policy=args.policy or AgentConfig().policy),
        chat_policy=chat_policy(args.policy, args.pinned), mode=args.mode,
        idle_s=args.idle_seconds,
        lease_grace_s=args.lease_grace_seconds, chat_action_grammar=args.chat_action_grammar,
        # --host by name is a name the server is reached by (not a rebound one)
        allow_hosts=(*args.allow_host, args.host), allow_origins=tuple(args.allow_origin),
        limits=Limits(max_tokens=args.max_completion_tokens, body_budget_bytes=body_budget,
                      max_image_pixels=args.max_image_pixels,
                      max_request_pixels=args.max_request_pixels,
                      max_connections=args.max_connections,
                      header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout))


def api_keys(args: argparse.Namespace) -> object:
    """The server's API keys (``ApiKeys``) from the flags, the environment and key files;
    refuses a non-loopback ``--host`` without any (``ValueError``)."""
    from runtime.serve.http.auth import ApiKeys

    keys = ApiKeys.gather(args.api_key, os.environ.get(KEY_ENV), args.api_key_file)
    if not keys.required and not is_loopback(args.host) and not args.insecure_no_auth:
        raise ValueError(f"--host {args.host} is not loopback and no API key is given: "
                         f"anyone who can reach it could use and read every episode. Give "
                         f"--api-key / --api-key-file / ${KEY_ENV}, or --insecure-no-auth")
    return keys


def is_loopback(host: str) -> bool:
    """Is ``host`` a loopback address (or ``localhost``)?"""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: glibc's ``mallopt`` parameter for the size from which ``malloc`` maps memory of its own
M_MMAP_THRESHOLD = -3
#: allocations from this size up are mapped and unmapped when freed (``tune_malloc``)
BIG_BUFFER_BYTES = 1 << 20
#: glibc's ``mallopt`` parameter for how many malloc arenas threads may spread over
M_ARENA_MAX = -8


def tune_malloc() -> bool:
    """Give freed big buffers back to the OS at once, and keep one malloc arena.  glibc
    keeps every thread's malloc arena at its high-water mark, and its mmap threshold grows
    to the largest block freed:
    a server's transient per-request buffers (base64 bodies, decoded and resized
    screenshots, ~20 MB a request) stayed resident in each worker thread's arena — 29 MiB
    of ``kvagent serve``'s peak RSS on ``bench-peer``'s llama M N = 4 arm (1126 → 1097 MiB).
    A fixed threshold (``BIG_BUFFER_BYTES``) maps them and unmaps them when freed.
    Buffers just under it stay in the arenas: a KV splice's per-layer rows (~0.5-1 MB each
    at a ~1900-cell window on the forged llama M, a few hundred of them per step: kamera,
    window-replay) — and glibc gives a thread that finds the arenas busy an arena of its
    own, so every worker thread that ran a splice kept its own high-water mark: kamera@own's
    RSS climbed by ~60 MiB a worker (944 → 1330 MiB over bench-peer's N = 4 arm).  One arena
    for every thread (``M_ARENA_MAX`` = 1: the threads share one high-water mark; on one or
    two cores they hardly contend for it).  Called before any thread starts.  False where
    the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, BIG_BUFFER_BYTES)
                    and libc.mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False


def run(args: argparse.Namespace) -> int:
    tune_malloc()
    try:
        keys = api_keys(args)
        config = _config(args)
    except ValueError as exc:
        print(f"kvagent serve: error: {exc}", file=sys.stderr)
        return 2
    if args.ray:
        from runtime.commands.cluster import run_cluster

        return run_cluster(args, config, keys)
    from runtime.serve.http.app import create_app, shutdown_error, startup_refusal
    from runtime.serve.http.server import uvicorn_server

    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as exc:
        print(f"kvagent serve: error: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2
    port = sock.getsockname()[1]

    hosts: list[object] = []  # the model host, once ready (its ``drain`` at shutdown)

    def ready(host: object) -> None:
        hosts.append(host)
        print(json.dumps({"event": "serve_ready", "url": f"http://{args.host}:{port}",
                          "port": port, "model": host.model_name}), flush=True)  # type: ignore[attr-defined]

    app = create_app(config, keys=keys, on_ready=ready)  # type: ignore[arg-type]
    # kvagent owns the signals (``_serve``): the first asks for a graceful shutdown, a second
    # forces it
    server = uvicorn_server(app, config.limits,  # type: ignore[attr-defined]
                            grace_s=args.grace_seconds + STOP_MARGIN_S, lifespan="on")

    async def drain() -> None:
        for host in hosts:
            await host.drain(args.grace_seconds)  # type: ignore[attr-defined]

    try:
        anyio.run(_serve, server, sock, drain)
    finally:
        sock.close()
    if not server.started:
        if (refusal := startup_refusal(app)) is not None:
            print(f"kvagent serve: error: {refusal}", file=sys.stderr)
        return 2  # the model did not load, or refused the configuration
    if (error := shutdown_error(app)) is not None:
        print(f"kvagent serve: error: the shutdown failed: {error}", file=sys.stderr)
        return 1
    return 0


async def _serve(server: object, sock: socket.socket,
                 drain: Callable[[], Awaitable[None]]) -> None:
    """Serve until a signal; the first starts the graceful shutdown and ``drain`` (the
    host stops the steps still running after the grace period), a second forces it."""
    async with anyio.create_task_group() as tg:
        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    print(f"kvagent serve: {signal.Signals(sig).name}: shutting down",
                          file=sys.stderr, flush=True)
                    if server.should_exit:  # type: ignore[attr-defined]
                        server.force_exit = True  # type: ignore[attr-defined]
                    else:
                        tg.start_soon(drain)
                    server.should_exit = True  # type: ignore[attr-defined]

        tg.start_soon(on_signals)
        try:
            await server.serve(sockets=[sock])  # type: ignore[attr-defined]
        except SystemExit:
            # uvicorn's way of saying the startup failed (``sys.exit`` in ``startup``): the
            # cause is logged or kept in the app's state, and ``server.started`` is False
            pass
        tg.cancel_scope.cancel()
