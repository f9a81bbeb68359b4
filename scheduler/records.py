"""The per-step record every transaction produces (frozen; JSON-ready via ``as_dict``)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class StepRecord:
    episode_id: str
    step: int
    policy: str
    generation: int
    start: str  # how the step began: clear / keep / trim / truncate / restore
    new_content_tokens: int  # content that did not exist at the previous step
    prefill_tokens: int
    reused_tokens: int
    critical_path_prefill_tokens: int  # prefilled while the agent waited for this action
    prefill_s: float  # restore, prefill, checkpoints (the vision encoder excluded)
    decode_tokens: int
    decode_s: float
    context_tokens: int  # tokens the model saw (the whole prompt)
    kv_bytes: int  # the sequence's state after the step, as llama.cpp reports it
    checkpoint_bytes: int  # the episode's published checkpoints after the step
    forecast_peak_bytes: int
    ledger_peak_bytes: int
    output_tokens: tuple[int, ...]
    output_text: str  # the output tokens detokenized (in the engine's worker thread)
    encode_s: float = 0.0  # vision encoder seconds inside the transaction (cache misses)
    status: str = "ok"  # ok | degraded | failed
    reason: str = ""
    drift_kl: float | None = None
    drift_top1_agree: bool | None = None
    #: decoded from an approximate state: this step's tail replay or an earlier one the
    #: sequence still carries (the engine's record of the sequence, not the plan's claim)
    approximate: bool = False
    replay_tokens: int = 0  # rows of the matched prefix this step's tail replay recomputed
    #: KV splicing (kamera, random-evict, recency-evict): the episode's store after the
    #: step (bytes), what its canonical forwards prefilled on the spare sequence, and the
    #: seconds of the KV edits and of the store's forwards and SVDs (both inside prefill_s)
    stored_bytes: int = 0
    store_tokens: int = 0
    splice_s: float = 0.0
    store_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["output_tokens"] = list(self.output_tokens)
        return d
