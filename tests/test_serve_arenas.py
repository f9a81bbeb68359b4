"""``kvagent serve``'s process keeps one malloc arena for every thread
(``tune_malloc``): worker threads that each ran a KV splice — a few hundred rows of
just under ``BIG_BUFFER_BYTES`` each, below the mmap threshold — share one high-water mark
instead of keeping one each."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import threading
from runtime.commands.serve import BIG_BUFFER_BYTES, tune_malloc
if {apply}:
    assert tune_malloc()

def anon_mib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1]) >> 10

def splice():  # per layer's rows just under the threshold, copied a few times, then freed
    rows = [bytearray(BIG_BUFFER_BYTES - 4096 * (i % 8 + 1)) for i in range(72)]
    for b in rows:
        b[::4096] = b"x" * len(b[::4096])  # touched, as rows read out are
    del rows

# worker threads that stay alive (an anyio pool's), each in turn running a splice
turns = [threading.Event() for _ in range(4)]
done = [threading.Event() for _ in range(4)]
leave = threading.Event()

def worker(i):
    bytearray(64)  # the thread's first allocation: it takes its arena now, all are alive
    turns[i].wait()
    splice()
    done[i].set()
    leave.wait()

threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
base = anon_mib()
for i in range(4):
    turns[i].set()
    done[i].wait()
print(anon_mib() - base)
leave.set()
for t in threads:
    t.join()
"""


def _retained_mib(apply: bool) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(apply=apply)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc, /proc")
def test_worker_threads_share_one_arena_high_water_mark() -> None:
    shared = _retained_mib(True)
    assert shared < 100, shared  # one splice's worth (72 MiB) at most
    # without it every worker thread keeps its own: about four splices' worth
    assert _retained_mib(False) > shared + 100
