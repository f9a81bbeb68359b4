"""Where can a step start from?  The longest prefix of the new prompt the cache already has.

Restore points, for a sequence holding runs r_0..r_n and published checkpoints:
* KEEP — the whole sequence is a prefix of the prompt;
* TRIM — attention-only models: cut the sequence back after any matching run;
* TRUNCATE — hybrid / recurrent: a PARTIAL_ONLY checkpoint whose history is a prefix of both
  the sequence and the prompt (restore its recurrent state, trim the attention KV);
* RESTORE — a FULL checkpoint whose history is a prefix of the prompt;
* CLEAR — nothing matches.
Matching compares chained digests, so a match means identical content in identical pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

from cachepolicy.engine.checkpoint import CheckpointKind, ModelKind
from cachepolicy.pieces import Piece, digests
from cachepolicy.plan import CacheView, Start, StartKind

_PREFERENCE = {StartKind.KEEP: 4, StartKind.TRIM: 3, StartKind.TRUNCATE: 2,
               StartKind.RESTORE: 1, StartKind.CLEAR: 0}


def best_start(pieces: Sequence[Piece], view: CacheView, kind: ModelKind, *,
               max_reuse: int | None = None) -> tuple[Start, int]:
    """The restore point reusing the most pieces (at most ``max_reuse``: a plan that decodes
    must prefill its last piece to get logits); returns (start, number of pieces reused)."""
    want = digests(pieces)[: len(pieces) if max_reuse is None else max_reuse]
    hist = view.seq.history
    lcp = 0
    while lcp < min(len(want), len(hist)) and want[lcp] == hist[lcp].digest:
        lcp += 1
    options: list[tuple[int, Start]] = [(0, Start(StartKind.CLEAR))]
    if hist and lcp == len(hist):
        options.append((lcp, Start(StartKind.KEEP, pos=view.seq.next_pos)))
    elif lcp > 0 and kind is ModelKind.ATTENTION:
        options.append((lcp, Start(StartKind.TRIM, pos=hist[lcp - 1].end_pos)))
    for named in view.state.checkpoints:
        ckpt = named.checkpoint
        n = len(ckpt.history)
        if n == 0 or n > len(want) or want[n - 1] != ckpt.digest:
            continue
        if ckpt.kind is CheckpointKind.PARTIAL_ONLY:
            if n <= lcp:  # the sequence still holds the attention KV of that prefix
                options.append((n, Start(StartKind.TRUNCATE, pos=ckpt.pos, checkpoint=ckpt)))
        else:
            options.append((n, Start(StartKind.RESTORE, pos=ckpt.pos, checkpoint=ckpt)))
    reused, start = max(options, key=lambda o: (o[0], _PREFERENCE[o[1].kind]))
    return start, reused
