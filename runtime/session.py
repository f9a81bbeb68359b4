"""The model side of one agent episode: screenshots in, structured actions out.

``act`` submits the critical step (the new screenshot, plus the previous action's text when
no prefetch carried it) and turns the decoded text into an ``Action`` record; ``prefetch``
(overlap) submits the previous action's text and lets the policy prefill what the next step
already knows while the VM executes the action.  Outputs are token-for-token the same with or
without overlap: the same segments reach the log (both paths render a past step through
``PromptText.past_step``), prefilled in the same pieces.

The agent profile (``AgentConfig.profile``, see ``runtime.profiles``) supplies every word the
model reads or writes: the system prompt, the instruction's and each past step's text, the
grammar and token budget of a response (``AgentConfig.step_options``), the parser, and the
text an action leaves in the history.  ``screen`` is the size of the screenshot the model
sees: its actions come back in those pixels.

``EpisodeDriver`` (runtime/driver.py) is the one place that calls these two; use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import attrs
import structlog

from cachepolicy.context_log import Segment
from cachepolicy.segments import SegmentFactory
from runtime.actions import NoOp, Screen
from runtime.config import AgentConfig, system_prompt
from runtime.profiles import Point, Profile, pointer_after
from scheduler.records import StepRecord
from scheduler.scheduler import Scheduler
from scheduler.transaction import EpisodeCache, PrefetchRecord, StepOptions
from vmenv.actions import Action

log = structlog.get_logger("kvagent.session")

#: Teacher forcing: the history text of step i, or None to use what the model decided.
Teacher = Callable[[int], str | None]


@attrs.frozen
class PromptText:
    """The profile's words around content, as segments — the one place they are rendered, so
    a step's critical path, its prefetch and a replay append the same segments."""

    factory: SegmentFactory
    config: AgentConfig
    profile: Profile

    def head(self, screen: Screen, instruction: str) -> tuple[Segment, Segment]:
        """The system prompt, then the first user turn opening with the instruction."""
        f = self.factory
        return (f.preamble(system_prompt(self.config, screen)),
                f.instruction(self.profile.layout.instruction_text(instruction)))

    def past_step(self, step: int, text: str) -> Segment:
        """Past step ``step`` in the history: its line with ``text`` (stripped)."""
        return self.factory.action(step, self.profile.layout.step_text(step, text.strip()))


@attrs.frozen
class ActStep:
    """One decided step: the action (data), the model's text, and the transaction record."""

    index: int
    action: Action  # in pixels of the screenshot the model saw
    response: str
    record: StepRecord
    prefetch: PrefetchRecord | None  # the prefetch that prepared this step, if any
    encode_s: float  # decoding + encoding the new screenshot (before the transaction)
    #: what the parser changed or refused (clamped points, ignored calls, why not an action)
    notes: tuple[str, ...] = ()

    @property
    def parsed(self) -> bool:
        return not isinstance(self.action, NoOp)


@attrs.define(eq=False)
class AgentSession:
    """One episode's agent state: its step index, the text its last action leaves in the
    history and where the pointer is.  ``teacher`` (replays, benchmarks) replaces that text
    with a recorded one, so every run of a recorded trajectory sees the same history whatever
    it decoded."""

    scheduler: Scheduler
    factory: SegmentFactory
    episode: EpisodeCache
    config: AgentConfig
    instruction: str
    screen: Screen  # the screenshot's size (may change between steps: the next step's)
    teacher: Teacher | None = None
    profile: Profile = attrs.field(init=False)
    prompt: PromptText = attrs.field(init=False)
    _index: int = 0
    _history_text: str | None = None  # the previous action as it enters the history
    _prefetched: bool = False  # the previous action's text went in with a prefetch
    _last_prefetch: PrefetchRecord | None = None
    _pointer: Point | None = None  # where the last action left the mouse (None: unknown)
    _projector_checked: set[Screen] = attrs.Factory(set)
    # the last decided screenshot (the guess for the next one) and its pixel identity
    _last_png: bytes | None = None
    _last_image_id: str | None = None
    # what the next prefetch appends instead of the last step's history line (a whole-prompt
    # client's predicted next turn; see ``respond``)
    _continuation: tuple[Segment, ...] | None = None
    unparsable: int = 0

    def __attrs_post_init__(self) -> None:
        self.profile = self.config.make_profile()
        self.prompt = PromptText(self.factory, self.config, self.profile)

    @property
    def steps_decided(self) -> int:
        return self._index

    @property
    def history_text(self) -> str | None:
        """The text the last decided action leaves in the history."""
        return self._history_text

    def resize(self, screen: Screen) -> None:
        """The next screenshots have another size: decide in its pixels from now on (the
        pointer's last position, in the old pixels, is forgotten)."""
        if screen != self.screen:
            self.screen, self._pointer = screen, None

    async def act(self, screenshot_png: bytes, *,
                  options: StepOptions | None = None) -> ActStep:
        """Decide the action for a new screenshot (the critical path); ``options`` replace
        the profile's step options for this step (e.g. a request's sampling)."""
        i, prompt, screen = self._index, self.prompt, self.screen
        carry = self._history_text if (i > 0 and not self._prefetched) else None
        encode, image_tokens = [0.0], [0]

        image_id: list[str | None] = [None]

        def build() -> tuple[Segment, ...]:
            segs: tuple[Segment, ...] = prompt.head(screen, self.instruction) if i == 0 else ()
            if carry is not None:
                segs += (prompt.past_step(i - 1, carry),)
            t0 = time.perf_counter()
            shot = self.factory.screenshot(i, screenshot_png)  # PNG decode + vision encoder
            encode[0] = time.perf_counter() - t0
            image_tokens[0], image_id[0] = shot.n_image_tokens, shot.image_id
            return segs + (shot,)

        if options is None:
            options = self.config.step_options(screen)
        record = await self.scheduler.step(self.episode, build, options=options)
        response = record.output_text
        parsed = self.profile.parse(response, screen, pointer=self._pointer)
        action, notes = parsed.action, parsed.notes
        if isinstance(action, NoOp):
            self.unparsable += 1
            notes += (f"not an action: {action.reason}",)
        notes += self._check_projector(image_tokens[0], screen)
        history = self.profile.history_text(action, response, screen)
        forced = self.teacher(i) if self.teacher is not None else None
        self._history_text = forced if forced is not None else history
        self._pointer = pointer_after(action, self._pointer)
        step = ActStep(i, action, response, record, self._last_prefetch, encode[0], notes)
        self._index, self._prefetched, self._last_prefetch = i + 1, False, None
        self._last_png, self._last_image_id = screenshot_png, image_id[0]
        return step

    @property
    def last_image_id(self) -> str | None:
        """The pixel identity of the screenshot the last step decided on."""
        return self._last_image_id

    async def guess(self, stop: threading.Event | None = None) -> PrefetchRecord | None:
        """After the prefetch, while the VM still acts: prefill the next step's prompt as if
        its screenshot were the last one again (``Scheduler.guess``; the log never holds
        it).  ``stop``: stop at the next piece boundary (the real screenshot differs)."""
        if self._last_png is None or not self._prefetched:
            return None
        i, png = self._index, self._last_png
        return await self.scheduler.guess(
            self.episode, lambda: (self.factory.screenshot(i, png),), stop=stop)

    @property
    def can_encode_ahead(self) -> bool:
        """Encoding a screenshot while the prefetch runs can shorten the critical path: asked
        for, and the encoder runs beside the llama context (else it would only queue)."""
        return self.config.encode_ahead and self.factory.engine.encoder_runs_beside

    def encode_ahead(self, screenshot_png: bytes) -> None:
        """Run the vision encoder on the next step's screenshot now (blocking; a worker
        thread's job): the embedding lands in the engine's cache, where ``act``'s build
        finds it."""
        self.factory.engine.encode_image(screenshot_png)

    async def respond(self, build: Callable[[], tuple[Segment, ...]], *, options: StepOptions,
                      continuation: Callable[[str], tuple[Segment, ...]]) -> ActStep:
        """A step whose whole prompt the caller renders (a chat client that sends every
        message every time): ``build``'s segments replace the log, the policy reuses what the
        sequence holds of them, and the response is returned as text (the profile parses
        it).  ``continuation(response)`` gives what the client's next request will most
        likely add after this prompt: the next prefetch prefills it."""
        i, screen = self._index, self.screen
        record = await self.scheduler.step(self.episode, build, options=options, replace=True)
        response = record.output_text
        action = self.profile.parse(response, screen).action
        self._history_text = self.profile.history_text(action, response, screen)
        self._continuation = continuation(response)
        step = ActStep(i, action, response, record, self._last_prefetch, 0.0)
        self._index, self._prefetched, self._last_prefetch = i + 1, False, None
        self._last_png = self._last_image_id = None  # a whole-prompt client: no guess
        return step

    async def observe(self, screenshot_png: bytes, history_text: str) -> None:
        """A past step told, not decided: its screenshot joins the log and ``history_text``
        becomes its line in the history (a conversation that starts with history, e.g. a
        chat client's earlier turns).  Nothing is decoded; the policy prefills what the next
        step will need, as a prefetch would."""
        i, prompt, screen = self._index, self.prompt, self.screen
        carry = self._history_text if (i > 0 and not self._prefetched) else None

        def build() -> tuple[Segment, ...]:
            segs: tuple[Segment, ...] = prompt.head(screen, self.instruction) if i == 0 else ()
            if carry is not None:
                segs += (prompt.past_step(i - 1, carry),)
            return segs + (self.factory.screenshot(i, screenshot_png),)

        await self.scheduler.prefetch(self.episode, build)  # discarded: the next step has it
        self._history_text = history_text
        self._index, self._prefetched, self._last_prefetch = i + 1, False, None
        self._last_png = self._last_image_id = None

    def _check_projector(self, n_tokens: int, screen: Screen) -> tuple[str, ...]:
        """Once per screenshot size: a note when the projector did not make of the screenshot
        what the profile's model expects (UI-TARS 1.5 answers in the pixels of its own
        resize: then its points land off target)."""
        if screen in self._projector_checked:
            return ()
        self._projector_checked.add(screen)
        expected = self.profile.image_tokens(screen)
        if expected is None or expected == n_tokens:
            return ()
        log.warning("projector_mismatch", profile=self.profile.name, screen=screen,
                    expected=expected, image_tokens=n_tokens)
        return (f"the projector made {n_tokens} image tokens of the {screen[0]}x{screen[1]} "
                f"screenshot where the {self.profile.name} model's processor makes "
                f"{expected}: its points may be off target",)

    async def prefetch(self) -> PrefetchRecord | None:
        """While the VM executes the last action: append its text and prefill what the next
        step already knows.  A discarded prefetch still hands its text to the next step."""
        if self._index == 0 or self._prefetched or self._history_text is None:
            return None
        i, text, continuation = self._index, self._history_text, self._continuation
        self._prefetched = True  # from here on the scheduler owns delivering the text
        if continuation is not None:
            self._continuation = None
            build = lambda: continuation  # noqa: E731  (a whole-prompt client's next turn)
        else:
            build = lambda: (self.prompt.past_step(i - 1, text),)  # noqa: E731
        rec = await self.scheduler.prefetch(self.episode, build)
        self._last_prefetch = rec
        return rec
