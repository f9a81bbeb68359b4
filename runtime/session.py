"""The model side of one agent episode: screenshots in, structured actions out.

``act`` submits the critical step (the new screenshot, plus the previous action's text when
no prefetch carried it) and turns the decoded text into an ``Action`` record; ``prefetch``
(overlap) submits the previous action's text and lets the policy prefill what the next step
already knows while the VM executes the action.  Outputs are token-for-token the same with or
without overlap: the same segments reach the log, prefilled in the same pieces.

``EpisodeDriver`` (runtime/driver.py) is the one place that calls these two; use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from cachepolicy.context_log import Segment
from cachepolicy.segments import SegmentFactory
from runtime.actions import CoordConvention, NoOp, format_action, parse_action
from runtime.config import AgentConfig
from scheduler.records import StepRecord
from scheduler.scheduler import Scheduler
from scheduler.transaction import EpisodeCache, PrefetchRecord, StepOptions
from vmenv.actions import Action

NOOP_TEXT = "noop()"  # what an unparsable step leaves in the history (never the raw text)

SYSTEM_PROMPT = (
    "You are a GUI agent operating a desktop of {width}x{height} pixels through screenshots. "
    "Reply with exactly one action: click(x, y), double_click(x, y), right_click(x, y), "
    "move_to(x, y), drag(x0, y0, x1, y1), type(\"text\"), hotkey(\"ctrl\", \"c\"), "
    "press(\"enter\"), scroll(dx, dy), wait(seconds), done() or fail(). {coords}")

_COORDS = {
    CoordConvention.ABSOLUTE: "Coordinates are absolute screen pixels.",
    CoordConvention.RELATIVE_999: "Coordinates are on a 0-999 grid over the screen.",
    CoordConvention.RELATIVE_1: "Coordinates are fractions 0-1 of the screen.",
}

#: Teacher forcing: the history text of step i, or None to use what the model decided.
Teacher = Callable[[int], str | None]


def system_prompt(config: AgentConfig, screen: tuple[int, int]) -> str:
    """The system prompt an agent with ``config`` sees on a ``screen``-sized desktop."""
    if config.system_prompt is not None:
        return config.system_prompt
    return SYSTEM_PROMPT.format(width=screen[0], height=screen[1],
                                coords=_COORDS[config.convention])


@attrs.frozen
class ActStep:
    """One decided step: the action (data), the model's text, and the transaction record."""

    index: int
    action: Action
    response: str
    record: StepRecord
    prefetch: PrefetchRecord | None  # the prefetch that prepared this step, if any
    encode_s: float  # decoding + encoding the new screenshot (before the transaction)

    @property
    def parsed(self) -> bool:
        return not isinstance(self.action, NoOp)


@attrs.define(eq=False)
class AgentSession:
    """One episode's agent state: its step index and the text its last action leaves in the
    history.  ``teacher`` (replays, benchmarks) replaces that text with a recorded one, so
    every run of a recorded trajectory sees the same history whatever it decoded."""

    scheduler: Scheduler
    factory: SegmentFactory
    episode: EpisodeCache
    config: AgentConfig
    instruction: str
    screen: tuple[int, int]
    teacher: Teacher | None = None
    _index: int = 0
    _history_text: str | None = None  # the previous action as it enters the history
    _prefetched: bool = False  # the previous action's text went in with a prefetch
    _last_prefetch: PrefetchRecord | None = None
    unparsable: int = 0

    @property
    def steps_decided(self) -> int:
        return self._index

    @property
    def history_text(self) -> str | None:
        """The text the last decided action leaves in the history."""
        return self._history_text

    async def act(self, screenshot_png: bytes, *,
                  options: StepOptions | None = None) -> ActStep:
        """Decide the action for a new screenshot (the critical path); ``options`` override
        the episode's step options for this step."""
        i, f = self._index, self.factory
        carry = self._history_text if (i > 0 and not self._prefetched) else None
        encode = [0.0]

        def build() -> tuple[Segment, ...]:
            segs: tuple[Segment, ...] = ()
            if i == 0:
                segs = (f.preamble(system_prompt(self.config, self.screen)),
                        f.instruction(self.instruction))
            if carry is not None:
                segs += (f.action(i - 1, carry),)
            t0 = time.perf_counter()
            shot = f.screenshot(i, screenshot_png)  # PNG decode + vision encoder
            encode[0] = time.perf_counter() - t0
            return segs + (shot,)

        record = await self.scheduler.step(self.episode, build, options=options)
        response = record.output_text
        action = parse_action(response, convention=self.config.convention, screen=self.screen)
        if isinstance(action, NoOp):
            self.unparsable += 1
            history = NOOP_TEXT
        else:
            history = format_action(action, convention=self.config.convention,
                                    screen=self.screen)
        forced = self.teacher(i) if self.teacher is not None else None
        self._history_text = forced if forced is not None else history
        step = ActStep(i, action, response, record, self._last_prefetch, encode[0])
        self._index, self._prefetched, self._last_prefetch = i + 1, False, None
        return step

    async def prefetch(self) -> PrefetchRecord | None:
        """While the VM executes the last action: append its text and prefill what the next
        step already knows.  A discarded prefetch still hands its text to the next step."""
        if self._index == 0 or self._prefetched or self._history_text is None:
            return None
        i, text = self._index, self._history_text
        self._prefetched = True  # from here on the scheduler owns delivering the text
        rec = await self.scheduler.prefetch(self.episode,
                                            lambda: (self.factory.action(i - 1, text),))
        self._last_prefetch = rec
        return rec
