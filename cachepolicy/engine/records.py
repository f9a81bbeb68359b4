"""Plain records and pure helpers of the engine (no llama.cpp in here)."""

from __future__ import annotations

import os

import attrs
import numpy as np

from cachepolicy.engine.checkpoint import GENESIS, Run, RunKind, chain_digest
from cachepolicy.engine.errors import UnsafeEditError


#: The fewest rows a batch needs for every weight type's matmul to take its large-batch kernel
#: (measured on this CPU build, repacking off: f16 takes another kernel for 1 row,
#: the K-quants and IQ4_XS for 1-7 rows; Q8_0, Q5_0, Q4_0 and IQ4_NL never switch).
MIN_CHUNK_ROWS = 8


def chunk_sizes(n: int, n_batch: int) -> list[int]:
    """Split ``n`` rows into batches of at most ``n_batch``.

    When a split is needed, the last batch borrows rows from the one before so that no batch
    has fewer than ``MIN_CHUNK_ROWS`` rows (fewer only if ``n_batch < 2 * MIN_CHUNK_ROWS``,
    never 1 unless ``n_batch`` is 2).  So every row of a piece of at least ``MIN_CHUNK_ROWS``
    rows runs through the same kernels however the piece is chunked: a piece prefilled in
    ``n_batch``-sized calls is bitwise the same as inside a longer one-call prefill.
    """
    if n <= n_batch:
        return [n]
    k = -(-n // n_batch)
    sizes = [n_batch] * (k - 1) + [n - n_batch * (k - 1)]
    floor = max(2, min(MIN_CHUNK_ROWS, n_batch // 2))
    if sizes[-1] < floor:
        sizes[-2] -= floor - sizes[-1]
        sizes[-1] = floor
    return sizes


#: Bounds on the sizes that reach llama.cpp (its context fields are 32-bit; far beyond
#: these a value is a typo, and llama.cpp fails in odd ways or allocates without limit).
MAX_N_CTX_PER_SEQ = 1 << 20  # 1M positions, the longest context models are trained for
MAX_N_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ
MAX_N_BATCH = 8192
MAX_THREADS = 256  # libgomp fails far beyond the core count (100000 threads: a segfault)
MAX_DECODE_ROWS = 16  # decode lanes: rows of every decode call
#: ``n_gpu_layers`` above this is a typo (no model has that many layers; -1 means all)
MAX_GPU_LAYERS = 1 << 16
#: Overrides the default thread count of every engine (``default_threads``).
THREADS_ENV = "KVAGENT_THREADS"
#: Without ``$KVAGENT_THREADS`` an engine embedded in someone else's process takes at most
#: this many cores (``default_threads(shared=True)``).
SHARED_MAX_THREADS = 4


def default_threads(*, shared: bool = False) -> int:
    """The one rule for an engine's thread count: ``$KVAGENT_THREADS`` if set, else the
    cores this process may run on — capped at ``SHARED_MAX_THREADS`` when ``shared``.

    ``shared`` is for an agent inside another program's process (``KvAgent`` in OSWorld's
    ``run_multienv.py`` workers, one agent per worker and none knowing how many there are):
    N agents taking every core would start N x cores OpenMP threads, and libgomp then sleeps
    at every barrier.  A command that owns the machine (``kvagent run``, ``serve``, the
    benches) takes every core.  ValueError for a ``$KVAGENT_THREADS`` that is not 1..256."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        if not value.isdigit() or not 1 <= int(value) <= MAX_THREADS:
            raise ValueError(f"${THREADS_ENV} must be an integer 1..{MAX_THREADS}, got {value!r}")
        return int(value)
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return max(1, min(SHARED_MAX_THREADS, cores) if shared else cores)


def _within(low: int, high: int) -> object:
    def check(_inst: object, attr: attrs.Attribute, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{attr.name} must be an integer in {low}..{high}, got {value!r}")
    return check


@attrs.frozen
class EngineConfig:
    """The engine's sizes, validated at construction (before anything is loaded):
    ``n_batch`` 2..8192 (a 1-row batch takes another kernel), ``n_ctx_per_seq`` n_batch..1M,
    ``n_seq_max`` 1..256, ``n_threads`` 1..256 — so ``n_ctx = n_ctx_per_seq * n_seq_max``
    stays far inside llama.cpp's 32-bit fields.  What such a context costs in memory is
    ``cachepolicy.engine.sizing``'s estimate."""

    n_ctx_per_seq: int = attrs.field(default=8192, validator=_within(2, MAX_N_CTX_PER_SEQ))
    n_seq_max: int = attrs.field(default=4, validator=_within(1, MAX_N_SEQ))
    #: also n_ubatch: llama.cpp never re-splits our batches
    n_batch: int = attrs.field(default=512, validator=_within(2, MAX_N_BATCH))
    n_threads: int = attrs.field(factory=default_threads, validator=_within(1, MAX_THREADS))
    image_cache_bytes: int = attrs.field(default=256 * 2**20,
                                         validator=_within(0, 1 << 50))
    verbose: bool = False
    # Only for demonstrating what the oracle catches: with flash attention on, a split prefill
    # is no longer bitwise equal to a one-call prefill.
    flash_attn: bool = False
    # The vision encoder's flash attention: on by default. An image is encoded in one call,
    # so the split-prefill rule above has nothing to protect there; the encoder only has to
    # be deterministic (check-exact's encoder checks). Off = the slower non-flash kernel,
    # kept for comparison (``kvagent bench-encode``).
    encoder_flash_attn: bool = True
    # May the vision encoder run beside llama.cpp's own compute (its own lock instead of the
    # engine's)? Both are OpenMP teams of n_threads: side by side on fewer cores they
    # oversubscribe the CPU and spin at each other's barriers. None: only when the cores
    # hold both teams (``encoder_runs_beside``).
    encoder_beside: bool | None = None
    # Speed over exactness: let the CPU backend repack quantized weights (llama.cpp's
    # use_extra_bufts). Its kernels depend on a batch's row count, so on quantized models a
    # split prefill is no longer bitwise a one-call prefill; check-exact reports it.
    fast_kernels: bool = False
    # Generations decode in this many lanes (spare sequences, one KV stream each): up to
    # this many decode at once, sharing calls in the LANES shape (see DecodeBatcher).
    # None: the engine decides per model (``decode_lanes_for``).
    decode_rows: int | None = attrs.field(default=None, validator=attrs.validators.optional(
        [attrs.validators.ge(1), attrs.validators.le(MAX_DECODE_ROWS)]))
    # How decode calls are formed (``row_classes.DecodeShape``): False lanes (generations
    # share calls, one token each), True runs (one generation's tokens per call, which
    # jump-forward and speculation need), None lanes where a lone generation needs no pad
    # row in them, else runs for generations a grammar constrains and one-row calls for
    # the others (``row_classes.choose_shape``).  Either is exact in itself;
    # they compute a row with other kernels on some models, so outputs may differ between
    # them (never within one).
    decode_runs: bool | None = None
    # Read and write the measured row classes in the kvagent cache (``row_probe``); False
    # measures at every load.
    row_class_cache: bool = True
    # Layers llama.cpp places on a GPU (its ``n_gpu_layers``, ``llama-server -ngl``): the
    # last N of the model's blocks + output layer, -1 every layer (``devices``). 0: CPU
    # only. On a build without a GPU backend nothing is offloaded whatever is asked (the
    # engine says so: ``Engine.offload``); the GPU's kernels are exact only as far as
    # check-exact reports on that machine.
    n_gpu_layers: int = attrs.field(default=0, validator=_within(-1, MAX_GPU_LAYERS))

    def __attrs_post_init__(self) -> None:
        if self.n_ctx_per_seq < self.n_batch:
            raise ValueError(f"n_ctx_per_seq ({self.n_ctx_per_seq}) must be at least n_batch "
                             f"({self.n_batch})")
        if self.n_seq_total > MAX_N_SEQ:
            raise ValueError(f"n_seq_max + decode_rows must be at most {MAX_N_SEQ} (llama.cpp's "
                             f"sequences), got {self.n_seq_total}")

    @property
    def n_seq_total(self) -> int:
        """Sequences the llama context holds: the usable ones and the decode lanes (before
        the model is loaded an upper bound: a MoE model may get fewer lanes)."""
        return self.n_seq_max + (DEFAULT_DECODE_ROWS if self.decode_rows is None
                                 else self.decode_rows)

    @property
    def n_ctx(self) -> int:
        """The whole context llama.cpp allocates: every sequence's share, lanes included."""
        return self.n_ctx_per_seq * self.n_seq_total


#: What a pad row or a pad guess feeds (any valid id: its logits are thrown away).
PAD_TOKEN = 0

#: Decode lanes when ``decode_rows`` is not given: up to this many generations share a call.
DEFAULT_DECODE_ROWS = 4


def decode_lanes_for(expert_count: int, requested: int | None) -> tuple[int, str]:
    """The decode lanes a model gets, and why.

    On a dense model a row's result depends only on the row count's class (measured:
    ``row_classes``), which lane calls keep, so generations share calls exactly at any
    count.  On a mixture-of-experts model the router sends each expert the rows whose tokens
    chose it, and with ``MIN_CHUNK_ROWS`` rows or more an expert's quantized matmul may take
    its large-batch kernel for some calls and not others — a generation's logits then depend
    on what the other rows decode (measured: K-quant experts at 8 and 16 lanes).  Below that
    every expert computes each row on its own, so MoE models get at most
    ``MIN_CHUNK_ROWS - 1`` lanes.
    """
    rows = DEFAULT_DECODE_ROWS if requested is None else requested
    if expert_count > 0 and rows >= MIN_CHUNK_ROWS:
        return MIN_CHUNK_ROWS - 1, (f"mixture of experts ({expert_count} experts): {rows} "
                                    f"lanes would let an expert's kernel depend on the other "
                                    f"rows; capped at {MIN_CHUNK_ROWS - 1}")
    return rows, "every call feeds all lanes: rows do not interact"


#: Expert weight types whose matmul takes one kernel however many rows the router sends an
#: expert (measured on this CPU build, repacking off); every other type (the K-quants, IQ4_XS,
#: and what was not measured) is treated as switching kernels at ``MIN_CHUNK_ROWS`` rows.
ROW_INVARIANT_EXPERT_TYPES = frozenset({"F32", "F16", "Q8_0", "Q4_0", "Q5_0", "IQ4_NL"})


def prefill_rows_for(expert_types: frozenset[str], n_batch: int,
                     fast_kernels: bool) -> tuple[int, str]:
    """The most rows a prefill call may carry on a model, and why.

    A dense model's rows take one kernel per batch size class, which ``chunk_sizes`` keeps
    apart (``MIN_CHUNK_ROWS``).  A mixture-of-experts model's router sends each expert the
    rows whose tokens chose it: with a full ``n_batch`` call an expert gets 8 rows in one call
    and 3 in another, and a K-quant expert then computes the same row with another kernel
    depending on where the prompt was split (measured: split prefill max|diff| 7e-3 on a
    Q4_K_M qwen35moe XS).  Calls of fewer than ``MIN_CHUNK_ROWS`` rows keep every expert on
    its small-batch kernel, so a split prefill is bitwise a one-call one again — at a cost in
    prefill speed (docs/benchmarks.md); ``fast_kernels`` waives it.
    """
    switching = sorted(expert_types - ROW_INVARIANT_EXPERT_TYPES)
    if not switching or fast_kernels or n_batch < MIN_CHUNK_ROWS:
        return n_batch, "every row takes its kernel by the call's size"
    return MIN_CHUNK_ROWS - 1, (f"mixture of experts with {', '.join(switching)} experts: a "
                                f"call of {MIN_CHUNK_ROWS}+ rows would let an expert's kernel "
                                f"depend on the tokens routed to it; prefill calls capped at "
                                f"{MIN_CHUNK_ROWS - 1} rows (fast_kernels lifts the cap)")


def encoder_runs_beside(config: EngineConfig, cores: int | None = None) -> bool:
    """Whether the vision encoder gets its own lock: as configured, else iff the machine's
    cores hold the encoder's threads and the LLM's (measured on 2 cores with 2 threads each:
    side by side they only slowed each other)."""
    if config.encoder_beside is not None:
        return config.encoder_beside
    return 2 * config.n_threads <= (cores if cores is not None else os.cpu_count() or 1)


@attrs.frozen
class MemoryReport:
    """Bytes the engine holds, as llama.cpp reports them (sequence state sizes)."""

    kv_bytes_per_token: int  # attention layers only: what one more KV cell costs
    recurrent_bytes_per_seq: int  # the O(1) recurrent state (0 on attention-only models)
    seq_state_bytes: dict[int, int]  # llama_state_seq_get_size of each non-empty sequence
    live_checkpoints: int
    live_checkpoint_bytes: int
    image_cache_bytes: int
    lanes_in_use: tuple[int, ...] = ()  # decode lanes holding cells (none between generations)
    #: screenshot KV kept outside sequences (``Engine.kv_keep``) and still referenced
    live_stored_kv: int = 0
    live_stored_kv_bytes: int = 0
    #: device (GPU) memory the load placed there: offloaded layers' weights, KV cells and the
    #: compute workspace (an estimate, fixed for the engine's life; 0 on the CPU).  Not in
    #: ``total_held``: the ledger's budget is host memory, where checkpoints, stored KV and
    #: embeddings live (llama.cpp copies a state out of the device); a sequence's state is
    #: counted there by its serialised size wherever its cells sit (so never too little);
    #: the device's memory is spent once, at load, and checked then (``check_memory``)
    device_bytes: int = 0

    @property
    def total_held(self) -> int:
        return (sum(self.seq_state_bytes.values()) + self.live_checkpoint_bytes
                + self.image_cache_bytes + self.live_stored_kv_bytes)


@attrs.frozen
class SeqInfo:
    seq: int
    next_pos: int
    n_tokens: int
    digest: bytes
    history: tuple[Run, ...]


def history_prefix_at(hist: list[Run], pos: int) -> list[Run]:
    """The runs that make up the first ``pos`` positions (a text run may be split)."""
    keep: list[Run] = []
    for run in hist:
        if run.end_pos <= pos:
            keep.append(run)
            continue
        if run.pos0 < pos:
            if run.kind is not RunKind.TEXT:
                raise UnsafeEditError(f"position {pos} falls inside an image")
            toks = np.asarray(run.tokens[: pos - run.pos0], dtype=np.int32)
            prev = keep[-1].digest if keep else GENESIS
            keep.append(Run(RunKind.TEXT, run.pos0, len(toks), len(toks),
                            chain_digest(prev, RunKind.TEXT, toks.tobytes()),
                            tuple(int(t) for t in toks), shifted=run.shifted))
        break
    return keep

