"""The KV cache's pages llama.cpp cleared are given back until cells are written
(``cachepolicy/engine/zero_pages.py``, issue 48: ``kvagent serve``'s peak RSS at bench-peer's
N = 4 held every cell of 8 streams of 8192 cells, a quarter of them ever used)."""

from __future__ import annotations

import ctypes
import mmap
import sys

import attrs
import numpy as np
import pytest

from cachepolicy.engine import Engine
from cachepolicy.engine.zero_pages import CHUNK, release_zero_chunks
from runtime.testing.engines import FORGED_CONFIG

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _rss_in(a: int, b: int) -> int:
    """Resident bytes of the process's mappings inside [a, b)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < b and hi > a
            elif head == "Rss:" and inside:
                total += int(line.split()[1]) * 1024
    return total


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def test_only_all_zero_chunks_are_dropped_and_the_bytes_stay() -> None:
    m = mmap.mmap(-1, 5 * CHUNK)  # private anonymous
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    first = -(-base // CHUNK) * CHUNK  # the first whole chunk
    view = np.frombuffer(m, dtype=np.uint8)
    view[:] = 0  # resident, all zero
    marked = first - base + CHUNK + 12345  # one byte in the second whole chunk
    view[marked] = 7
    before = _rss_in(base, base + len(m))
    dropped = release_zero_chunks(frozenset({(base, base + len(m))}), min_bytes=0)
    whole = ((base + len(m)) // CHUNK * CHUNK - first) // CHUNK
    assert dropped == (whole - 1) * CHUNK  # every whole chunk but the marked one
    assert _rss_in(base, base + len(m)) <= before - dropped + (1 << 16)
    assert view[marked] == 7 and int(view.sum()) == 7  # the same bytes
    view[0:CHUNK * 4] = 1  # written again: faults in fresh pages
    assert int(view[:CHUNK * 4].sum()) == CHUNK * 4
    del view
    m.close()


def test_an_engine_holds_its_kv_cache_as_cells_are_written(kvagent_forged) -> None:
    """A context of 16 streams of 8192 cells: loading it no longer makes every KV page
    resident (~70 MB on the forged tiny llama), and a prefill still reads back what it
    wrote."""
    model = kvagent_forged("llama", vision=False)
    config = attrs.evolve(FORGED_CONFIG, n_ctx_per_seq=8192, n_seq_max=15, decode_rows=1)
    rss0 = _rss()
    engine = Engine(model.model_path, None, config)
    try:
        kv_bytes = engine.kv_bytes_per_token * config.n_ctx
        assert kv_bytes > 48 << 20
        assert _rss() - rss0 < kv_bytes // 2
        tokens = list(range(10, 300))
        engine.prefill_tokens(0, tokens, logits=False)
        rows = engine.kv_read(0)
        assert rows.n_cells == len(tokens) and list(rows.pos) == list(range(len(tokens)))
        assert all(np.any(k != 0) for k in rows.k)  # written, not the zero pages
    finally:
        engine.close()
