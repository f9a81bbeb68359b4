"""The parity check: the trainer's model is llama.cpp's model.

``compare(model_path, mmproj_path, pieces)`` runs one prompt (text and images, as
``example.TextPiece`` / ``ImagePiece``) two independent ways and compares the logits of
every row:

(a) kvagent's ``Engine``: real llama.cpp prefill of the text runs and images, in order, each
    call asking for every row's logits (``all_logits``); images through ``prefill_image``
    (mtmd's embeddings at mtmd's decoder positions);
(b) the JAX ``forward`` on the rows ``build_example`` lays out for the trainer (the same
    token ids, the same embedding rows, positions computed by the trainer's own walk).

The two walks are independent, so the check also compares their bookkeeping: the rows each
produced and the next position (the engine's ``seq_info(seq).next_pos`` against
``Example.next_pos``).

Tolerance.  llama.cpp multiplies f16 weights with activations it rounds to f16, and keeps
K/V in an f16 cache; the JAX side loads the same f16 weights (exact in f32) and, with
``Numerics(f16=True)`` (the default here), rounds the same tensors — every intermediate of
every layer then agrees with llama.cpp's to ~1e-7 (checked tensor by tensor while writing
this).  What remains is the order of f32 summation (ggml's SIMD / tinyBLAS blocks vs XLA's),
~1e-7 relative, which now and then moves an activation across an f16 rounding boundary (one
f16 ulp, 2^-11 relative), and the RMS norms re-amplify those steps (these models' hidden
states are small).  The forward is that sensitive on its own: perturbing its inputs by one
f32 ulp moves its logits by as much as it differs from llama.cpp (``noise_floor`` measures
it on every check: ~1-2e-3 on the XS models, up to ~1400 rows).  Measured engine-vs-JAX
differences are 3e-4 (tiny) to 2.5e-3 (XS) at logit scales ~1-2 (without the f16 rounding
~2× more).  The default tolerance, ``5e-3 · max(1, max|logit|)``, is ~2-4× that noise and
far below what a wrong detail gives (a missing conv, sequential positions for an image, one
weight changed: 1e-2 to 2).  Greedy agreement: a row whose argmax differs passes only if it
is a near-tie (the engine's top-2 gap there is within twice the largest difference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import structlog

from cachepolicy.engine import Engine, EngineConfig
from runtime.engine_setup import ModelFiles, load_engine
from cachepolicy.forge import TextSpec
from runtime.train.example import ImagePiece, Piece, TextPiece, build_example, to_rows
from runtime.train.gguf_io import load_gguf
from runtime.train.model import ForwardOptions, Rows, jit_forward
from runtime.train.numerics import Numerics

log = structlog.get_logger("kvagent.train")

#: tolerance = TOLERANCE_REL * max(1, max |engine logit|) (see the module docstring)
TOLERANCE_REL = 5e-3
PARITY_OPTIONS = ForwardOptions(numerics=Numerics(f16=True))


class LayoutMismatch(RuntimeError):
    """The engine and the trainer walked the same pieces into different row counts."""


@attrs.frozen
class ParityReport:
    """Engine vs trainer logits on one prompt."""

    arch: str
    n_rows: int
    n_image_rows: int
    max_abs_diff: float
    max_abs_diff_text_rows: float
    max_abs_diff_image_rows: float
    logit_scale: float  # max |engine logit|
    tolerance: float
    argmax_agree: int  # rows whose greedy token agrees
    argmax_mismatches: tuple[tuple[int, float], ...]  # (row, engine top-2 gap) where not
    engine_next_pos: int
    trainer_next_pos: int
    f16_numerics: bool
    #: JAX vs JAX when the inputs (token and image embeddings) move by one f32 ulp
    noise_floor: float

    @property
    def near_tie_mismatches_only(self) -> bool:
        return all(gap <= 2 * self.max_abs_diff for _, gap in self.argmax_mismatches)

    @property
    def passed(self) -> bool:
        return (self.max_abs_diff <= self.tolerance and self.near_tie_mismatches_only
                and self.engine_next_pos == self.trainer_next_pos)

    def summary(self) -> str:
        return (f"{self.arch}: {self.n_rows} rows ({self.n_image_rows} image) max|diff| "
                f"{self.max_abs_diff:.2e} (text {self.max_abs_diff_text_rows:.2e}, image "
                f"{self.max_abs_diff_image_rows:.2e}) of logit scale {self.logit_scale:.3f}, "
                f"tolerance {self.tolerance:.2e}; argmax agrees on {self.argmax_agree}/"
                f"{self.n_rows}; next_pos {self.engine_next_pos}/{self.trainer_next_pos}; noise "
                f"floor {self.noise_floor:.2e}; "
                f"{'PASS' if self.passed else 'FAIL'}")


def engine_logits(engine: Engine, pieces: Sequence[Piece], seq: int = 0) -> np.ndarray:
    """Every row's logits from llama.cpp, ``[T, n_vocab]``, prefilling ``pieces`` into the
    (cleared) sequence ``seq``: text runs (image markers included) as one call each, images
    through ``prefill_image``.  The sequence is left holding the prompt."""
    engine.clear(seq)
    out: list[np.ndarray] = []
    pending: list[int] = []

    def flush() -> None:
        if pending:  # a lone token takes llama.cpp's 1-row kernel: allowed, slightly noisier
            rows = engine.prefill_tokens(seq, pending, all_logits=True,
                                         allow_single=len(pending) == 1)
            assert rows is not None  # all_logits always returns them
            out.append(rows)
            pending.clear()

    for piece in pieces:
        if isinstance(piece, TextPiece):
            pending.extend(piece.tokens)
            continue
        enc = engine.encode_image(piece.png)
        pending.extend(enc.prefix_tokens)
        flush()
        rows = engine.prefill_image(seq, enc, all_logits=True)
        assert rows is not None
        out.append(rows)
        pending.extend(enc.suffix_tokens)
    flush()
    return np.concatenate(out)


def compare_logits(reference: np.ndarray, got: np.ndarray, *, is_image: np.ndarray,
                   tolerance: float | None = None) -> dict[str, object]:
    """The numbers of a ``ParityReport`` for two ``[T, n_vocab]`` logit arrays."""
    if reference.shape != got.shape:
        raise ValueError(f"logit shapes differ: {reference.shape} vs {got.shape}")
    diff = np.abs(reference.astype(np.float64) - got.astype(np.float64))
    per_row = diff.max(axis=1)
    scale = float(np.abs(reference).max())
    top2 = np.sort(reference, axis=1)[:, -2:]
    ref_arg, got_arg = reference.argmax(axis=1), got.argmax(axis=1)
    mismatch = np.flatnonzero(ref_arg != got_arg)
    return {
        "max_abs_diff": float(per_row.max()),
        "max_abs_diff_text_rows": float(per_row[~is_image].max()) if (~is_image).any() else 0.0,
        "max_abs_diff_image_rows": float(per_row[is_image].max()) if is_image.any() else 0.0,
        "logit_scale": scale,
        "tolerance": tolerance if tolerance is not None else TOLERANCE_REL * max(1.0, scale),
        "argmax_agree": int(len(ref_arg) - len(mismatch)),
        "argmax_mismatches": tuple((int(r), float(top2[r, 1] - top2[r, 0])) for r in mismatch),
    }


def _ulp_jitter(params: dict[str, jax.Array], rows: Rows) -> tuple[dict[str, jax.Array], Rows]:
    """Inputs moved by up to one f32 ulp (a fixed seed): token embeddings and image rows."""
    rng = np.random.default_rng(0)

    def jitter(a: jax.Array) -> jax.Array:
        eps = rng.uniform(-1.2e-7, 1.2e-7, a.shape).astype(np.float32)
        return jnp.asarray(np.asarray(a) * (1 + eps))

    moved = dict(params)
    moved["token_embd.weight"] = jitter(params["token_embd.weight"])
    return moved, rows._replace(embeds=jitter(rows.embeds))


def compare_with_engine(engine: Engine, spec: TextSpec, params: Mapping[str, jax.Array],
                        pieces: Sequence[Piece], *,
                        options: ForwardOptions = PARITY_OPTIONS,
                        tolerance: float | None = None, seq: int = 0) -> ParityReport:
    """``compare`` on an engine already loaded (its sequence ``seq`` is cleared after)."""
    example = build_example(engine, pieces)
    reference = engine_logits(engine, pieces, seq)
    engine_next = engine.seq_info(seq).next_pos
    engine.clear(seq)
    rows = jax.tree.map(jnp.asarray, to_rows(example))
    params = dict(params)
    got = np.asarray(jit_forward(params, spec, rows, options))
    moved_params, moved_rows = _ulp_jitter(params, rows)
    noise = np.abs(np.asarray(jit_forward(moved_params, spec, moved_rows, options)) - got)
    if reference.shape[0] != example.n_rows:  # the two walks disagree on the rows
        raise LayoutMismatch(f"engine fed {reference.shape[0]} rows, the trainer laid out "
                             f"{example.n_rows}")
    numbers = compare_logits(reference, got, is_image=example.embed_index >= 0,
                             tolerance=tolerance)
    report = ParityReport(
        arch=spec.arch, n_rows=example.n_rows,
        n_image_rows=int((example.embed_index >= 0).sum()), engine_next_pos=engine_next,
        trainer_next_pos=example.next_pos, f16_numerics=options.numerics.f16,
        noise_floor=float(noise.max()), **numbers)  # type: ignore[arg-type]
    log.info("train_parity", arch=spec.arch, rows=report.n_rows,
             max_abs_diff=report.max_abs_diff, tolerance=report.tolerance,
             argmax_agree=report.argmax_agree, passed=report.passed)
    return report


def compare(model_path: str | Path, mmproj_path: str | Path | None,
            prompt_segments: Sequence[Piece], *,
            params: Mapping[str, jax.Array] | None = None,
            options: ForwardOptions = PARITY_OPTIONS, tolerance: float | None = None,
            engine_config: EngineConfig | None = None) -> ParityReport:
    """Compare llama.cpp (kvagent's ``Engine`` on ``model_path`` + ``mmproj_path``) with the
    JAX forward on ``prompt_segments``; see the module docstring.

    ``params`` defaults to the model file's own weights (``load_gguf``); pass others (e.g. a
    perturbed copy) to see the check fail.  The engine is created for this call and closed.
    """
    loaded = load_gguf(model_path)
    config = engine_config or EngineConfig(n_ctx_per_seq=8192, n_seq_max=1, n_batch=512,
                                           n_threads=2, decode_rows=1)
    files = ModelFiles(Path(model_path), Path(mmproj_path) if mmproj_path is not None else None)
    with load_engine(files, config, vision=mmproj_path is not None) as engine:
        return compare_with_engine(engine, loaded.spec,
                                   loaded.params if params is None else params,
                                   prompt_segments, options=options, tolerance=tolerance)


__all__ = ["ImagePiece", "LayoutMismatch", "ParityReport", "TextPiece", "compare",
           "compare_logits", "compare_with_engine", "engine_logits"]
