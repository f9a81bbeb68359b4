"""Loading a model file into llama.cpp with the numerical contract's settings
(``cachepolicy.engine``): the model, its context, and what the context's shape depends on
(a MoE model's expert count and expert weight types cap the decode lanes and the prefill
call's rows, ``records.decode_lanes_for`` / ``prefill_rows_for``), and the model file's
cheap identity.  The engine (``core.Engine``) calls ``load_native`` once, at construction.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs
import llama_cpp
import structlog

from cachepolicy.engine import zero_pages
from cachepolicy.engine.compute_thread import ComputeThread
from cachepolicy.engine.errors import ModelLoadError
from cachepolicy.engine.gguf_meta import tensor_types
from cachepolicy.engine.native import Native, model_meta
from cachepolicy.engine.records import EngineConfig, decode_lanes_for, prefill_rows_for

__all__ = ["expert_weight_types", "file_identity", "load_native"]

log = structlog.get_logger("kvagent.engine")


def file_identity(path: Path) -> str:
    """A cheap identity of a model file: its size and a hash of its first and last MiB."""
    h = hashlib.blake2b(digest_size=12)
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()


def load_native(model_path: Path, config: EngineConfig,
                compute: ComputeThread) -> tuple[Native, EngineConfig]:
    """Load the model and create the context with the contract's settings; the config comes
    back with what depends on the model (the decode lanes, the prefill call's rows)
    resolved."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = config.n_gpu_layers  # -1: all (llama.cpp's convention)
    # Repacked weight layouts pick a matmul kernel by the batch's row count, which breaks
    # split == one-call on quantized models; off unless speed was asked for.
    mparams.use_extra_bufts = config.fast_kernels
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {model_path}")
    experts = _expert_count(model)
    rows, why = decode_lanes_for(experts, config.decode_rows)
    if config.decode_rows is not None and rows != config.decode_rows:
        log.warning("engine_decode_rows_capped", requested=config.decode_rows, rows=rows,
                    reason=why)
    n_batch, why = prefill_rows_for(expert_weight_types(model_path) if experts else frozenset(),
                                    config.n_batch, config.fast_kernels)
    if n_batch != config.n_batch:
        log.info("engine_prefill_rows_capped", requested=config.n_batch, rows=n_batch,
                 reason=why)
    config = attrs.evolve(config, decode_rows=rows, n_batch=n_batch)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = config.n_ctx  # bounded by EngineConfig's validators
    cparams.n_batch = cparams.n_ubatch = config.n_batch
    cparams.n_seq_max = config.n_seq_total
    cparams.n_threads = cparams.n_threads_batch = config.n_threads
    cparams.flash_attn_type = 1 if config.flash_attn else 0  # off: split == one-call, bitwise
    cparams.kv_unified = False  # one KV stream per sequence: cell placement is reproducible
    cparams.no_perf = True
    before = zero_pages.anonymous_mappings()
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise ModelLoadError(f"llama.cpp could not create a context for {model_path}")
    # the KV cache llama.cpp just cleared: resident as cells are written, not all at once
    # (only whole chunks still all zero: nothing has computed with the context yet)
    released = zero_pages.release_zero_chunks(zero_pages.new_mappings(before))
    log.info("engine_zero_pages_released", mib=released >> 20)
    return Native(model=model, ctx=ctx, mem=llama_cpp.llama_get_memory(ctx),
                  vocab=llama_cpp.llama_model_get_vocab(model), compute=compute), config


def _expert_count(model: object) -> int:
    """The model's experts per MoE layer (0 for a dense model), from its GGUF metadata."""
    arch = model_meta(model, "general.architecture") or ""
    value = model_meta(model, f"{arch}.expert_count")
    return int(value) if value and value.isdigit() else 0


def expert_weight_types(model_path: Path) -> frozenset[str]:
    """The GGUF types of a MoE model's expert matrices (``blk.N.ffn_*_exps``), read from
    the file's tensor table (llama.cpp's API does not say)."""
    return frozenset(kind for name, kind in tensor_types(model_path).items() if "_exps." in name)
