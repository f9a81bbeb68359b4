"""A real ``kvagent serve`` on loopback for tests: started the way a user starts it (a separate
process, ``runtime.bench.serve_process``), stopped with SIGTERM, checked to have exited
cleanly (exit 0, every episode closed, no traceback).

``kvagent_serve`` is the general form (any model directory, any flags); ``keyed_server``
serves a model with one fresh API key and says where and how to reach it
(``LoopbackServer``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

from runtime.bench.serve_process import ServeProcess, serve_process

__all__ = ["LoopbackServer", "ServeProcess", "UncleanExitError", "keyed_server",
           "kvagent_serve"]


class UncleanExitError(AssertionError):
    """The server did not exit cleanly when it was stopped."""


@contextmanager
def kvagent_serve(model_dir: Path, tmp: Path, *args: str, timeout: float = 120.0,
                  expect_clean_exit: bool = True,
                  launcher: Sequence[str] = ("-m", "runtime.cli")) -> Iterator[ServeProcess]:
    """Start ``kvagent serve --port 0`` on ``model_dir``'s model.gguf + mmproj.gguf with
    ``args``, its log in ``tmp``; yield it; SIGTERM it at the end and (``expect_clean_exit``)
    raise ``UncleanExitError`` unless it exited 0 having closed every episode."""
    err = tmp / f"serve-{time.monotonic_ns()}.err"
    with serve_process(["--threads", "1", "--model", str(model_dir / "model.gguf"),
                        "--mmproj", str(model_dir / "mmproj.gguf"), "--ctx", "4096", *args],
                       err, start_timeout=timeout, launcher=launcher) as served:
        yield served
    if expect_clean_exit:
        text = served.stderr()
        if served.exit_code != 0 or "serve_host_closed" not in text or "Traceback" in text:
            raise UncleanExitError(f"kvagent serve exited with {served.exit_code}:\n"
                                   f"{text[-3000:]}")


@attrs.frozen
class LoopbackServer:
    """A running ``kvagent serve``: where it listens, the key it takes, the model id clients
    send as ``model``."""

    url: str  # http://127.0.0.1:PORT
    api_key: str = attrs.field(repr=False)
    model: str
    process: ServeProcess = attrs.field(repr=False, eq=False)

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header that carries the key."""
        return {"authorization": f"Bearer {self.api_key}"}

    @property
    def openai_base_url(self) -> str:
        """What an OpenAI client takes as ``base_url``."""
        return f"{self.url}/v1"


@contextmanager
def keyed_server(model_dir: Path, tmp: Path, *args: str,
                 timeout: float = 120.0) -> Iterator[LoopbackServer]:
    """``kvagent_serve`` with one fresh random API key (passed in a key file, so it never
    shows in the process list) on loopback."""
    key = secrets.token_urlsafe(24)
    keyfile = tmp / f"api-key-{time.monotonic_ns()}.txt"
    keyfile.touch(mode=0o600)
    keyfile.write_text(key + "\n")
    with kvagent_serve(model_dir, tmp, "--api-key-file", str(keyfile), *args,
                       timeout=timeout) as served:
        yield LoopbackServer(served.url, key, served.model, served)
