"""Training prompts laid out exactly as the runtime prefills them, from scratch.

For one step of an episode — the instruction, the past steps (the screenshot each saw and the
action it took) and the current screenshot — ``PromptBuilder`` returns the pieces the runtime
prefills for that step into an empty sequence, followed by the target (the expert's action
in the profile's spelling, then the end-of-generation token the engine stops at, marked
``train=True``).  Nothing here renders text of its own:

* the context log is built from the session's own segments (``runtime.session.PromptText``:
  system prompt, instruction, one ``Step i: …`` history line per past step with the text the
  profile's ``history_text`` gives the action; ``SegmentFactory.screenshot`` for images), in
  the order the session appends them;
* the layout is the policy's own ``select`` on an empty cache view (a fresh episode's
  sequence): ``terminal-*`` give ``[preamble][text history][≤K screenshots][generation
  prompt]``, ``evict`` interleaved turns with the last K screenshots, ``noevict`` every
  screenshot;
* the runtime's pieces become the trainer's (``TextPiece`` / ``ImagePiece``): an image's
  projector markers (``<|vision_start|>`` / ``<|vision_end|>``) move from the surrounding text
  into the ``ImagePiece``, which the trainer expands back into the same rows.

Invariant (tests/test_train_prompts.py runs the real runtime and checks it step by step):
the rows of ``StepExample.prompt`` are the rows the runtime's sequence holds when the step
decodes; the rows of ``StepExample.target`` are what a model must decode to answer the
expert's action and stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog, Segment
from cachepolicy.engine.checkpoint import GENESIS
from cachepolicy.engine.records import SeqInfo
from cachepolicy.pieces import Piece
from cachepolicy.plan import CacheState, CacheView
from cachepolicy.segments import SegmentFactory
from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.session import PromptText
from runtime.train.example import ImagePiece, TextPiece
from vmenv.actions import Action

TrainPiece = TextPiece | ImagePiece

#: The policies whose from-scratch layout this module reproduces (relocate's first step is
#: its chronological layout, but its later steps are edited caches no prompt reproduces).
LAYOUT_POLICIES = ("terminal-scratch", "terminal-slot", "evict", "noevict")


class LayoutError(ValueError):
    """The runtime's pieces are not what this module expects (a projector whose markers are
    not around the image, a chat template without an end-of-generation token)."""


@attrs.frozen
class PastStep:
    """A step the agent took: the screenshot it saw and the action it took on it (which
    enters the history as the profile renders it)."""

    png: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    action: Action


@attrs.frozen
class StepExample:
    """One step as training data: ``prompt`` (the runtime's prefill, as trainer pieces),
    ``target`` (the response tokens, ``train=True``), ``layout`` (the runtime's own pieces,
    for checks and statistics) and the response text."""

    prompt: tuple[TrainPiece, ...]
    target: TextPiece
    layout: tuple[Piece, ...] = attrs.field(repr=False)
    response: str

    @property
    def pieces(self) -> tuple[TrainPiece, ...]:
        """What ``build_example`` takes: the prompt, then the target."""
        return (*self.prompt, self.target)


def empty_view() -> CacheView:
    """The cache view of a fresh episode: nothing published, an empty sequence."""
    return CacheView(CacheState(), SeqInfo(seq=0, next_pos=0, n_tokens=0, digest=GENESIS,
                                           history=()))


def history_text(config: AgentConfig, action: Action, screen: Screen) -> str:
    """The text ``action`` leaves in the history, as the session records it when the model
    answered exactly the profile's spelling of it (what a teacher forcing the expert gives)."""
    profile = config.make_profile()
    return profile.history_text(action, profile.format(action, screen), screen)


def end_of_generation(factory: SegmentFactory) -> tuple[int, ...]:
    """The tokens that close a response: the chat template's text after an assistant turn,
    up to and including its first end-of-generation token (``<|im_end|>`` for ChatML), where
    the engine's decoding stops.  ``LayoutError`` if the template has none."""
    engine = factory.engine
    closing = factory.kit.turn_break  # assistant suffix + next user prefix
    for i, tok in enumerate(closing):
        if engine.is_end_of_generation(tok):
            return tuple(closing[: i + 1])
    raise LayoutError("the chat template closes an assistant turn without an "
                      "end-of-generation token: a response would never stop")


class PromptBuilder:
    """Step prompts for one engine (its tokenizer, template and projector), one agent
    configuration (profile, policy, window) and one screen size.  Stateless between calls
    except for the policy object (configured once) and the engine's embedding cache."""

    def __init__(self, factory: SegmentFactory, config: AgentConfig, screen: Screen) -> None:
        if config.policy not in LAYOUT_POLICIES:
            raise LayoutError(f"policy {config.policy!r} has no from-scratch training layout; "
                              f"known: {', '.join(LAYOUT_POLICIES)}")
        self.factory, self.config, self.screen = factory, config, screen
        self.profile = config.make_profile()
        self.text = PromptText(factory, config, self.profile)
        self.policy: CachePolicy = config.make_policy(factory, screen)
        self.eog = end_of_generation(factory)

    # ------------------------------------------------------------------ the log

    def logs(self, instruction: str, steps: Sequence[PastStep],
             current: bytes | None = None) -> list[ContextLog]:
        """The context log before each step's decision, built as the session appends it
        (step 0: head + screenshot 0; step i: history line i-1 + screenshot i): entry i shows
        screenshots 0..i and the history lines of steps 0..i-1.  ``steps`` are the steps
        taken; ``current`` (if given) is one more screenshot, the last entry's.  Logs depend
        on the profile and the screen only: builders of other layouts may share them."""
        pngs = [s.png for s in steps] + ([current] if current is not None else [])
        out: list[ContextLog] = []
        log = ContextLog()
        for i, png in enumerate(pngs):
            segs: tuple[Segment, ...] = (self.text.head(self.screen, instruction) if i == 0
                                         else (self.past_step(i - 1, steps[i - 1].action),))
            log = log.append(*segs, self.factory.screenshot(i, png))
            out.append(log)
        return out

    def past_step(self, index: int, action: Action) -> Segment:
        """Past step ``index``'s history line, as the session renders it."""
        return self.text.past_step(index, history_text(self.config, action, self.screen))

    def log(self, instruction: str, past: Sequence[PastStep], current: bytes) -> ContextLog:
        """The log the step after ``past`` decides on (``current`` is its screenshot)."""
        return self.logs(instruction, past, current)[-1]

    # ------------------------------------------------------------------ layout and target

    def layout(self, log: ContextLog) -> tuple[Piece, ...]:
        """The runtime's pieces for ``log`` on a fresh sequence: the policy's plan."""
        return self.policy.select(log, empty_view()).pieces

    def response(self, action: Action) -> str:
        """The response the model should write for ``action`` (the profile's spelling)."""
        return self.profile.format(action, self.screen)

    def target(self, action: Action) -> TextPiece:
        """The response's tokens, then the end of generation: what the loss is taken on."""
        return TextPiece(self.factory.engine.tokenize(self.response(action)) + self.eog,
                         train=True)

    def example(self, log: ContextLog, action: Action) -> StepExample:
        """The step deciding on ``log`` (from ``logs``), trained to answer ``action``."""
        layout = self.layout(log)
        return StepExample(training_pieces(self.factory, layout), self.target(action), layout,
                           self.response(action))

    def step(self, instruction: str, past: Sequence[PastStep], current: bytes,
             action: Action) -> StepExample:
        """One step from its parts: ``past`` steps taken, the ``current`` screenshot and the
        expert's ``action`` on it."""
        return self.example(self.log(instruction, past, current), action)


def training_pieces(factory: SegmentFactory, pieces: Iterable[Piece]) -> tuple[TrainPiece, ...]:
    """The runtime's pieces as the trainer's: the text between two images as one
    ``TextPiece`` (``train=False``), each image as an ``ImagePiece`` with the projector's
    marker tokens taken out of the text around it (the trainer puts them back: the same rows
    in the same order).  ``LayoutError`` when the markers are not where the projector puts
    them."""
    out: list[TrainPiece] = []
    text: list[int] = []  # the tokens since the last image
    suffix: tuple[int, ...] = ()  # the last image's end marker, which opens ``text``

    def flush(prefix: tuple[int, ...]) -> None:
        n = len(text) - len(prefix)
        if n < len(suffix) or tuple(text[:len(suffix)]) != suffix:
            raise LayoutError("the text after an image does not open with its end marker")
        if tuple(text[n:]) != prefix:
            raise LayoutError("the text before an image does not close with its start marker")
        if n > len(suffix):
            out.append(TextPiece(text[len(suffix):n]))
        text.clear()

    for p in pieces:
        if p.image is None:
            text.extend(p.tokens)
            continue
        seg = p.image
        assert seg.png is not None, "a screenshot segment carries its PNG"
        # the image was encoded when its segment was made: a cache hit
        enc = factory.engine.encode_image(seg.png, image_id=seg.image_id)
        flush(tuple(enc.prefix_tokens))
        out.append(ImagePiece(seg.png))
        suffix = tuple(enc.suffix_tokens)
    flush(())
    return tuple(out)
