"""``python -m vmenv.osworld_vm``: serve the simulated desktop behind OSWorld's VM API.

    python -m vmenv.osworld_vm --port 0 --task open-terminal --screen 1280x720 \\
        [--screenshot-size 2560x1440] [--format png|jpeg] [--host 127.0.0.1]

Binds a loopback address only (``--port 0``: a free port), then prints one JSON line on
stdout when it accepts requests: ``{"event": "osworld_vm_ready", "host": ..., "port": ...,
"pid": ...}`` (logs go to stderr).  Runs until SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import socket
import sys

import anyio
import structlog
import uvicorn

from vmenv.osworld_vm.app import make_app
from vmenv.osworld_vm.machine import SimMachine
from vmenv.osworld_vm.screens import ScreenshotSpec
from vmenv.errors import UnknownTaskError
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.tasks import default_tasks

from vmenv.actions.coords import parse_wxh
from vmenv.osworld_vm.process import READY_EVENT
#: Seconds uvicorn may take to start accepting on the bound socket.
STARTUP_TIMEOUT_S = 30.0


def _size(text: str) -> tuple[int, int]:
    try:
        return parse_wxh(text, option="size")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _task(text: str) -> str:
    """A classic task name or a sampled instance KIND@SEED."""
    try:
        resolve_task(text, default_tasks())
    except UnknownTaskError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _loopback(text: str) -> str:
    try:
        ok = ipaddress.ip_address(text).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r} is not a loopback address (127.0.0.0/8, ::1)")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m vmenv.osworld_vm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", type=_loopback, default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed when ready)")
    p.add_argument("--task", type=_task, default="open-terminal",
                   help="a task name or KIND@SEED (a randomized instance)")
    p.add_argument("--screen", type=_size, default=(1280, 720), help="the VM screen, WxH")
    p.add_argument("--screenshot-size", type=_size, default=None,
                   help="screenshots at this size instead of the screen's (HiDPI-like)")
    p.add_argument("--format", choices=("png", "jpeg"), default="png")
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Bind, start uvicorn on the socket, announce readiness, serve until a signal."""
    machine = SimMachine(args.task, args.screen)
    app = make_app(machine, ScreenshotSpec(args.screenshot_size, args.format))
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False,
                                           lifespan="off"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        with anyio.fail_after(STARTUP_TIMEOUT_S):
            while not server.started:
                await anyio.sleep(0.01)
        print(json.dumps({"event": READY_EVENT, "host": args.host, "port": port,
                          "pid": os.getpid()}), flush=True)
        structlog.get_logger("kvagent.osworld_vm").info(
            READY_EVENT, host=args.host, port=port, task=args.task, screen=args.screen,
            screenshot_size=args.screenshot_size, format=args.format)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    level = logging.getLevelName(args.log_level.upper())
    structlog.configure(  # stdout carries the ready line only
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(
            level if isinstance(level, int) else logging.WARNING))
    anyio.run(serve, args)


if __name__ == "__main__":
    main()
