"""Cutting an episode's sequence back to where its published state says it can be cut.

Used by memory pressure (rung 1: an idle episode's window is dropped, its next step reuses as
much as before; the replay rung: its recurrent state is dropped) and by the rollback of a
failed transaction (the sequence is brought back to no more than what the ledger accounts
for).  Runs in the engine's worker thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachepolicy.engine.checkpoint import CheckpointKind
from cachepolicy.errors import UnsafeEditError
from cachepolicy.plan import CacheState

if TYPE_CHECKING:  # the engine's type only: a thin client's imports reach this module
    from cachepolicy.engine import Engine


def cut_to_reuse_point(engine: Engine, seq: int, state: CacheState) -> int | None:
    """Cut ``seq`` back to ``state.trim_pos`` if that is safe; returns the bytes the sequence
    then holds (``Engine.held_bytes``), or None when there is nothing (safe) to cut."""
    info = engine.seq_info(seq)
    if state.trim_pos >= info.next_pos:
        return None
    if state.trim_pos == 0:
        engine.clear(seq)
    elif not engine.kind.has_recurrent_state:
        engine.truncate(seq, state.trim_pos)
    elif state.trim_forgets:  # a tail policy's next step replays from before trim_pos anyway
        engine.replay_cut(seq, state.trim_pos)
    else:
        via = next((c.checkpoint for c in state.checkpoints
                    if c.checkpoint.kind is CheckpointKind.PARTIAL_ONLY
                    and c.checkpoint.pos == state.trim_pos), None)
        if via is None:
            return None
        try:
            engine.truncate(seq, state.trim_pos, via=via)
        except UnsafeEditError:  # the checkpoint is not of this sequence's history: leave it
            return None
    return engine.held_bytes(seq)


def drop_recurrent_state(engine: Engine, seq: int) -> int:
    """The replay rung's last step before eviction: keep ``seq``'s attention KV, drop its
    recurrent state (``Engine.replay_cut`` at its end, zero base: approximate, marked in the
    engine's history); returns the bytes the sequence then holds."""
    engine.replay_cut(seq, engine.seq_info(seq).next_pos)
    return engine.held_bytes(seq)
