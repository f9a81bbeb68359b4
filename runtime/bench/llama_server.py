"""A user-supplied ``llama-server`` process (llama.cpp's own server), started on a free
loopback port, ready once ``GET /health`` answers 200, and stopped with SIGTERM: the peer
``kvagent bench-peer`` measures kvagent against.  Nothing of llama.cpp ships with kvagent:
the binary is the user's (docs/benchmarks.md says how to build the one llama-cpp-python
vendors)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

#: How long llama-server may take to load the model and listen.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


class PeerStartError(RuntimeError):
    """llama-server exited, or did not answer ``/health``, before it was ready."""


def check_binary(path: Path) -> str | None:
    """Why ``path`` cannot be run as llama-server (None: it can)."""
    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    if not os.access(path, os.X_OK):
        return f"{path}: not executable"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_args(model: Path, mmproj: Path, *, ctx: int, slots: int, threads: int,
                checkpoints: int = 32) -> list[str]:
    """llama-server's arguments for the bench: the model and projector, ``slots`` parallel
    slots sharing ``ctx`` tokens each, ``threads`` for prompt and generation, and its best
    bounded configuration (a checkpoint at every user message: ``--ctx-checkpoints N -cms
    0``).  Everything else is llama-server's default, as a user runs it."""
    return ["-m", str(model), "--mmproj", str(mmproj), "-c", str(ctx * slots),
            "-np", str(slots), "-t", str(threads), "-tb", str(threads),
            "--ctx-checkpoints", str(checkpoints), "-cms", "0", "--no-webui"]


@attrs.define
class PeerProcess:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def llama_server(binary: Path, args: Sequence[str], log_path: Path, *,
                 start_timeout: float = START_TIMEOUT_S) -> Iterator[PeerProcess]:
    """Run ``binary ARGS --host 127.0.0.1 --port P`` until the block ends (its output to
    ``log_path``); yields once ``/health`` says it is ready."""
    import httpx

    port = free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary), *args, "--host", "127.0.0.1", "--port",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if proc.poll() is not None:
                raise PeerStartError(f"llama-server exited ({proc.returncode}): "
                                     + log_path.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise PeerStartError(f"llama-server did not become ready in {start_timeout} s")
            time.sleep(0.2)
        yield PeerProcess(url, proc, log_path)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT_S)


def peak_rss_bytes(pid: int) -> int | None:
    """A live process's resident-set high-water mark (VmHWM), None where /proc lacks it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
