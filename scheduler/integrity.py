"""The scheduler's integrity check: what the ledger says against what the engine reports.

Every comparison sets two INDEPENDENT counts side by side (a check that derives one side from
the other cannot fail):

* each episode's ledger holding  vs  the engine's own size of its sequence
  (``llama_state_seq_get_size``, 0 when empty) + the bytes of the checkpoints its published
  state references + the bytes of its store's arrays;
* the ledger's owners  vs  the open episodes (no holding outlives its episode);
* the image cache's ledger holding  vs  the engine cache's capacity, and the cache's byte
  counter vs the sum of its entries;
* the engine's count of live checkpoints (weakref-tracked)  vs  the checkpoints the published
  states reference; the same for the screenshot store's entries (``Engine.kv_keep``);
* the sequences that hold tokens  vs  the sequences the open episodes own; the free list,
  the episodes' sequences and the spare sequence partition the engine's sequences; the
  decode lanes hold nothing;
* no reservation open and the peak within the budget.

Meaningful only when the scheduler is idle (no job planning or running); the scheduler runs
it then under ``KVAGENT_DEBUG=1``, and the tests run it after every scheduler test.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.kv_patch import StoredKv
from cachepolicy.engine.records import MemoryReport
from scheduler.errors import IntegrityError
from scheduler.ledger import MemoryLedger
from scheduler.slots import IMAGE_CACHE, Slot


def _arrays(kv: StoredKv) -> list[np.ndarray]:
    rows, patch = kv.rows, kv.patch
    out = [*rows.k, *rows.v]
    if patch is not None:
        out += [*patch.k_a, *patch.k_b, *patch.v_a, *patch.v_b]
    return out


def check_integrity(engine: Engine, ledger: MemoryLedger,
                    slots: Mapping[str, Slot], free_seqs: Iterable[int],
                    spare_seq: int | None) -> None:
    """Raise ``IntegrityError`` listing every mismatch (see the module docstring)."""
    problems: list[str] = []
    if any(s.jobs for s in slots.values()):
        raise IntegrityError("check_integrity needs an idle scheduler (jobs are running)")
    mem = engine.memory()
    holdings = ledger.holdings()
    snap = ledger.snapshot()

    for slot in slots.values():
        ep = slot.cache
        engine_bytes = mem.seq_state_bytes.get(ep.seq, 0)
        ckpt_bytes = sum(len(c.checkpoint.data) for c in ep.state.checkpoints)
        # the store's arrays, counted from the arrays themselves
        store_bytes = sum(a.nbytes for s in ep.state.stored for a in _arrays(s.kv))
        held = holdings.get(ep.episode_id, 0)
        if held != engine_bytes + ckpt_bytes + store_bytes:
            problems.append(
                f"episode {ep.episode_id}: the ledger holds {held} bytes; the engine reports "
                f"{engine_bytes} for sequence {ep.seq} + {ckpt_bytes} of checkpoints + "
                f"{store_bytes} of stored screenshot KV "
                f"(= {engine_bytes + ckpt_bytes + store_bytes})")
    strays = set(holdings) - set(slots) - {IMAGE_CACHE}
    if strays:
        problems.append(f"the ledger holds bytes for owners that are not open: {sorted(strays)}")

    cache = engine.image_cache_stats()  # one read: an encode ahead may be filling it now
    if holdings.get(IMAGE_CACHE, 0) != cache.max_bytes:
        problems.append(f"the ledger holds {holdings.get(IMAGE_CACHE, 0)} bytes for the image "
                        f"cache, whose capacity is {cache.max_bytes}")
    if cache.nbytes != cache.entry_bytes or cache.nbytes > cache.max_bytes:
        problems.append(f"the image cache counts {cache.nbytes} bytes; its entries hold "
                        f"{cache.entry_bytes}; capacity {cache.max_bytes}")

    referenced = {id(c.checkpoint): len(c.checkpoint.data)
                  for s in slots.values() for c in s.cache.state.checkpoints}
    mem = _settled(engine, mem, lambda m: (m.live_checkpoints, m.live_checkpoint_bytes),
                   (len(referenced), sum(referenced.values())))
    if (mem.live_checkpoints, mem.live_checkpoint_bytes) != (len(referenced),
                                                             sum(referenced.values())):
        problems.append(
            f"the engine has {mem.live_checkpoints} live checkpoints "
            f"({mem.live_checkpoint_bytes} bytes); published states reference "
            f"{len(referenced)} ({sum(referenced.values())} bytes)")

    stored = {id(e.kv): e.kv.nbytes for s in slots.values() for e in s.cache.state.stored}
    mem = _settled(engine, mem, lambda m: (m.live_stored_kv, m.live_stored_kv_bytes),
                   (len(stored), sum(stored.values())))
    if (mem.live_stored_kv, mem.live_stored_kv_bytes) != (len(stored), sum(stored.values())):
        problems.append(
            f"the engine has {mem.live_stored_kv} live store entries "
            f"({mem.live_stored_kv_bytes} bytes); published states reference "
            f"{len(stored)} ({sum(stored.values())} bytes)")

    owned = {s.cache.seq for s in slots.values()}
    stray_seqs = set(mem.seq_state_bytes) - owned
    if stray_seqs:
        problems.append(f"sequences {sorted(stray_seqs)} hold tokens but no open episode "
                        "owns them")
    free = list(free_seqs)
    spare = {spare_seq} if spare_seq is not None else set()
    everything = sorted(free + sorted(owned) + sorted(spare))
    if everything != list(range(engine.config.n_seq_max)):
        problems.append(f"free {sorted(free)} + owned {sorted(owned)} + spare {sorted(spare)} "
                        f"do not partition the engine's {engine.config.n_seq_max} sequences")

    if mem.lanes_in_use:
        problems.append(f"decode lanes {list(mem.lanes_in_use)} hold cells while idle")
    if snap.reserved:
        problems.append(f"{snap.reserved} bytes are reserved while idle: "
                        f"{ledger.reservations()}")
    if snap.peak > snap.budget or snap.held > snap.budget:
        problems.append(f"the ledger went past its budget: {snap}")
    if problems:
        raise IntegrityError("; ".join(problems))


def _settled(engine: Engine, mem: MemoryReport,
             live: Callable[[MemoryReport], tuple[int, int]],
             want: tuple[int, int]) -> MemoryReport:
    """``engine.memory()`` once the engine's live count of something (``live``) equals the
    published states' (``want``), or after a short grace if it never does.

    A live object the published states do not reference is either garbage (kept only by a
    reference cycle: ``gc.collect``) or still held for a moment by anyio's worker thread,
    which reports a call's result before it drops its reference to the call (e.g. a
    transaction holding checkpoints or store entries): on a busy machine the event loop can
    get here first, so that thread gets the GIL a few times before a difference is a leak
    (seen under Ray's actor event loop: runtime/cluster)."""
    if live(mem) == want:
        return mem
    gc.collect()
    mem = engine.memory()
    for _ in range(20):
        if live(mem) == want:
            break
        time.sleep(0.005)
        mem = engine.memory()
    return mem
