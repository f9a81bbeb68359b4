"""Run the loopback VM server as a separate process (a VM is another machine).

``vm_server(...)`` starts ``python -m vmenv.osworld_vm`` as a subprocess, waits (bounded) for
its ready line, yields where it listens, and stops it on exit: SIGTERM, then SIGKILL if it
does not exit in time.  Its stderr (the server's logs) goes to a temporary file, quoted in
the error if it dies before it is ready.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import attrs

from vmenv.errors import VmEnvError

READY_EVENT = "osworld_vm_ready"  # what __main__ prints (kept here: no Starlette import)
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class VmServerError(VmEnvError):
    """The loopback VM server did not start (it died, or was not ready in time)."""


@attrs.frozen
class VmServer:
    """A running loopback VM server."""

    host: str
    port: int
    pid: int

    @property
    def address(self) -> str:
        """``host:port`` — what the DesktopEnv provider takes as ``path_to_vm``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def server_command(task: str, screen: tuple[int, int], *,
                   screenshot_size: tuple[int, int] | None = None, fmt: str = "png",
                   python: str = sys.executable) -> list[str]:
    """The argv that starts a server on a free loopback port."""
    cmd = [python, "-m", "vmenv.osworld_vm", "--port", "0", "--task", task,
           "--screen", f"{screen[0]}x{screen[1]}", "--format", fmt]
    if screenshot_size is not None:
        cmd += ["--screenshot-size", f"{screenshot_size[0]}x{screenshot_size[1]}"]
    return cmd


@contextmanager
def vm_server(task: str = "open-terminal", screen: tuple[int, int] = (1280, 720), *,
              screenshot_size: tuple[int, int] | None = None, fmt: str = "png",
              ready_timeout: float = READY_TIMEOUT_S) -> Iterator[VmServer]:
    """Start a loopback VM server subprocess; yield it once ready; stop it on exit."""
    cmd = server_command(task, screen, screenshot_size=screenshot_size, fmt=fmt)
    with tempfile.TemporaryFile() as errlog:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=errlog)
        try:
            assert proc.stdout is not None
            yield _wait_ready(proc, proc.stdout, errlog, ready_timeout)
        finally:
            _stop(proc)


def _wait_ready(proc: subprocess.Popen[bytes], out: IO[bytes], errlog: IO[bytes],
                timeout: float) -> VmServer:
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(out, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                continue
            line = out.readline()  # the server writes whole lines and flushes
            if not line:
                proc.wait(timeout=STOP_TIMEOUT_S)
                raise VmServerError(f"the VM server exited ({proc.returncode}) before it was "
                                    f"ready: {_tail(errlog)}")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("event") == READY_EVENT:
                return VmServer(str(msg["host"]), int(msg["port"]), int(msg["pid"]))
    raise VmServerError(f"the VM server was not ready after {timeout} s: {_tail(errlog)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)
    if proc.stdout is not None:
        proc.stdout.close()


def _tail(errlog: IO[bytes], limit: int = 2000) -> str:
    errlog.seek(0)
    text = errlog.read().decode("utf-8", "replace").strip()
    return text[-limit:] or "(no output on stderr)"
