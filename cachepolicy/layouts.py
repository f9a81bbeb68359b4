"""How each policy lays an episode's log out as pieces (before merging).

All layouts draw from the same fixed token runs (segment tokens and the chat format's turn
wrappers in ``PromptKit``), so two layouts that show the same content show the same tokens.
"""

from __future__ import annotations

import attrs

from cachepolicy.context_log import ContextLog, Segment
from cachepolicy.pieces import Piece, image_piece, merge_text, text_piece


@attrs.frozen
class PromptKit:
    """Fixed token runs from the model's chat template."""

    generation_prompt: tuple[int, ...]  # closes the user turn, opens the assistant's
    turn_break: tuple[int, ...]  # closes an assistant turn, opens the next user turn
    older_header: tuple[int, ...] = ()  # "Earlier steps:" line used by the evict layout


def _head(log: ContextLog) -> list[Piece]:
    return [text_piece("head", tuple(t for s in log.head for t in s.tokens),
                       tuple(s.key for s in log.head))]


def _shot(s: Segment) -> list[Piece]:
    return [text_piece(f"{s.key}:intro", s.intro, (s.key,)), image_piece(s),
            text_piece(f"{s.key}:outro", s.outro, (s.key,))]


def _action(a: Segment) -> Piece:
    return text_piece(a.key, a.tokens, (a.key,))


def window_of(log: ContextLog, window: int | None, pinned: int = 0) -> tuple[Segment, ...]:
    """The screenshots a window of ``window`` shows: the episode's first ``pinned`` (its
    starting screens, kept for the whole episode: a look-back), then the newest
    ``window - pinned``, in step order; every screenshot when ``window`` is None.

    A prefetch lays out ``window - 1`` with the same ``pinned``: the next step's window
    without its new screenshot, so ``pinned <= window`` here (a policy needs ``pinned <
    window`` so that a step shows its newest screenshot)."""
    shots = log.screenshots
    if window is None or len(shots) <= window:
        return shots
    if not 0 <= pinned <= window:
        raise ValueError(f"{pinned} pinned screenshots do not fit a window of {window}")
    newest = window - pinned
    return shots[:pinned] + (shots[len(shots) - newest:] if newest else ())


def terminal(log: ContextLog, kit: PromptKit, window: int, *,
             generation_prompt: bool = True, pinned: int = 0) -> tuple[list[Piece], int]:
    """``[head][action…][≤K screenshots][generation prompt]``; returns (pieces, region start)."""
    pieces = _head(log) + [_action(a) for a in log.actions]
    region = len(pieces)
    for s in window_of(log, window, pinned):
        pieces += _shot(s)
    if generation_prompt:
        pieces.append(text_piece("gen", kit.generation_prompt))
    return pieces, region


def terminal_steps(log: ContextLog, kit: PromptKit, window: int, *,
                   generation_prompt: bool = True, pinned: int = 0,
                   ) -> tuple[tuple[Piece, ...], int]:
    """``terminal`` with adjacent text merged, except that every history piece (one per step)
    stays its own and the region start is a piece boundary; returns (pieces, region start).

    terminal-slot needs these boundaries (last step's checkpoint digest is a prefix of this
    step's prompt); terminal-scratch uses the same ones, so the two prefill identical batches
    and compare bitwise even where a short piece would take another kernel than inside a
    longer one (see ``cachepolicy.engine``)."""
    raw, region = terminal(log, kit, window, generation_prompt=generation_prompt,
                           pinned=pinned)
    return merge_text(raw, keep_before=frozenset(range(1, region + 1))), region


def interleaved(log: ContextLog, kit: PromptKit, window: int | None) -> list[Piece]:
    """Chat turns as today's agents send them: one user turn per screenshot, one assistant
    turn per action; steps older than the window fold into text in the first user turn."""
    shown = window_of(log, window)
    first_step = shown[0].step if shown else 10**9
    actions = {a.step: a for a in log.actions}
    pieces = _head(log)
    older = [a for a in log.actions if a.step < first_step]
    if older:
        pieces.append(text_piece("older_header", kit.older_header))
        pieces += [_action(a) for a in older]
    for s in shown:
        pieces += _shot(s)
        if s.step in actions:
            pieces.append(text_piece(f"open@{s.step}", kit.generation_prompt))
            pieces.append(_action(actions[s.step]))
            pieces.append(text_piece(f"break@{s.step}", kit.turn_break))
    pieces.append(text_piece("gen", kit.generation_prompt))
    return pieces


def chronological(log: ContextLog, kit: PromptKit, window: int, *,
                  pinned: int = 0, generation_prompt: bool = True) -> list[Piece]:
    """Relocate's layout (and chrono-slot's, before merging): actions in step order,
    screenshots kept only inside the window, each in its own piece so a dropped
    screenshot's span is a run of the sequence."""
    shown = {s.step for s in window_of(log, window, pinned)}
    actions = {a.step: a for a in log.actions}
    pieces = _head(log)
    for s in log.screenshots:
        if s.step in shown:
            pieces += _shot(s)
        if s.step in actions:
            pieces.append(_action(actions[s.step]))
    if generation_prompt:
        pieces.append(text_piece("gen", kit.generation_prompt))
    return pieces


def chronological_steps(log: ContextLog, kit: PromptKit, window: int, *,
                        generation_prompt: bool = True) -> tuple[tuple[Piece, ...], int]:
    """The chronological layout for an exact policy (chrono-slot): ``[head][the line of every
    step whose screenshot left the window…][each of the last K screenshots followed by its
    step's line…][generation prompt]`` — the order OSWorld's agents send (each answer after
    its screenshot), with the steps that left the window kept as lines before it, as the
    terminal layout keeps them.  Returns (pieces, region start: the window's first piece).

    Adjacent text is merged, except that every line before the window stays its own piece
    (the region start advances by one line per slide) and every screenshot's label starts a
    piece: a screenshot's closing text and its step's line are one piece, known after the
    step answered (what a prefetch prefills), and the next screenshot's label is the next
    step's own piece.  So while the window grows, a step's prompt extends the previous
    one's up to its last image — appended, not re-prefilled."""
    raw = chronological(log, kit, window, generation_prompt=generation_prompt)
    # the window is the newest screenshots (nothing pinned): every piece before its first
    # label is the head or the line of a step that left it
    images = [i for i, p in enumerate(raw) if p.is_image]
    region = images[0] - 1 if images else len(raw) - (1 if generation_prompt else 0)
    # the head and each line before the window its own piece; each screenshot's label
    # (the piece before its image) starts one
    keep = set(range(1, region + 1)) | {i - 1 for i in images}
    pieces = merge_text(raw, keep_before=frozenset(keep))
    # region as an index into the merged pieces: the head and the lines before the window
    # are kept apart, so it is unchanged unless empty text pieces were dropped
    merged_region = sum(1 for p in raw[:region] if p.is_image or p.tokens)
    return pieces, merged_region
