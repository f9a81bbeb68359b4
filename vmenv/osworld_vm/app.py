"""The loopback VM server's HTTP API (Starlette): the endpoints OSWorld's controllers call.

OSWorld's VM API, as ``PythonController`` / ``SetupController`` / the evaluators' getters
use it:

* ``GET /screenshot`` — the screen, PNG or JPEG (``ScreenshotSpec``);
* ``POST /execute``, ``POST /setup/execute`` — ``{"command", "shell"}`` → ``{"status",
  "output", "error", "returncode"}`` (``SimMachine.execute``);
* ``GET /platform`` — ``Linux`` (text);
* ``POST /screen_size`` — ``{"width", "height"}`` of the screen (not of the screenshot: they
  may differ);
* ``GET /cursor_position`` — ``[x, y]`` in screen pixels;
* ``GET /accessibility`` — ``{"AT": xml}``; ``GET /terminal`` — ``{"output": lines}``;
* ``POST /start_recording`` / ``POST /end_recording`` — the states shown in between, as an
  APNG (400 if no recording was started);
* ``POST /run_python``, ``POST /run_bash_script`` — refused (code is never executed): an
  error result;

and two of its own, which a hypervisor would do for a real VM: ``POST /simdesk/revert``
(the provider's snapshot revert) and ``GET /simdesk/status`` (task, verdict, pointer, the
actions applied — for tests).  Any other path is a 404.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.to_thread
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from vmenv.osworld_vm import screens
from vmenv.osworld_vm.machine import SimMachine
from vmenv.osworld_vm.protocol import VM_PLATFORM

log = structlog.get_logger("kvagent.osworld_vm")

#: Larger request bodies are refused (OSWorld's commands are a few hundred bytes).
MAX_BODY_BYTES = 1 << 20
_REFUSED = "code execution is not available on the simulated desktop (kvagent never runs code)"


def make_app(machine: SimMachine, spec: screens.ScreenshotSpec) -> Starlette:
    """The Starlette app serving ``machine``.  Handlers run on the event loop and change the
    machine without awaiting in between (so each request is atomic); rendering, which only
    reads an immutable state, runs in one worker thread at a time."""
    limiter = anyio.CapacityLimiter(1)

    async def render(fn: Any, *args: Any) -> bytes:
        data: bytes = await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
        return data

    async def screenshot(_request: Request) -> Response:
        data = await render(screens.screenshot, machine.state, spec)
        return Response(data, media_type=spec.media_type)

    async def execute(request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict) or "command" not in body:
            return _error(400, "expected a JSON object with 'command'")
        result = machine.execute(body["command"], bool(body.get("shell", False)))
        log.debug("osworld_vm_execute", path=request.url.path, returncode=result.returncode)
        return JSONResponse(result.as_json())

    async def platform(_request: Request) -> Response:
        return PlainTextResponse(VM_PLATFORM)

    async def screen_size(_request: Request) -> Response:
        w, h = machine.screen
        return JSONResponse({"width": w, "height": h})

    async def cursor_position(_request: Request) -> Response:
        return JSONResponse(list(machine.state.pointer))

    async def accessibility(_request: Request) -> Response:
        return JSONResponse({"AT": screens.accessibility_tree(machine.state)})

    async def terminal(_request: Request) -> Response:
        return JSONResponse({"output": "\n".join(machine.state.terminal.lines)})

    async def start_recording(_request: Request) -> Response:
        machine.start_recording()
        return JSONResponse({"status": "success", "message": "Started recording."})

    async def end_recording(_request: Request) -> Response:
        frames = machine.end_recording()
        if frames is None:
            return _error(400, "no recording in progress")
        data = await render(screens.recording, frames, spec.size)
        return Response(data, media_type="image/apng")

    async def run_code(request: Request) -> Response:
        log.warning("osworld_vm_refused_run", path=request.url.path)
        return JSONResponse({"status": "error", "message": _REFUSED, "output": "",
                             "error": _REFUSED, "returncode": 127})

    async def revert(_request: Request) -> Response:
        machine.revert()
        return JSONResponse({"status": "success", "task": machine.task.name})

    async def status(_request: Request) -> Response:
        return JSONResponse(machine.status())

    return Starlette(routes=[
        Route("/screenshot", screenshot, methods=["GET"]),
        Route("/execute", execute, methods=["POST"]),
        Route("/setup/execute", execute, methods=["POST"]),
        Route("/platform", platform, methods=["GET"]),
        Route("/screen_size", screen_size, methods=["GET", "POST"]),
        Route("/cursor_position", cursor_position, methods=["GET"]),
        Route("/accessibility", accessibility, methods=["GET"]),
        Route("/terminal", terminal, methods=["GET"]),
        Route("/start_recording", start_recording, methods=["POST"]),
        Route("/end_recording", end_recording, methods=["POST"]),
        Route("/run_python", run_code, methods=["POST"]),
        Route("/run_bash_script", run_code, methods=["POST"]),
        Route("/simdesk/revert", revert, methods=["POST"]),
        Route("/simdesk/status", status, methods=["GET"]),
    ])


async def _json_body(request: Request) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def _error(status: int, message: str) -> Response:
    return JSONResponse({"status": "error", "message": message}, status_code=status)
