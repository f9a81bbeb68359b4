"""Giving the KV cache's untouched pages back to the OS after llama.cpp cleared them.

llama.cpp allocates a context's KV cache for every cell of every stream (``n_ctx_per_seq``
cells for each sequence and each decode lane) and clears it with a memset, which makes
every page of it resident: 768 MiB on the forged llama M behind ``kvagent serve
--max-episodes 4`` (8 streams x 8192 cells x 12 KiB), of which a 2000-token window uses a
quarter.  Right after the context is created the buffer holds only zeros, so its pages can be
dropped (``madvise(MADV_DONTNEED)`` on a private anonymous mapping: the next read sees zeros
again, the next write faults in a fresh zero page) — what the process holds then grows with
the cells written, not with the cells allocated.  Nothing llama.cpp computes changes: the
memory reads the same bytes before and after.

Only whole chunks that are all zero, of anonymous private mappings that appeared while the
context was created (``new_mappings``), are dropped, and only before anything is computed
with it (``_load`` calls this on the engine's own thread right after
``llama_init_from_model``): no writer can race the check.  Linux only; elsewhere nothing is
done.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

#: the unit dropped (a huge page's size: a chunk is all zero or kept whole)
CHUNK = 2 << 20
#: smaller new mappings are left alone (the KV buffer and compute buffers are far larger)
MIN_MAPPING = 32 << 20
_MADV_DONTNEED = 4

Mapping = tuple[int, int]  # [start, end) addresses


def anonymous_mappings() -> frozenset[Mapping]:
    """The process's private, writable, anonymous mappings (empty where /proc is absent)."""
    if not sys.platform.startswith("linux"):
        return frozenset()
    out = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                perms = parts[1]
                if len(parts) == 5 and perms.startswith("rw") and perms[3] == "p":
                    a, b = (int(x, 16) for x in parts[0].split("-"))
                    out.add((a, b))
    except OSError:
        return frozenset()
    return frozenset(out)


def release_zero_chunks(mappings: frozenset[Mapping], *, min_bytes: int = MIN_MAPPING) -> int:
    """Drop every ``CHUNK``-aligned chunk of ``mappings`` (those of at least ``min_bytes``)
    whose bytes are all zero; returns the bytes dropped.  The caller guarantees no other
    thread writes there meanwhile."""
    if not mappings:
        return 0
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    words = CHUNK // 8
    for a, b in sorted(mappings):
        if b - a < min_bytes:
            continue
        start, end = -(-a // CHUNK) * CHUNK, b // CHUNK * CHUNK
        if end <= start:
            continue
        memory = np.frombuffer((ctypes.c_uint8 * (end - start)).from_address(start),
                               dtype=np.uint64)
        for i in range((end - start) // CHUNK):
            if not memory[i * words:(i + 1) * words].any():
                if madvise(start + i * CHUNK, CHUNK, _MADV_DONTNEED) == 0:
                    dropped += CHUNK
    return dropped


def new_mappings(before: frozenset[Mapping]) -> frozenset[Mapping]:
    """The address ranges of anonymous mappings now that no mapping covered ``before`` (a
    new mapping the kernel merged with an old neighbour gives only its new part)."""
    out = set()
    old = sorted(before)
    for a, b in anonymous_mappings():
        parts = [(a, b)]
        for c, d in old:
            if d <= a or c >= b:
                continue
            parts = [q for p0, p1 in parts for q in ((p0, min(p1, c)), (max(p0, d), p1))
                     if q[1] > q[0]]
        out.update(parts)
    return frozenset(out)
