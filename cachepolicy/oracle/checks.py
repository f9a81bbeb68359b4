"""The exactness oracle: does checkpoint / restore / truncate reproduce a from-scratch prefill?

Each check compares the last-position logits of an edited path with those of one uninterrupted
prefill of the same content, and passes only on bitwise equality.  The refusal checks pass when
the engine raises ``UnsafeEditError`` *and* the sequence is left exactly as it was.  The sweeps
(``oracle_sweeps``) try many split points, chunk remainders and short pieces, because a kernel
chosen by a batch's row count can hide behind any single split point.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import attrs
import numpy as np
from PIL import Image, ImageDraw

from cachepolicy.engine.checkpoint import CheckpointKind
from cachepolicy.engine import Engine
from cachepolicy.errors import UnsafeEditError
from cachepolicy.oracle.encoder import (
    encoder_after_eviction, encoder_run_to_run, image_prompt,
)
from cachepolicy.oracle.lanes import decode_lanes
from cachepolicy.oracle.runs import decode_runs, row_classes, shaped, speculative_generation
from cachepolicy.oracle.sweeps import PROBE_ROWS, SweepResult, Sweeper, remainder_tokens

TEXT_A = ("You are a GUI agent. The screen shows a desktop with a file manager, a terminal and "
          "a browser. Step 1: click(120, 340). Step 2: type('report.txt'). ")
TEXT_B = "Now press enter and wait for the dialog to close."
TEXT_C = "A detour that will be cut away again before the real continuation."
TEXT_SPEC = ("Step 1: click(120, 34)\nStep 2: type(\"ls la\")\nStep 3: click(120, 34)\n"
             "Step 4: wait()\nStep 5: ")


@attrs.frozen
class CheckResult:
    name: str
    bitwise: bool
    max_abs_diff: float
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        diff = self.max_abs_diff if np.isfinite(self.max_abs_diff) else None  # JSON has no inf
        return {"name": self.name, "bitwise": self.bitwise, "max_abs_diff": diff}


def _compare(name: str, ref: np.ndarray, got: np.ndarray | None, detail: str = "") -> CheckResult:
    if got is None or got.shape != ref.shape:
        return CheckResult(name, False, float("inf"), detail or "no logits")
    diff = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
    return CheckResult(name, bool(np.array_equal(ref, got)), diff, detail)


def oracle_screenshot(width: int = 128, height: int = 96, *, variant: int = 0) -> bytes:
    """A deterministic synthetic screenshot (PNG bytes) for the image checks; another
    ``variant`` has other pixels at the same size."""
    img = Image.new("RGB", (width, height), (236, 236 - 40 * variant, 240))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, width, height // 8], fill=(40, 60, 120))
    draw.rectangle([width // 6, height // 4, width * 5 // 6, height * 3 // 4],
                   outline=(20, 20, 20), fill=(250, 250, 250))
    draw.rectangle([width // 2, height * 3 // 5, width * 3 // 4, height * 7 // 10],
                   fill=(30, 140, 60))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


class _Oracle:
    def __init__(self, engine: Engine) -> None:
        if engine.config.n_seq_max < 2:
            raise ValueError("the oracle needs an engine with n_seq_max >= 2")
        need = remainder_tokens(engine.config.n_batch)
        if engine.config.n_ctx_per_seq < need:
            raise ValueError(f"the oracle needs n_ctx_per_seq >= {need} (16 pieces longer than "
                             f"n_batch={engine.config.n_batch} in one sequence)")
        self.e = engine
        # Make A longer than one batch so one-call and split prefills chunk differently.
        self.a = self._text_at_least(TEXT_A, engine.config.n_batch + 7)
        self.b = engine.tokenize(TEXT_B)
        self.c = engine.tokenize(TEXT_C)
        # sweeps: x is split at every length mod 16; z holds 16 pieces longer than n_batch
        self.x = self._text_at_least(TEXT_B + " " + TEXT_C, 3 * 16)[:3 * 16]
        self.z = self._text_at_least(TEXT_A, remainder_tokens(engine.config.n_batch))
        self.sweeper = Sweeper(engine)
        # a history whose lines the generations' drafts can find again
        self.spec_prompt = self._text_at_least(TEXT_SPEC, 64)
        self.results: list[CheckResult] = []

    def _text_at_least(self, text: str, n: int) -> tuple[int, ...]:
        toks = self.e.tokenize(text)
        while len(toks) < n:
            toks += self.e.tokenize(text)
        return toks

    def _fresh(self) -> None:
        self.sweeper.fresh()

    def reference(self, *pieces: tuple[int, ...]) -> np.ndarray:
        self._fresh()
        logits = self.e.prefill_tokens(0, tuple(t for p in pieces for t in p))
        assert logits is not None
        self._fresh()
        return logits

    def _sweep(self, name: str, result: SweepResult) -> None:
        self.results.append(CheckResult(name, result.bitwise, result.max_abs_diff, result.detail))

    def short_piece_rows(self) -> list[int]:
        """Piece lengths 1..PROBE_ROWS that are not bitwise a one-call prefill on this model."""
        return self.sweeper.short_piece_rows(self.x[:16], self.x[16:16 + PROBE_ROWS])

    def run(self) -> list[CheckResult]:
        # split_prefill compares a | b with one call of a + b; every edit check compares with
        # the uninterrupted a | b, so each check tests one thing (on K-quant MoE models with
        # the prefill cap lifted a split prefill differs from one call while restores and
        # truncations stay exact)
        one_call = self.reference(self.a, self.b)
        ref = self.sweeper.run(None, [self.a, self.b])
        self.results.append(_compare("split_prefill", one_call, ref))
        self._text_checks(ref)
        self._sweep("split_points", self.sweeper.split_points(self.x))
        self._sweep("chunk_remainders", self.sweeper.chunk_remainders(self.z))
        self._sweep("restore_points", self.sweeper.restore_points(self.x))
        self._sweep("short_pieces_restore", self.sweeper.short_pieces_restore(
            self.x[:16], self.x[16:16 + 28], self.x[16 + 28:]))
        if self.e.kind.has_recurrent_state:
            self._hybrid_checks(ref)
        else:
            self._attention_checks(ref)
        if self.e.has_vision:
            self._image_checks()
        self._decode_checks()
        return self.results

    def _decode_checks(self) -> None:
        """Both decode shapes, whichever the engine uses: shared lane calls alone vs beside
        others, runs with guesses vs plain calls, generations with and without drafts."""
        e = self.e
        self._fresh()
        self._sweep("row_classes", row_classes(e))
        self._fresh()
        with shaped(e, e.shape_for(False)):
            self._sweep("decode_lanes", decode_lanes(e, (self.a, self.b + self.c),
                                                     (self.x[:8], self.x[8:16])))
        self._fresh()
        self._sweep("decode_runs", decode_runs(e, self.a, self.x[:3 * 16]))
        self._fresh()
        self._sweep("speculative_generation", speculative_generation(e, self.spec_prompt))
        self._fresh()

    def _text_checks(self, ref: np.ndarray) -> None:
        e = self.e
        self._fresh()
        e.prefill_tokens(0, self.a, logits=False)
        ckpt = e.checkpoint(0)
        for seq, name in ((0, "restore_same_seq"), (1, "restore_other_seq")):
            self._fresh()
            e.restore(seq, ckpt)
            self.results.append(_compare(name, ref, e.prefill_tokens(seq, self.b),
                                         f"checkpoint {ckpt.nbytes} bytes"))

    def _attention_checks(self, ref: np.ndarray) -> None:
        e = self.e
        self._fresh()
        e.prefill_tokens(0, self.a, logits=False)
        e.prefill_tokens(0, self.c, logits=False)
        e.truncate(0, len(self.a))
        self.results.append(_compare("tail_trim", ref, e.prefill_tokens(0, self.b)))

    def _hybrid_checks(self, ref: np.ndarray) -> None:
        e = self.e
        self._fresh()
        e.prefill_tokens(0, self.a, logits=False)
        partial = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
        e.prefill_tokens(0, self.c, logits=False)
        e.truncate(0, len(self.a), via=partial)
        self.results.append(_compare("partial_only_truncate", ref, e.prefill_tokens(0, self.b),
                                     f"partial checkpoint {partial.nbytes} bytes"))
        self._refusal("middle_removal_refused", ref,
                      lambda: e.remove_range(0, len(self.a) // 3, len(self.a) // 2))
        self._refusal("tail_trim_without_checkpoint_refused", ref,
                      lambda: e.truncate(0, len(self.a) // 2))

    def _refusal(self, name: str, ref: np.ndarray, edit: Callable[[], None]) -> None:
        """Pass iff the edit raises UnsafeEditError and the sequence still continues exactly."""
        e = self.e
        self._fresh()
        e.prefill_tokens(0, self.a, logits=False)
        try:
            edit()
        except UnsafeEditError as exc:
            self.results.append(_compare(name, ref, e.prefill_tokens(0, self.b), str(exc)))
            return
        self.results.append(CheckResult(name, False, float("inf"), "edit was not refused"))

    def _image_checks(self) -> None:
        e = self.e
        img = e.encode_image(oracle_screenshot())
        head = self.e.tokenize(TEXT_A) + img.prefix_tokens
        tail = img.suffix_tokens + self.b

        def prefix_and_image(seq: int) -> None:
            e.prefill_tokens(seq, head, logits=False)
            e.prefill_image(seq, img)

        self._fresh()
        prefix_and_image(0)
        ref = e.prefill_tokens(0, tail)
        assert ref is not None
        self._fresh()
        e.prefill_tokens(0, head, logits=False)
        before = e.checkpoint(0)
        e.prefill_image(0, img)
        after = e.checkpoint(0)
        self._fresh()
        e.restore(1, before)
        e.prefill_image(1, img)
        self.results.append(_compare("image_restore_before_image", ref, e.prefill_tokens(1, tail),
                                     f"{img.n_tokens} image tokens, {img.n_pos} positions"))
        self._fresh()
        e.restore(1, after)
        self.results.append(_compare("image_restore_after_image", ref, e.prefill_tokens(1, tail)))
        self._fresh()
        prefix_and_image(0)
        if e.kind.has_recurrent_state:
            partial = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
            e.prefill_tokens(0, self.c, logits=False)
            e.truncate(0, partial.pos, via=partial)
            name = "image_partial_only_truncate"
        else:
            pos = e.seq_info(0).next_pos
            e.prefill_tokens(0, self.c, logits=False)
            e.truncate(0, pos)
            name = "image_tail_trim"
        self.results.append(_compare(name, ref, e.prefill_tokens(0, tail)))
        self._sweep("image_split_points", self.sweeper.split_points(
            tail + self.c, lambda seq: prefix_and_image(seq)))
        self._encoder_checks(head, tail)

    def _encoder_checks(self, head: tuple[int, ...], tail: tuple[int, ...]) -> None:
        e = self.e
        prompt = image_prompt(e, head, tail)
        self._fresh()
        shots = [oracle_screenshot(), oracle_screenshot(variant=1), oracle_screenshot(200, 120)]
        self._sweep("encoder_run_to_run", encoder_run_to_run(e, shots))
        self._sweep("encoder_after_eviction",
                    encoder_after_eviction(e, shots[0], shots[1], prompt))
        self._fresh()


def run_checks(engine: Engine) -> list[CheckResult]:
    """Run every check that applies to the engine's model kind (and vision, if loaded)."""
    return _Oracle(engine).run()


def short_piece_rows(engine: Engine) -> list[int]:
    """The piece lengths (1..15 rows) that are not bitwise a one-call prefill on this model and
    CPU: its kernel classes.  The engine's contract does not need them (such pieces are exact
    against the same piece boundaries), so this informs and does not check."""
    return _Oracle(engine).short_piece_rows()
