"""The one OS thread on which a llama.cpp context (or a vision encoder) computes.

ggml's CPU backend runs every graph as an OpenMP parallel region, and libgomp keeps a pool
of worker threads per *calling* thread.  Once the process holds more OpenMP threads than it
has cores — two calling threads with pools of ``n_threads`` on a 2-core machine — libgomp
stops spinning at barriers (its "throttled" spin) and sleeps at each of the graph's many
barriers instead.  Measured on the forged tiny qwen35, 2 threads, 2 cores: a decode-lanes
call took 0.7 ms from the only thread that had computed and 5-6 ms from any other, i.e. from
the anyio worker threads the runtime calls the engine from.  So every compute call of one
engine goes through one long-lived thread (``run``): one pool, whichever thread asks.  The
callers keep their own threads and locks; they block on the answer exactly as they blocked
on the call itself.

Invariant: the thread is owned by its engine part, started at construction and joined by
``close`` (after which ``run`` raises ``EngineError``).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from cachepolicy.engine.errors import EngineError

_T = TypeVar("_T")

#: How long ``close`` waits for a call in progress to finish (a decode or an encode; far
#: longer than any of them takes).
JOIN_TIMEOUT_S = 600.0


class ComputeThread:
    def __init__(self, name: str) -> None:
        self._thread: threading.Thread | None = None

        def remember() -> None:
            self._thread = threading.current_thread()

        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=remember)
        self._pool.submit(lambda: None).result()  # the thread exists (and is known) now
        self._closed = False

    def run(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` on the compute thread (directly when called from it); its result or
        its exception."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        if self._closed:
            raise EngineError("compute thread is closed")
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        """Finish the call in progress, if any, and join the thread."""
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
