"""The engine's side of the grammar workers (``grammar_worker``): child processes that
match clients' grammars, one grammar per process at a time, each call with a deadline.

A grammar whose call passes its deadline, or whose process dies (each caps its address
space: a grammar that allocates without end dies there), fails with ``GrammarBudgetError``
and its process is ended; nothing else shares that process, so the blame is exact and every
other generation goes on.  A grammar closed cleanly gives its process back to a small idle
pool, so a process start (the interpreter and the vocabulary, well under a second) is paid
once per concurrent client grammar, not per request.  ``GrammarWorkers`` owns every process
it started (``close`` ends them); the engine owns it.
"""

from __future__ import annotations

import os
import select
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import structlog

from cachepolicy.engine.errors import GrammarBudgetError, GrammarWorkerError
from cachepolicy.engine.grammar_state import CharTokens, GrammarParseError
from cachepolicy.engine.grammar_worker import (ACCEPT, ANSWER, CLOSE, FORCED, HELLO, MASK,
                                               OPEN, REQUEST)
from cachepolicy.engine.sampling import GrammarBudget

log = structlog.get_logger("kvagent.engine")

#: A worker's address space beyond what it maps at start (a grammar's stacks live here).
DEFAULT_MEMORY_BYTES = 1 << 30
#: Seconds a new worker may take to load the vocabulary and say hello.
START_TIMEOUT_S = 60.0
#: Seconds to wait for a killed worker to be reaped.
STOP_TIMEOUT_S = 5.0
#: Idle workers kept for the next client grammars (more are ended when their grammar closes).
MAX_IDLE = 4


class _Failed(Exception):
    """A call got no answer: past its deadline (``timed_out``) or the process ended."""

    def __init__(self, timed_out: bool) -> None:
        super().__init__("deadline" if timed_out else "died")
        self.timed_out = timed_out


class _Process:
    """One worker process, used by one grammar at a time (no lock: one thread calls it)."""

    def __init__(self, model_path: Path, memory_bytes: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cachepolicy.engine.grammar_worker", str(model_path),
             str(memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            bufsize=0)
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            # the pipe written without blocking: every write, like every read, has a deadline
            os.set_blocking(self.proc.stdin.fileno(), False)
            _, hello = self.call(HELLO, 0, 0, b"", START_TIMEOUT_S)
        except _Failed as exc:
            self.end()
            raise GrammarWorkerError(f"the grammar worker did not start ({exc})") from None
        except BaseException:
            self.end()
            raise
        (self.n_vocab,) = struct.unpack("<I", hello)
        log.info("grammar_worker_started", pid=self.proc.pid)

    def call(self, op: int, gid: int, arg: int, payload: bytes,
             timeout_s: float) -> tuple[int, bytes]:
        """(status, answer) of one request; ``_Failed`` if none comes within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            self._write(REQUEST.pack(op, gid, arg, len(payload)) + payload, deadline)
            status, n = ANSWER.unpack(self._read(ANSWER.size, deadline))
            return status, self._read(n, deadline)
        except (OSError, ValueError):  # a pipe closed under us (ValueError: a closed file)
            raise _Failed(timed_out=False) from None

    def _write(self, data: bytes, deadline: float) -> None:
        assert self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            _wait(fd, select.POLLOUT, deadline)
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue

    def _read(self, n: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        out = bytearray()
        while len(out) < n:
            _wait(fd, select.POLLIN, deadline)
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise _Failed(timed_out=False)
            out += chunk
        return bytes(out)

    def kill(self) -> None:
        """End the process, leaving its pipes to the thread that may be reading them (it
        sees the end, then ``end`` closes them): a descriptor closed under a reader could be
        reused by another file before its read."""
        if self.proc.poll() is None:
            self.proc.kill()

    def end(self) -> None:
        """Kill and reap the process (idempotent)."""
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("grammar_worker_unkillable", pid=self.proc.pid)


def _wait(fd: int, event: int, deadline: float) -> None:
    """Until ``fd`` is ready for ``event`` (or hung up), or ``_Failed`` at the deadline.
    ``poll``, not ``select``: a server's descriptors may number past select's 1024."""
    poller = select.poll()
    poller.register(fd, event)
    left = deadline - time.monotonic()
    if left <= 0 or not poller.poll(left * 1000):
        raise _Failed(timed_out=True)


class GrammarWorkers:
    """The grammar worker processes of one model's vocabulary."""

    def __init__(self, model_path: Path, *, memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self._model_path, self._memory_bytes = Path(model_path), memory_bytes
        self._lock = threading.Lock()
        self._idle: list[_Process] = []
        self._busy: set[_Process] = set()
        self._closed = False
        self.ended = 0  # processes ended for a grammar's budget (tests and logs read it)

    def open(self, text: str, root: str, budget: GrammarBudget) -> IsolatedGrammar:
        """A new grammar in a worker of its own (``GrammarParseError`` if llama.cpp refuses
        it, ``GrammarBudgetError`` if parsing it passes the budget)."""
        process = self._take()
        grammar = IsolatedGrammar(self, process, budget)
        try:
            status, answer = grammar.call(OPEN, 0, root.encode() + b"\0" + text.encode())
        except BaseException:
            grammar.close()
            raise
        if status:  # nothing was opened in the worker: it goes back as it was
            grammar.abandon()
            raise GrammarParseError(f"the grammar does not parse ({answer.decode()})")
        return grammar

    def close(self) -> None:
        """End every worker (idempotent); later grammars are refused."""
        with self._lock:
            self._closed = True
            idle, busy = self._idle, list(self._busy)
            self._idle = []
        for process in idle:
            process.end()
        for process in busy:  # its grammar's thread sees the end and gives it back
            process.kill()

    @property
    def closed(self) -> bool:
        return self._closed

    def _take(self) -> _Process:
        with self._lock:
            if self._closed:
                raise GrammarWorkerError("the engine is closed")
            process = self._idle.pop() if self._idle else None
        if process is None:
            process = _Process(self._model_path, self._memory_bytes)
        with self._lock:
            if self._closed:
                process.end()
                raise GrammarWorkerError("the engine is closed")
            self._busy.add(process)
        return process

    def give_back(self, process: _Process, healthy: bool) -> None:
        """A grammar is done with ``process``: idle again, or ended (unhealthy, or enough
        idle ones, or the workers closed)."""
        with self._lock:
            self._busy.discard(process)
            keep = healthy and not self._closed and len(self._idle) < MAX_IDLE
            if keep:
                self._idle.append(process)
            elif not healthy:
                self.ended += 1
        if not keep:
            process.end()


class IsolatedGrammar:
    """A client's grammar in a worker of its own (``GrammarState``), within its budget."""

    def __init__(self, workers: GrammarWorkers, process: _Process,
                 budget: GrammarBudget) -> None:
        self._workers, self._process, self._budget = workers, process, budget
        self._spent_s = 0.0
        self._allowed: np.ndarray | None = None
        self._healthy = True
        self._closed = False

    def allowed(self) -> np.ndarray:
        if self._allowed is None:
            bits = np.frombuffer(self._request(MASK), dtype=np.uint8)
            self._allowed = np.unpackbits(bits, count=self._process.n_vocab).astype(bool)
        return self._allowed

    def accept(self, token: int) -> None:
        self._allowed = None
        self._request(ACCEPT, 0, np.asarray([token], dtype="<i4").tobytes())

    def forced_text(self, chars: CharTokens, limit: int) -> bytes:
        # the worker asks its own CharTokens: the same vocabulary, so the same candidates
        return self._request(FORCED, limit)

    def abandon(self) -> None:
        """Give the worker back without closing a grammar (none was opened in it)."""
        self._closed = True
        self._workers.give_back(self._process, self._healthy)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._healthy:
            try:
                status, _ = self._process.call(CLOSE, 0, 0, b"", self._budget.call_s)
                self._healthy = status == 0
            except _Failed:
                self._healthy = False
        self._workers.give_back(self._process, self._healthy)

    def _request(self, op: int, arg: int = 0, payload: bytes = b"") -> bytes:
        status, answer = self.call(op, arg, payload)
        if status:
            raise GrammarWorkerError(f"the grammar worker refused a call: {answer.decode()}")
        return answer

    def call(self, op: int, arg: int, payload: bytes) -> tuple[int, bytes]:
        """One call within what is left of the budget (the time is charged to it)."""
        if not self._healthy:
            raise GrammarBudgetError("this grammar already passed its budget")
        left = self._budget.total_s - self._spent_s
        timeout = min(self._budget.call_s, left)
        started = time.monotonic()
        try:
            if left <= 0:
                raise _Failed(timed_out=True)
            return self._process.call(op, 0, arg, payload, timeout)
        except _Failed as exc:
            self._healthy = False
            if self._workers.closed:  # the engine is closing: not the grammar's doing
                raise GrammarWorkerError("the engine closed during the generation") from None
            log.warning("grammar_over_budget", pid=self._process.proc.pid, reason=str(exc),
                        spent_s=round(self._spent_s + time.monotonic() - started, 3))
            raise GrammarBudgetError(self._why(exc.timed_out, timeout)) from None
        finally:
            self._spent_s += time.monotonic() - started

    def _why(self, timed_out: bool, timeout: float) -> str:
        if not timed_out:
            return ("matching the grammar ended its worker (out of its memory, or a crash); "
                    "simplify the grammar")
        if timeout < self._budget.call_s:
            return (f"matching the grammar took more than {self._budget.total_s:g} s in "
                    "this generation; simplify the grammar")
        return (f"matching the grammar took more than {self._budget.call_s:g} s for one "
                "token (its cost grows with its ambiguity); simplify the grammar")
