"""Training prompts are what the runtime prefills: the proof, step by step.

The real runtime (``run_agents`` → ``EpisodeDriver`` → scheduler → policy → engine) runs an
episode on the simulated desktop with the expert's actions forced into its history (and
executed by the env), overlap off, under each layout policy and K = 1, 3, 5.  After every
step the episode's sequence holds the step's prompt (decoding runs in a decode lane).  The
training prompt built by ``runtime.train.prompts`` for the same step must take the same
rows — every text token at the same position, every image (identified by its chained digest:
the env's screenshot is the demonstration's) at the same position with the same extent —
by the trainer's layout rule (``piece_rows``) at every step, and as the engine holds it after
prefilling the prompt into a fresh sequence (``prefill_pieces``) at each run's last step.
Deliberate mismatches (another window, another past action, another layout) are caught by
the same comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import attrs
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.checkpoint import RunKind
from cachepolicy.engine.images import decode_png
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.train.example import build_example
from runtime.train.prompts import (
    ImagePiece, LayoutError, PastStep, PromptBuilder, StepExample, TextPiece, end_of_generation,
    history_text,
)
from runtime.train.rowcheck import (
    Row, first_difference, history_rows, piece_rows, prefill_pieces,
)
from tests.train_helpers import SCREEN, RecordedRun, run_with_expert
from vmenv.actions import Click, TypeText
from vmenv.simdesk import DemoStep, Task, demonstration, sample_task, train_seeds
from vmenv.simdesk.render import render_png

POLICIES = ("evict", "terminal-scratch", "terminal-slot", "noevict")
WINDOWS = (1, 3, 5)
FRESH = 1  # the sequence training prompts are prefilled into


@pytest.fixture(scope="module")
def engine(forged: Callable[..., object]) -> Iterator[Engine]:
    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,  # type: ignore[attr-defined]
                EngineConfig(n_ctx_per_seq=4096, n_seq_max=2, n_batch=128,
                             n_threads=1)) as e:
        yield e


@attrs.frozen
class Episode:
    """A training instance, its expert demonstration and the screenshots of its steps."""

    task: Task
    demo: tuple[DemoStep, ...]
    pngs: tuple[bytes, ...] = attrs.field(repr=False)
    image_ids: tuple[str, ...] = attrs.field(repr=False)

    def past(self, step: int) -> list[PastStep]:
        return [PastStep(png, s.action) for png, s in zip(self.pngs[:step], self.demo)]


@pytest.fixture(scope="module")
def episode() -> Episode:
    """A training instance whose expert takes 6 steps (more than any window tested)."""
    for seed in train_seeds():
        task = sample_task("remember-code", seed)
        demo = demonstration(task, *SCREEN, with_done=True)  # as the recipe trains: done() ends it
        if len(demo) >= 6:
            pngs = tuple(render_png(s.state) for s in demo)
            return Episode(task, demo, pngs, tuple(decode_png(p).image_id for p in pngs))
    raise AssertionError("unreachable")


_recorded: dict[tuple[str, int], RecordedRun] = {}


def recorded(engine: Engine, episode: Episode, policy: str, window: int) -> RecordedRun:
    """The runtime's run under (policy, window), once per module."""
    key = (policy, window)
    if key not in _recorded:
        _recorded[key] = run_with_expert(
            engine, AgentConfig(policy=policy, window=window, overlap=False), episode.task,
            episode.demo)
    return _recorded[key]


def training_prompts(builder: PromptBuilder, episode: Episode) -> list[StepExample]:
    """Every step's training example, the expert's action its target."""
    logs = builder.logs(episode.task.instruction, episode.past(len(episode.demo)))
    return [builder.example(log, s.action) for log, s in zip(logs, episode.demo)]


def prefilled_rows(engine: Engine, example: StepExample, episode: Episode) -> tuple[Row, ...]:
    """The rows a fresh sequence holds after prefilling the example's prompt."""
    engine.clear(FRESH)
    try:
        prefill_pieces(engine, FRESH, example.prompt)
        return history_rows(engine.seq_info(FRESH).history, episode.image_ids)
    finally:
        engine.clear(FRESH)


@pytest.mark.parametrize("policy", POLICIES)
def test_training_prompts_are_the_runtime_s_prefill(engine: Engine, episode: Episode,
                                                     policy: str) -> None:
    factory = SegmentFactory(engine)
    ids = episode.image_ids
    for window in WINDOWS:
        run = recorded(engine, episode, policy, window)
        assert run.status == "done" and run.reward == 1.0  # the expert's hand solved it
        assert len(run.histories) == len(episode.demo)
        builder = PromptBuilder(factory, AgentConfig(policy=policy, window=window), SCREEN)
        examples = training_prompts(builder, episode)
        for step, history in enumerate(run.histories):
            runtime = history_rows(history, ids)
            shown = [r.content for r in runtime if r.kind is RunKind.EMBEDDINGS]
            n = step + 1 if policy == "noevict" else min(step + 1, window)
            assert shown == list(ids[step + 1 - n: step + 1])  # the env's screens: the demo's
            diff = first_difference(runtime, piece_rows(engine, examples[step].prompt))
            assert diff is None, f"{policy} K={window} step {step}: {diff}"
        # and the engine agrees: the last step's prompt prefilled into a fresh sequence
        diff = first_difference(runtime, prefilled_rows(engine, examples[-1], episode))
        assert diff is None, f"{policy} K={window} prefilled: {diff}"


@pytest.mark.parametrize("policy", ["terminal-scratch", "terminal-slot"])
def test_a_pinned_window_shows_the_first_screen_to_the_end(engine: Engine, episode: Episode,
                                                          policy: str) -> None:
    """``pinned=1``, K = 3: the runtime's sequence holds the episode's first screenshot and
    the newest two at every step (the look-back layout), and the training prompt built for
    the same config takes the same rows."""
    config = AgentConfig(policy=policy, window=3, pinned=1, overlap=False)
    run = run_with_expert(engine, config, episode.task, episode.demo)
    assert run.status == "done" and run.reward == 1.0
    examples = training_prompts(PromptBuilder(SegmentFactory(engine), config, SCREEN), episode)
    ids = episode.image_ids
    for step, history in enumerate(run.histories):
        runtime = history_rows(history, ids)
        shown = [r.content for r in runtime if r.kind is RunKind.EMBEDDINGS]
        want = list(ids[: step + 1]) if step < 3 else [ids[0], *ids[step - 1: step + 1]]
        assert shown == want, step
        diff = first_difference(runtime, piece_rows(engine, examples[step].prompt))
        assert diff is None, f"{policy} pinned step {step}: {diff}"


def test_the_check_catches_a_wrong_window_action_or_layout(engine: Engine,
                                                           episode: Episode) -> None:
    factory = SegmentFactory(engine)
    step = 4  # five screenshots so far: K = 3 shows three of them
    runtime = history_rows(recorded(engine, episode, "terminal-slot", 3).histories[step],
                           episode.image_ids)

    def rows(config: AgentConfig, ep: Episode = episode) -> tuple[Row, ...]:
        example = training_prompts(PromptBuilder(factory, config, SCREEN), ep)[step]
        return prefilled_rows(engine, example, ep)

    right = AgentConfig(policy="terminal-slot", window=3)
    assert first_difference(runtime, rows(right)) is None
    for wrong in (AgentConfig(policy="terminal-slot", window=2),
                  AgentConfig(policy="terminal-slot", window=4),
                  AgentConfig(policy="evict", window=3)):
        assert first_difference(runtime, rows(wrong)), wrong
    # another action in the history (step 1's click moved by one pixel)
    moved = list(episode.demo)
    a = moved[1].action
    assert isinstance(a, Click)
    moved[1] = attrs.evolve(moved[1], action=attrs.evolve(a, x=a.x + 1))
    diff = first_difference(runtime, rows(right, attrs.evolve(episode, demo=tuple(moved))))
    assert diff is not None and "TEXT" in diff


def test_the_target_is_the_profile_s_spelling_then_the_end_of_generation(
        engine: Engine, episode: Episode) -> None:
    factory = SegmentFactory(engine)
    config = AgentConfig(policy="terminal-scratch", window=3)
    builder = PromptBuilder(factory, config, SCREEN)
    demo = episode.demo
    typed = next(i for i, s in enumerate(demo) if isinstance(s.action, TypeText))
    example = builder.step(episode.task.instruction, episode.past(typed), episode.pngs[typed],
                           demo[typed].action)
    eog = end_of_generation(factory)
    assert len(eog) == 1 and engine.is_end_of_generation(eog[0])
    assert eog == engine.tokenize("<|im_end|>")  # the forged ChatML template's
    target = example.target
    assert target.train and target.tokens[-1] == eog[0]
    text = engine.detokenize(target.tokens[:-1])
    assert text == example.response == f'type("{demo[typed].action.text}")'
    profile = config.make_profile()
    assert profile.parse(text, SCREEN).action == demo[typed].action
    # the history says what the profile says of the same action
    assert history_text(config, demo[typed].action, SCREEN) == text
    # the prompt: text and images only, nothing trained, one image per screenshot shown
    assert not any(p.train for p in example.prompt if isinstance(p, TextPiece))
    assert sum(isinstance(p, ImagePiece) for p in example.prompt) == min(typed + 1, 3)
    assert example.pieces[-1] is target


def test_policies_without_a_from_scratch_layout_are_refused(engine: Engine) -> None:
    with pytest.raises(LayoutError, match="relocate"):
        PromptBuilder(SegmentFactory(engine), AgentConfig(policy="relocate"), SCREEN)


def test_trainer_examples_hold_the_runtime_s_rows(engine: Engine, episode: Episode) -> None:
    """The trainer core's ``build_example`` of a step's pieces has the runtime's rows
    (tokens, positions, image rows) and trains exactly the target's tokens."""
    factory = SegmentFactory(engine)
    step, window = 4, 3
    builder = PromptBuilder(factory, AgentConfig(policy="terminal-slot", window=window), SCREEN)
    ex = builder.step(episode.task.instruction, episode.past(step), episode.pngs[step],
                      episode.demo[step].action)
    built = build_example(engine, ex.pieces)
    history = recorded(engine, episode, "terminal-slot", window).histories[step]
    runtime = history_rows(history, episode.image_ids)
    n_prompt = built.n_rows - len(ex.target.tokens)
    text_rows = [r for r in runtime if r.kind is RunKind.TEXT]
    is_text = built.embed_index[:n_prompt] < 0
    assert [int(t) for t in built.tokens[:n_prompt][is_text]] == [r.content for r in text_rows]
    assert [int(p) for p in built.positions[:n_prompt][is_text][:, 0]] == [r.pos for r in text_rows]
    assert int((~is_text).sum()) == sum(r.n_rows for r in runtime if r.kind is RunKind.EMBEDDINGS)
    assert built.n_train_tokens == len(ex.target.tokens)
    assert int(built.loss_mask[n_prompt - 1]) == 1  # the prompt's last row predicts the answer
    assert built.positions[n_prompt - 1, 0] + 1 == built.positions[n_prompt, 0]
