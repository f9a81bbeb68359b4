"""A long agent prompt, and prefixes of it of a given length, for ``kvagent
bench-replay-prefix``.

The prompt is what the runtime prefills for one long episode under ``noevict`` (interleaved
turns, every screenshot kept: the layout whose matched prefix grows step after step): expert
demonstrations of held-out simdesk instances, one kind after another, chained into one
episode — their screenshots (``render_png``, the env's own) and the history lines the
session writes for the expert's actions (``PromptText``, the profile's spelling), appended
to a ``ContextLog`` as ``AgentSession`` appends them and laid out by the policy itself.

``case`` cuts it at ``L`` rows: the first L rows of the layout (inside a text piece if need
be; a screenshot straddling L is kept or left out whole, whichever leaves the prefix nearer
L: a prefix may miss L by up to half a screenshot), then a new suffix — the next
screenshot's turn (its caption, image and closing text) or the next history lines cut to 32
rows — and the generation prompt.  The sequence the step starts from holds the prefix and
then what the new prompt no longer has there (``detour``: the generation prompt the last
request ended with), so the prompt's true point of divergence is the prefix's end.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog, Segment
from cachepolicy.pieces import Piece, image_piece, n_tokens, text_piece
from cachepolicy.segments import SegmentFactory
from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.session import PromptText
from vmenv.actions import Action
from vmenv.simdesk import demonstration, eval_seeds, sample_task, task_kinds
from vmenv.simdesk.render import render_png

#: the suffixes a case may end with
SUFFIXES = ("screenshot", "text")
#: rows of the text suffix, generation prompt included
TEXT_SUFFIX_ROWS = 32
#: instances chained at most (a few steps each: far more than a model's context holds)
MAX_INSTANCES = 2000


@attrs.frozen
class AgentPrompt:
    """One long episode: its log, the layout's pieces (without the final generation
    prompt) and how many steps it holds."""

    log: ContextLog = attrs.field(repr=False)
    pieces: tuple[Piece, ...] = attrs.field(repr=False)
    steps: int
    generation_prompt: tuple[int, ...]

    @property
    def rows(self) -> int:
        return n_tokens(self.pieces)


def _demo_steps(screen: Screen) -> Iterator[tuple[str, bytes, Action]]:
    """(instruction, screenshot, expert action) of held-out simdesk instances, kind after
    kind (instance i: kind i mod 8 on the i-th evaluation seed, as ``kvagent run`` picks)."""
    kinds = task_kinds()
    for i, seed in enumerate(eval_seeds(MAX_INSTANCES)):
        task = sample_task(kinds[i % len(kinds)], seed)
        for step in demonstration(task, *screen):
            yield task.instruction, render_png(step.state), step.action
    raise ValueError(f"{MAX_INSTANCES} simdesk instances hold too few steps")


def agent_prompt(factory: SegmentFactory, config: AgentConfig, screen: Screen,
                 rows: int) -> AgentPrompt:
    """An episode whose noevict layout holds at least ``rows`` rows (plus one more
    screenshot turn after them, for a suffix)."""
    profile = config.make_profile()
    text = PromptText(factory, config, profile)
    policy = config.make_policy(factory, screen, policy="noevict")
    log = ContextLog()
    last: str | None = None
    for i, (instruction, png, action) in enumerate(_demo_steps(screen)):
        segs: tuple[Segment, ...] = (text.head(screen, instruction) if i == 0
                                     else (text.past_step(i - 1, last or ""),))
        log = log.append(*segs, factory.screenshot(i, png))
        last = profile.history_text(action, profile.format(action, screen), screen)
        pieces = _layout(policy, log)
        if n_tokens(pieces) > rows + 2 * log.screenshots[-1].n_tokens:
            return AgentPrompt(log, pieces, i + 1, factory.kit.generation_prompt)
    raise AssertionError("unreachable: _demo_steps raises when it runs out")


def _layout(policy: CachePolicy, log: ContextLog) -> tuple[Piece, ...]:
    """noevict's pieces for ``log`` without the trailing generation prompt."""
    pieces = policy.pieces(log)  # type: ignore[attr-defined]
    assert pieces[-1].key == "gen"
    return pieces[:-1]


@attrs.frozen
class Case:
    """A prefix of ``prefix_rows`` rows (asked: ``length``), the suffix after it (ending
    with the generation prompt) and what the sequence holds after the prefix instead."""

    length: int
    prefix: tuple[Piece, ...] = attrs.field(repr=False)
    suffix: tuple[Piece, ...] = attrs.field(repr=False)
    detour: tuple[Piece, ...] = attrs.field(repr=False)
    log: ContextLog = attrs.field(repr=False)  # holds every segment the pieces show

    @property
    def prefix_rows(self) -> int:
        return n_tokens(self.prefix)

    @property
    def suffix_rows(self) -> int:
        return n_tokens(self.suffix)

    @property
    def screenshots(self) -> int:
        """Screenshots in the prefix."""
        return sum(p.is_image for p in self.prefix)

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The new prompt."""
        return self.prefix + self.suffix


def case(prompt: AgentPrompt, length: int, suffix: str, *, limit: int | None = None) -> Case:
    """The prompt cut at ``length`` rows, followed by a ``suffix`` (``SUFFIXES``); the prefix
    never holds more than ``limit`` rows (a straddling screenshot is then left out)."""
    if suffix not in SUFFIXES:
        raise ValueError(f"suffix {suffix!r}: one of {', '.join(SUFFIXES)}")
    if prompt.rows <= length:
        raise ValueError(f"the episode holds {prompt.rows} rows, not more than {length}")
    prefix: list[Piece] = []
    rows, i = 0, 0
    while rows < length:
        p = prompt.pieces[i]
        if rows + p.n_tokens > length:
            if not p.is_image:  # cut inside the text
                prefix.append(attrs.evolve(p, key=f"{p.key}[:{length - rows}]",
                                           tokens=p.tokens[: length - rows]))
            elif (rows + p.n_tokens - length < length - rows  # nearer L with the image
                  and (limit is None or rows + p.n_tokens <= limit)):
                prefix.append(p)
                i += 1
            break
        prefix.append(p)
        rows, i = rows + p.n_tokens, i + 1
    gen = text_piece("gen", prompt.generation_prompt)
    after = prompt.pieces[i:]
    if suffix == "screenshot":
        shot = next((p for p in after if p.is_image), None)
        if shot is None or shot.image is None:
            raise ValueError(f"no screenshot after row {length} in the episode")
        seg = shot.image
        tail: tuple[Piece, ...] = (text_piece(f"{seg.key}:intro", seg.intro, (seg.key,)),
                                   image_piece(seg),
                                   text_piece(f"{seg.key}:outro", seg.outro, (seg.key,)))
    else:
        shown = {k for p in prefix for k in p.sources}
        # the history lines the prefix does not show yet, then from the first again
        lines = [t for a in prompt.log.actions if a.key not in shown for t in a.tokens]
        lines += [t for a in prompt.log.actions for t in a.tokens]
        text = lines[: TEXT_SUFFIX_ROWS - len(gen.tokens)]
        tail = (text_piece("suffix", text),)
    detour = (text_piece("detour", prompt.generation_prompt),)
    if tail[0].tokens[:1] == detour[0].tokens[:1]:
        raise ValueError("the suffix opens as the detour does: the prompts would match "
                         "beyond the prefix")
    return Case(length, tuple(prefix), tail + (gen,), detour, prompt.log)
