"""One record per agent step, and one per episode: everything kvagent measures about a step.

``StepMetrics`` is made once, by the episode driver, from the step's transaction record, the
prefetch that prepared it and the loop's clocks.  metrics.jsonl, the bench JSON, the progress
display and ``KvAgent.last_info`` are all views of it (``as_dict``), so a field means the same
everywhere (docs/bench-json.md is the reference):

* ``prefill_tokens`` — every token prefilled FOR this step: the critical path plus the
  overlapped prefetch that prepared it (``critical_path_prefill_tokens`` +
  ``prefetch_prefill_tokens``).  ``reused_tokens`` — prompt tokens taken from the cache that
  no transaction of this step prefilled (a prefetch whose prediction the step did not use
  is wasted work, not reuse).
* ``prefill_s`` — LLM prefill seconds (restores, prefill, checkpoints) of the critical path
  and the prefetch; the vision encoder is not in it: ``encode_s`` (the new screenshot's
  decode + encode on the critical path, plus encoder time of cache misses;
  ``encode_ahead_s`` of it ran beside a prefetch that was still running).
* ``critical_path_s`` — from the screenshot's bytes being in hand to the action being ready:
  waiting for the prefetch, decoding and encoding the image, prefill, decode, parsing.
"""

from __future__ import annotations

import hashlib
import resource
from collections.abc import Iterable
from typing import Any

import attrs

from scheduler.records import StepRecord
from scheduler.transaction import PrefetchRecord


def rss_bytes() -> int:
    """The process's current resident set size (the peak so far where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return rss_peak_bytes()


def rss_peak_bytes() -> int:
    """The process's resident-set high-water mark (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@attrs.frozen
class StepMetrics:
    """What one step did and cost (see the module docstring for the token/second fields)."""

    episode_id: str
    step: int
    status: str  # ok | degraded | failed
    reason: str = ""  # why degraded / failed
    action: str | None = None  # the decided action in the action language (None: failed)
    parsed: bool = False  # the model's text parsed into an action (else a recorded NoOp)
    #: what the parser changed or refused: clamped / rejected points, ignored calls, why the
    #: text was not an action (the profile's ``Parsed.notes``)
    notes: tuple[str, ...] = ()
    policy: str = ""
    start: str = ""  # how the critical step began: clear / keep / trim / truncate / restore
    generation: int = 0
    new_content_tokens: int = 0
    prefill_tokens: int = 0
    critical_path_prefill_tokens: int = 0
    prefetch_prefill_tokens: int = 0
    reused_tokens: int = 0
    context_tokens: int = 0
    decode_tokens: int = 0
    encode_s: float = 0.0
    #: the part of ``encode_s`` that ran beside the prefetch (the screenshot arrived while
    #: it was still running: ``AgentConfig.encode_ahead``); 0.0 otherwise
    encode_ahead_s: float = 0.0
    prefill_s: float = 0.0
    prefetch_s: float = 0.0  # the prefetch's engine time (prefill + encode)
    prefetch_wait_s: float = 0.0  # the critical path waited this long for the prefetch
    prefetch_error: str = ""
    decode_s: float = 0.0
    critical_path_s: float = 0.0
    vm_s: float = 0.0  # the env executing the action (0.0 until the env has acted)
    step_wall_s: float = 0.0  # screenshot in hand → the next screenshot in hand
    kv_bytes: int = 0
    checkpoint_bytes: int = 0
    forecast_peak_bytes: int = 0
    ledger_peak_bytes: int = 0
    rss_bytes: int = 0
    output_tokens: tuple[int, ...] = ()
    drift_kl: float | None = None
    drift_top1_agree: bool | None = None
    #: the action was decoded from an approximate state (the engine's record): a tail replay
    #: or a removal that shifted positions (relocate, the token evictors) — this step's, its
    #: prefetch's, or an earlier one the sequence still carries — or spliced KV (kamera)
    approximate: bool = False
    #: rows of a matched prefix re-prefilled by tail replay for this step (its prefetch's
    #: and guess's included); part of ``prefill_tokens``
    replay_tokens: int = 0
    #: the guess made for this step's screenshot (``AgentConfig.guess``): "hit" (the same
    #: pixels: the step kept its work), "miss" (cut back before the guessed image) or ""
    guess: str = ""
    guess_prefill_tokens: int = 0  # what the guess prefilled (in ``prefill_tokens`` too)
    #: KV splicing (``StepRecord``): the episode's store after the step (bytes), tokens its
    #: canonical forwards prefilled (the step's and its prefetch's; ``critical_store_tokens``:
    #: the step's own, on the critical path), seconds of the KV edits and of the store
    stored_bytes: int = 0
    store_tokens: int = 0
    critical_store_tokens: int = 0
    splice_s: float = 0.0
    store_s: float = 0.0

    @classmethod
    def decided(cls, record: StepRecord, prefetch: PrefetchRecord | None, *, action: str,
                parsed: bool, build_encode_s: float, critical_path_s: float,
                encode_ahead_s: float = 0.0,
                prefetch_s: float, prefetch_wait_s: float, prefetch_error: str,
                notes: tuple[str, ...] = (), guess: str = "",
                guess_record: PrefetchRecord | None = None) -> StepMetrics:
        pre_tokens = prefetch.prefill_tokens if prefetch is not None else 0
        guess_tokens = guess_record.prefill_tokens if guess_record is not None else 0
        # A prefetch appends after the sequence's end; the step uses its work only when it
        # keeps the sequence as the prefetch left it (a step that cuts back to an earlier
        # checkpoint — a wrong prediction — reused none of it); a wrong guess is cut back
        # to after the prefetch's work, which the step then uses
        if record.start == "keep":
            used = pre_tokens + guess_tokens
        else:
            used = pre_tokens if guess == "miss" else 0
        return cls(
            episode_id=record.episode_id, step=record.step, status=record.status,
            reason=record.reason, action=action, parsed=parsed, notes=notes,
            policy=record.policy,
            start=record.start, generation=record.generation,
            new_content_tokens=record.new_content_tokens,
            prefill_tokens=record.prefill_tokens + pre_tokens + guess_tokens,
            critical_path_prefill_tokens=record.critical_path_prefill_tokens,
            prefetch_prefill_tokens=pre_tokens,
            reused_tokens=record.reused_tokens - used,
            context_tokens=record.context_tokens, decode_tokens=record.decode_tokens,
            encode_s=encode_ahead_s + build_encode_s + record.encode_s,
            encode_ahead_s=encode_ahead_s,
            prefill_s=(record.prefill_s + (prefetch.prefill_s if prefetch is not None else 0.0)
                       + (guess_record.prefill_s if guess_record is not None else 0.0)),
            prefetch_s=prefetch_s, prefetch_wait_s=prefetch_wait_s,
            prefetch_error=prefetch_error, decode_s=record.decode_s,
            critical_path_s=critical_path_s, kv_bytes=record.kv_bytes,
            checkpoint_bytes=record.checkpoint_bytes,
            forecast_peak_bytes=record.forecast_peak_bytes,
            ledger_peak_bytes=record.ledger_peak_bytes, rss_bytes=rss_bytes(),
            output_tokens=record.output_tokens, drift_kl=record.drift_kl,
            drift_top1_agree=record.drift_top1_agree, approximate=record.approximate,
            replay_tokens=(record.replay_tokens
                           + (prefetch.replay_tokens if prefetch is not None else 0)
                           + (guess_record.replay_tokens if guess_record is not None else 0)),
            guess=guess, guess_prefill_tokens=guess_tokens,
            stored_bytes=record.stored_bytes,
            store_tokens=record.store_tokens + (prefetch.store_tokens if prefetch else 0),
            critical_store_tokens=record.store_tokens, splice_s=record.splice_s,
            store_s=record.store_s + (prefetch.store_s if prefetch is not None else 0.0))

    @classmethod
    def failed(cls, episode_id: str, step: int, reason: str, *,
               critical_path_s: float) -> StepMetrics:
        return cls(episode_id=episode_id, step=step, status="failed", reason=reason,
                   critical_path_s=critical_path_s, rss_bytes=rss_bytes())

    @property
    def cache_hit(self) -> float | None:
        """Reused / (reused + prefilled) tokens of the prompt."""
        seen = self.reused_tokens + self.prefill_tokens
        return self.reused_tokens / seen if seen else None

    def after_env(self, vm_s: float, step_wall_s: float) -> StepMetrics:
        return attrs.evolve(self, vm_s=vm_s, step_wall_s=step_wall_s)

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["output_tokens"] = list(self.output_tokens)
        d["notes"] = list(self.notes)
        return d


def output_sha256(steps: Iterable[StepMetrics]) -> str:
    """sha256 over the decoded token ids (4-byte little-endian each, steps in order)."""
    h = hashlib.sha256()
    for s in steps:
        for tok in s.output_tokens:
            h.update(int(tok).to_bytes(4, "little"))
    return h.hexdigest()


@attrs.frozen
class EpisodeResult:
    """How one episode went.  ``status``: done | fail | max_steps | error."""

    episode_id: str
    task: str | None
    status: str
    reward: float
    steps: tuple[StepMetrics, ...]
    unparsable: int = 0
    error: str = ""  # why the episode (or its last step) failed

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def output_sha256(self) -> str:
        return output_sha256(self.steps)

    @property
    def admission(self) -> str:
        """ok | degraded (some step ran on a downgraded plan) | failed (some step failed)."""
        statuses = {s.status for s in self.steps}
        return "failed" if "failed" in statuses else (
            "degraded" if "degraded" in statuses else "ok")

    def mean(self, key: str) -> float | None:
        values = [getattr(s, key) for s in self.steps if s.status != "failed"]
        values = [v for v in values if isinstance(v, int | float)]
        return sum(values) / len(values) if values else None
