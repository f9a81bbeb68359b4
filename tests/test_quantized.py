"""Quantized models: the forge makes them with llama.cpp's own quantizer, and the engine's
exactness contract holds on them with its default (exact) kernels.

Size XS is the smallest forge size whose rows fit the K-quants (tiny's would all fall back to
legacy types, which have no row-count kernel classes and so would test nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig, chunk_sizes
from cachepolicy.engine.records import MIN_CHUNK_ROWS, prefill_rows_for
from cachepolicy.engine.row_classes import RowClasses
from cachepolicy.forge import ForgedModel, ForgeError, entry_name, forge, forge_cached
from cachepolicy.oracle.checks import run_checks
from conftest import skip_without_fast_kernels

SPLIT_CHECKS = {"split_prefill", "split_points", "chunk_remainders", "image_split_points"}
RESTORE_CHECKS = {"restore_same_seq", "restore_other_seq", "restore_points",
                  "short_pieces_restore", "image_restore_before_image",
                  "image_restore_after_image"}
HYBRID_EDIT_CHECKS = {"partial_only_truncate", "middle_removal_refused",
                      "tail_trim_without_checkpoint_refused", "image_partial_only_truncate"}


@pytest.fixture(scope="session")
def qforged(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ForgedModel]:
    """``qforged(arch, quant, vision=True)`` → a size-XS model, forged at most once."""
    cache = tmp_path_factory.mktemp("qmodels")

    def get(arch: str, quant: str, vision: bool = True) -> ForgedModel:
        return forge_cached(arch, "XS", vision=vision, quant=quant, cache_dir=cache)

    return get


def engine_for(m: ForgedModel, *, fast: bool = False) -> Engine:
    return Engine(m.model_path, m.mmproj_path,
                  EngineConfig(n_ctx_per_seq=1024, n_seq_max=2, n_batch=32, n_threads=1,
                               fast_kernels=fast))


def failed(results: list) -> list[tuple[str, float, str]]:
    return [(r.name, r.max_abs_diff, r.detail) for r in results if not r.bitwise]


# ---------------------------------------------------------------- the forge


@pytest.mark.parametrize(("quant", "file_type", "main_type"),
                         [("q8_0", 7, "Q8_0"), ("q4_k_m", 15, "Q4_K"), ("iq4_xs", 30, "IQ4_XS")])
def test_quantized_model_has_its_type_and_runs(qforged, quant: str, file_type: int,
                                               main_type: str) -> None:
    m = qforged("qwen35", quant, vision=False)
    assert m.quant == quant
    reader = gguf.GGUFReader(m.model_path)
    field = reader.fields["general.file_type"]
    assert int(field.parts[field.data[0]][0]) == file_type
    matrix_types = {t.tensor_type.name for t in reader.tensors if len(t.shape) > 1}
    assert main_type in matrix_types
    # XS rows are multiples of 256: nothing fell back to a legacy 32-block type
    assert not matrix_types & {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"}
    f16 = qforged("qwen35", "f16", vision=False)
    assert m.model_bytes < f16.model_bytes / 1.8
    with engine_for(m) as e, engine_for(f16) as ref:
        prompt = e.tokenize("<|im_start|>user\nclick the submit button<|im_end|>\n")
        logits = e.prefill_tokens(0, prompt)
        exact = ref.prefill_tokens(0, prompt)
    assert logits is not None and exact is not None
    assert np.isfinite(logits).all() and logits.std() > 1e-3
    assert not np.array_equal(logits, exact)  # really another model...
    # ...that approximates the f16 one (an unrelated model's logits correlate ~0 with them)
    assert np.corrcoef(logits, exact)[0, 1] > 0.5


def test_quantizing_is_deterministic_and_leaves_the_mmproj_alone(qforged, tmp_path: Path) -> None:
    cached = qforged("llama", "q4_k_m")
    again = forge("llama", "XS", tmp_path / "again", vision=True, quant="q4_k_m")
    assert again.model_path.read_bytes() == cached.model_path.read_bytes()
    f16 = qforged("llama", "f16")
    assert cached.mmproj_path is not None and f16.mmproj_path is not None
    assert cached.mmproj_path.read_bytes() == f16.mmproj_path.read_bytes()
    assert cached.model_path.parent.name == entry_name("llama", "XS", vision=True, seed=0,
                                                       quant="q4_k_m")
    assert entry_name("llama", "XS", vision=True, seed=0) != cached.model_path.parent.name


@pytest.mark.parametrize(("size", "quant", "message"), [
    ("tiny", "q4_k_m", "blocks of 256"), ("tiny", "iq4_xs", "Sizes that fit: XS"),
    ("XS", "q9_9", "unknown quantization")])
def test_quantizations_that_do_not_fit_are_refused(tmp_path: Path, size: str, quant: str,
                                                   message: str) -> None:
    with pytest.raises(ForgeError, match=message):
        forge("llama", size, tmp_path / "out", quant=quant)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the exactness contract


@pytest.mark.parametrize(("arch", "quant"), [("llama", "q8_0"), ("llama", "q4_k_m"),
                                             ("qwen35", "q8_0"), ("qwen35", "q4_k_m"),
                                             ("qwen35moe", "q8_0"), ("qwen35moe", "q4_k_m"),
                                             ("qwen2vl", "q4_k_m"), ("qwen3vl", "q4_k_m"),
                                             ("qwen3vlmoe", "q4_k_m")])
def test_every_check_is_bitwise_on_quantized_models(qforged, arch: str, quant: str) -> None:
    with engine_for(qforged(arch, quant)) as e:
        results = run_checks(e)
    names = {r.name for r in results}
    assert SPLIT_CHECKS | RESTORE_CHECKS <= names
    assert failed(results) == []


@pytest.mark.parametrize("arch", ["llama", "qwen35", "qwen35moe"])
def test_every_check_is_bitwise_on_q4_k_m_without_vision(qforged, arch: str) -> None:
    with engine_for(qforged(arch, "q4_k_m", vision=False)) as e:
        assert failed(run_checks(e)) == []


def test_moe_k_quant_prefill_calls_are_capped_and_the_cap_is_what_makes_splits_exact(
        qforged, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expert matmuls of K-quant MoE models take another kernel when fewer than 8 rows are
    routed to an expert, which depends on the tokens: the engine caps their prefill calls at
    7 rows.  Lifted, the split checks see the difference (so they can fail here); restore
    and truncation compare with the same pieces uninterrupted and pass either way."""
    import cachepolicy.engine.loading as loading

    m = qforged("qwen35moe", "q4_k_m")
    with engine_for(m) as e:
        assert e.config.n_batch == MIN_CHUNK_ROWS - 1
    monkeypatch.setattr(loading, "prefill_rows_for", lambda _types, n_batch, _fast: (n_batch, ""))
    with engine_for(m) as e:
        assert e.config.n_batch == 32
        results = {r.name: r for r in run_checks(e)}
    assert {n for n in SPLIT_CHECKS if not results[n].bitwise}
    assert failed([results[n] for n in RESTORE_CHECKS | HYBRID_EDIT_CHECKS]) == []


@pytest.mark.parametrize(("types", "fast", "rows"), [
    (frozenset(), False, 32),                        # dense
    (frozenset({"Q8_0"}), False, 32),                # one kernel for any row count
    (frozenset({"Q4_K", "Q5_0"}), False, 7),         # a switching type among the experts
    (frozenset({"BF16"}), False, 7),                 # not measured: treated as switching
    (frozenset({"Q4_K"}), True, 32),                 # speed asked for
])
def test_prefill_rows_follow_the_expert_types(types: frozenset[str], fast: bool,
                                              rows: int) -> None:
    assert prefill_rows_for(types, 32, fast)[0] == rows


def test_fast_kernels_are_reported_as_not_bitwise(qforged) -> None:
    m = qforged("qwen35", "q4_k_m")
    skip_without_fast_kernels(m.model_path)
    with engine_for(m, fast=True) as e:
        results = {r.name: r for r in run_checks(e)}
    assert not results["split_points"].bitwise and results["split_points"].max_abs_diff > 0
    assert not results["chunk_remainders"].bitwise


def _old_chunk_sizes(n: int, n_batch: int) -> list[int]:
    """The rule before quantized models: it only kept the last chunk from being 1 row."""
    if n <= n_batch:
        return [n]
    k = -(-n // n_batch)
    sizes = [n_batch] * (k - 1) + [n - n_batch * (k - 1)]
    if sizes[-1] == 1:
        sizes[-2:] = [sizes[-2] - 1, 2]
    return sizes


def test_chunk_remainders_catch_a_short_last_chunk(qforged, monkeypatch: pytest.MonkeyPatch) -> None:
    """With chunks of 2-7 rows allowed, a K-quant model's long piece is no longer bitwise
    the same as inside a one-call prefill; the chunk_remainders check must see it."""
    import cachepolicy.engine.decoder as decoder

    monkeypatch.setattr(decoder, "chunk_sizes", _old_chunk_sizes)
    with engine_for(qforged("llama", "q4_k_m", vision=False)) as e:
        results = {r.name: r for r in run_checks(e)}
    assert not results["chunk_remainders"].bitwise
    assert "n_batch+" in results["chunk_remainders"].detail


def test_chunk_sizes_keep_every_chunk_of_a_split_piece_large() -> None:
    for n_batch in (16, 32, 33, 512):
        for n in range(1, 3 * n_batch + 20):
            sizes = chunk_sizes(n, n_batch)
            assert sum(sizes) == n and max(sizes) <= n_batch
            if n > n_batch:
                assert min(sizes) >= MIN_CHUNK_ROWS
            else:
                assert sizes == [n]


@pytest.mark.parametrize(("arch", "fast"), [("qwen35moe", True), ("qwen35", True)])
def test_terminal_slot_equals_scratch_where_split_prefill_is_not_exact(qforged, arch: str,
                                                                      fast: bool) -> None:
    """terminal-scratch prefills terminal-slot's piece boundaries, so the two agree even where
    a split prefill differs from a one-call one (repacked weights; uncapped K-quant MoE
    experts)."""
    import anyio

    from runtime.bench.arms import run_arm
    from runtime.bench.trajectory import trajectory
    from runtime.config import AgentConfig

    traj = trajectory(6, 128, 96)
    agent = AgentConfig(window=3, decode_tokens=4, grammar=False, stop_at_eog=False,
                        overlap=False)
    outs, runs = [], []
    if fast:
        skip_without_fast_kernels(qforged(arch, "q4_k_m").model_path)
    with engine_for(qforged(arch, "q4_k_m"), fast=fast) as e:
        for name in ("terminal-slot", "terminal-scratch"):
            seen: list = []  # after each step, the runs the sequence was fed: one per call

            def fed(event, seen=seen) -> None:
                if event.kind == "step":
                    (seq,) = [s for s in range(e.config.n_seq_max) if e.seq_info(s).history]
                    seen.append([(r.kind, r.n_tokens) for r in e.seq_info(seq).history])

            outs.append(anyio.run(lambda name=name, fed=fed: run_arm(e, name, traj, agent,
                                                                     on_event=fed)))
            runs.append(seen[-1])
    assert {s.start for s in outs[0].episode.steps[1:]} == {"truncate"}  # slot really reused
    assert runs[0] == runs[1] and len(runs[0]) > 6
    assert outs[0].output_sha256 == outs[1].output_sha256


# ---------------------------------------------------------------- decode row classes


@pytest.mark.parametrize(("quant", "lanes", "runs"),
                         [("q8_0", ((1, 2, 3, 4),), tuple(range(2, 17))),
                          ("q4_k_m", ((1, 2, 3, 4),), tuple(range(2, 8)))])
def test_row_classes_of_quantized_models(qforged, quant: str, lanes: tuple,
                                         runs: tuple) -> None:
    """Q8_0: every lane count and run length computes a row alike; K-quants switch kernels
    at 8 rows, so runs stop at 7.  On both a lone generation's one-row calls share a class
    with more rows: by default the engine decodes in lanes, unpadded."""
    m = qforged("qwen35", quant, vision=False)
    with Engine(m.model_path, None, EngineConfig(n_ctx_per_seq=1024, n_seq_max=2,
                                                 n_batch=32, n_threads=1,
                                                 row_class_cache=False)) as e:
        assert (e.row_classes.lanes, e.row_classes.runs) == (lanes, runs)
        runs_shape = e.shape_for(True)
        assert (runs_shape.min_run, runs_shape.max_run) == (2, max(runs))
        assert e.decode_shape == e.shape_for(False)  # the default: lanes
        assert e.decode_shape.lane_rows == (1, 2, 3, 4)  # no pad on a lone generation


def test_wrong_run_class_fails_decode_runs(qforged) -> None:
    """Claiming runs up to 16 tokens on a K-quant model (they switch kernels at 8): the
    oracle's decode_runs and speculative_generation checks see other logits."""
    m = qforged("qwen35", "q4_k_m", vision=False)
    wrong = RowClasses(lanes=[[1, 2, 3, 4]], runs=range(2, 17))
    with Engine(m.model_path, None, EngineConfig(n_ctx_per_seq=1024, n_seq_max=2, n_batch=32,
                                                 n_threads=1), row_classes=wrong) as e:
        assert e.shape_for(True).max_run == 16
        results = {r.name: r for r in run_checks(e)}
    assert not results["row_classes"].bitwise
    assert not results["decode_runs"].bitwise and results["decode_runs"].max_abs_diff > 0
