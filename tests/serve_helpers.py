"""Test helper: a real ``kvagent serve`` process on loopback (the forged tiny model), started
the way a user starts it and stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs


@attrs.define
class Served:
    url: str
    process: subprocess.Popen[str]
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text()


@contextmanager
def kvagent_serve(model_dir: Path, tmp: Path, *args: str, timeout: float = 120.0,
                  expect_clean_exit: bool = True) -> Iterator[Served]:
    """Start ``kvagent serve --port 0`` on ``model_dir``'s model.gguf + mmproj.gguf; yield
    its URL; SIGTERM it at the end (and check it exited cleanly, closing every episode)."""
    err = tmp / f"serve-{time.monotonic_ns()}.err"
    cmd = [sys.executable, "-m", "runtime.cli", "--log-level", "info", "serve", "--port", "0",
           "--threads", "1", "--model", str(model_dir / "model.gguf"),
           "--mmproj", str(model_dir / "mmproj.gguf"), "--ctx", "4096", *args]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line or proc.poll() is not None:
                break
        if not line:
            raise AssertionError(f"kvagent serve did not start: {err.read_text()[-3000:]}")
        ready = json.loads(line)
        assert ready["event"] == "serve_ready"
        served = Served(ready["url"], proc, err)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    if expect_clean_exit:
        text = err.read_text()
        assert code == 0, text[-3000:]
        assert "serve_host_closed" in text and "Traceback" not in text, text[-3000:]
