"""Test helper: a real ``kvagent serve`` process on loopback (the forged tiny model), started
the way a user starts it and stopped with SIGTERM (``runtime.bench.serve_process``), checked to
have exited cleanly."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from runtime.bench.serve_process import ServeProcess, serve_process

Served = ServeProcess


@contextmanager
def kvagent_serve(model_dir: Path, tmp: Path, *args: str, timeout: float = 120.0,
                  expect_clean_exit: bool = True,
                  launcher: Sequence[str] = ("-m", "runtime.cli")) -> Iterator[ServeProcess]:
    """Start ``kvagent serve --port 0`` on ``model_dir``'s model.gguf + mmproj.gguf; yield
    it; SIGTERM it at the end (and check it exited cleanly, closing every episode)."""
    err = tmp / f"serve-{time.monotonic_ns()}.err"
    with serve_process(["--threads", "1", "--model", str(model_dir / "model.gguf"),
                        "--mmproj", str(model_dir / "mmproj.gguf"), "--ctx", "4096", *args],
                       err, start_timeout=timeout, launcher=launcher) as served:
        yield served
    if expect_clean_exit:
        text = served.stderr()
        assert served.exit_code == 0, text[-3000:]
        assert "serve_host_closed" in text and "Traceback" not in text, text[-3000:]
