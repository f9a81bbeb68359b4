"""A ``kvagent serve`` process, started as a user starts it and stopped with SIGTERM: what
``kvagent bench-serve`` measures against (the server that ships, over real HTTP) and what the
serve tests talk to."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

#: How long a server may take to load its model and listen.
START_TIMEOUT_S = 180.0
#: How long a SIGTERMed server may take to close its episodes and exit.
STOP_TIMEOUT_S = 60.0


class ServeStartError(RuntimeError):
    """The server exited or said nothing before it was ready."""


@attrs.define
class ServeProcess:
    url: str
    model: str  # the id clients send as "model"
    process: subprocess.Popen[str]
    stderr_path: Path
    exit_code: int | None = None  # set once stopped

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextmanager
def serve_process(args: list[str], stderr_path: Path, *,
                  start_timeout: float = START_TIMEOUT_S,
                  launcher: Sequence[str] = ("-m", "runtime.cli")) -> Iterator[ServeProcess]:
    """Run ``kvagent serve --port 0 ARGS`` (the stderr log to ``stderr_path``) until the block
    ends; yields once the server printed its ready line.  The process is SIGTERMed on the
    way out (killed if it does not exit within ``STOP_TIMEOUT_S``); ``exit_code`` says how
    it ended.  ``launcher``: the interpreter's arguments that run kvagent's command line
    (a test's ``-c`` script injects a fault first, then calls ``runtime.cli.main``)."""
    cmd = [sys.executable, *launcher, "--log-level", "info", "serve", "--port", "0", *args]
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    served: ServeProcess | None = None
    try:
        assert proc.stdout is not None
        line = _first_line(proc, start_timeout)
        if not line:
            raise ServeStartError("kvagent serve did not start: "
                                  + stderr_path.read_text(errors="replace")[-3000:])
        ready = json.loads(line)
        if ready.get("event") != "serve_ready":
            raise ServeStartError(f"unexpected first line from kvagent serve: {line!r}")
        served = ServeProcess(ready["url"], ready["model"], proc, stderr_path)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        if served is not None:
            served.exit_code = code


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The server's first stdout line, or "" if it exits or the timeout passes first."""
    import selectors

    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(timeout=min(left, 1.0)):
                return proc.stdout.readline()
            if proc.poll() is not None:
                return ""
    return ""
