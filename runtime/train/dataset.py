"""The training set: expert demonstrations on randomized simdesk instances, laid out as
every shipped policy lays out its prompts, written as shards (``runtime.train.shards``).

Deterministic from ``DatasetConfig.seed``: episode ``e`` draws its instance, perturbation
and layouts from its own rng (``kvagent-dataset:<seed>:<e>``), so a shard regenerates
identically on its own and a killed run resumes at the first missing shard.

Per episode ``e``:

* the instance: kind ``kinds[e mod n]``, a seed from ``train_seeds()`` (never an
  evaluation seed) starting at a random point of the seed range;
* the rollout: ``demonstration`` at ``screen`` (byte-for-byte the env's screenshots; the
  expert clicks cell centres, ``click_grid``), with recovery states in two ways, once per
  episode at a random step:

  - ``perturbed`` (a fraction of episodes): the desktop is knocked off-track before the step
    (``perturb_at``).  A perturbation changes the state, it is not an action: the step shows
    a screen the previous action did not cause (``DemoStep.perturbed``) and is labelled with
    the expert's first recovery action — a target like every other step;
  - ``slipped`` (another fraction): the agent's action at the step is a mistake
    (``slip_at``, ``vmenv.simdesk.slips``), executed and entered in the history like any
    action the agent took — and never a target (``DemoStep.slip``): no example is made of
    that step, the steps after it teach the recovery with the mistake in the history;
* per step, ``variants`` examples, alternating the terminal layout (``terminal-scratch``,
  which ``terminal-slot`` equals) and the interleaved one (``evict``; ``noevict`` — every
  screenshot — a ``noevict_share`` of those), each with K drawn from ``windows``, a terminal
  one with the first screenshot pinned with ``pin_share`` (off by default); prompts
  that come out identical are kept once, and prompts that cannot answer their target are
  left out (``answerable``: remember-code's code typed after its screenshot left the
  window; counted in the manifest).

Each screenshot is encoded once by the engine's (frozen) vision encoder and stored once per
shard with its embedding.  The manifest (``manifest.json``) records the config, the model
files' identities, counts per kind / layout / K, rows per example by K, target tokens, speed
and sizes; it is rewritten after every shard.

Its command line: ``dataset_cli``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from cachepolicy.engine import Engine
from cachepolicy.pieces import digests
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.train.agents import AGENT_SCREEN
from runtime.train.cell_features import CELL
from runtime.train.cell_labels import (MARKED, MENU_ENTRIES, MenuEntries, query_class,
                                      sub_cell_grid)
from runtime.train.dataset_stats import shard_stats, summarize
from runtime.train.prompts import ImagePiece, PastStep, PromptBuilder, StepExample, TextPiece
from runtime.train.shards import PieceKind, Projector, Shard, ShardWriter
from vmenv.actions import Action, Click, TypeText
from vmenv.simdesk import (
    DemoStep, demonstration, is_eval_seed, sample_task, task_kinds, train_seeds,
)
from vmenv.simdesk.demos import DemonstrationError
from vmenv.simdesk.goals import Goal
from vmenv.simdesk.render import render_png
from vmenv.simdesk.seeds import MAX_SEED
from vmenv.trajectory_writer import write_durably

if TYPE_CHECKING:
    from runtime.engine_setup import ModelFiles

log = structlog.get_logger("kvagent.train.dataset")

FORMAT = "kvagent-train-data/1"
MANIFEST = "manifest.json"
TERMINAL, INTERLEAVED, EVERY = "terminal-scratch", "evict", "noevict"
LAYOUTS = (TERMINAL, INTERLEAVED, EVERY)


@attrs.frozen
class DatasetConfig:
    """What to generate.  Everything that changes the data is here (and in the manifest)."""

    seed: int = 0
    episodes: int = attrs.field(default=512, validator=attrs.validators.ge(1))
    screen: tuple[int, int] = AGENT_SCREEN  # kvagent run's default
    kinds: tuple[str, ...] = attrs.field(factory=task_kinds, converter=tuple)
    perturbed: float = attrs.field(default=0.3, validator=[attrs.validators.ge(0.0),
                                                            attrs.validators.le(1.0)])
    slipped: float = attrs.field(default=0.3, validator=[attrs.validators.ge(0.0),
                                                          attrs.validators.le(1.0)])
    #: a slipped episode's mistakes are, with this chance, its task's text typed early (where
    #: the expert clicks: before the app or field is ready), the trained agents' commonest
    #: error; and it makes 1..``max_slip_run`` mistakes in a row (an agent repeating one).
    #: At 0.0 and 1 nothing extra is drawn: the data are those of the shipped recipe.
    early_typing: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0),
                                                               attrs.validators.le(1.0)])
    max_slip_run: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    windows: tuple[int, ...] = attrs.field(default=(1, 2, 3, 4, 5), converter=tuple)
    variants: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    noevict_share: float = 0.2
    #: the share of the terminal variants with K >= 2 laid out with the episode's first
    #: screenshot pinned (``AgentConfig.pinned`` 1, as ``--pin-first 1`` lays it out): what
    #: a look-back kind needs to learn the screen it must remember.  At 0.0 nothing extra is
    #: drawn: the data are those of the shipped recipe.
    pin_share: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0),
                                                            attrs.validators.le(1.0)])
    #: a step whose target needs the first screenshot (``answerable``: marked-launch's last
    #: click, remember-code's typing) is laid out, in place of each drawn layout that dropped
    #: that screenshot, as the pinned terminal layout of the same K (at least 2) — kept where
    #: it would be skipped: the look-back step's examples, a few dozen with ``pin_share``
    #: alone, too few to learn it from.  Off: the data are those of the shipped recipe.
    pin_look_back: bool = False
    with_done: bool = False  # also label the solved state done() (simdesk ends without it)
    #: how a click on an app's menu entry names its class (``cell_labels.MenuEntries``): as
    #: the recogniser the data are read with classes it ("menu": the shipped recipe)
    menu_entries: MenuEntries = attrs.field(default="menu",
                                            validator=attrs.validators.in_(MENU_ENTRIES))
    #: the expert types a submitting text without its "\n" and presses Enter as a step of
    #: its own (``demos.demonstration``'s ``enter_key``; on in the shipped recipe)
    enter_key: bool = False
    #: a slipped typing step may type a wrong word (``slips.wrong_action``); off: its mistake
    #: is a click elsewhere, and no demonstration presses backspace after typing (off in the
    #: shipped recipe).  Invariant, as for every option here: the default is what the data
    #: were before the option existed, so a manifest written then reads as it was made
    #: (``RecipeConfig`` holds the shipped recipe's values)
    word_slips: bool = True
    #: the expert's clicks go to the sub-cell grid's points (``cell_labels.sub_cell_grid``:
    #: 8 px off a cell's centre where the centre reaches no target), as agents with the
    #: sub-cell pieces click; off: to cell centres
    sub_cell: bool = False
    profile: str = "kvagent"
    shard_episodes: int = attrs.field(default=64, validator=attrs.validators.ge(1))

    def __attrs_post_init__(self) -> None:
        if self.perturbed + self.slipped > 1.0:
            raise ValueError("perturbed + slipped is a share of the episodes: at most 1")

    @property
    def n_shards(self) -> int:
        return -(-self.episodes // self.shard_episodes)

    def shard_range(self, k: int) -> range:
        return range(k * self.shard_episodes, min(self.episodes, (k + 1) * self.shard_episodes))


CLEAN, PERTURBED, SLIPPED = 0, 1, 2  # how an episode went off-track (``Episode.mode``)
MODES = ("clean", "perturbed", "slipped")


@attrs.frozen
class Episode:
    """One rollout: the instance, its labelled steps, and where (``off_at``) and how
    (``mode``) it went off-track."""

    index: int
    kind: str
    seed: int
    instruction: str
    steps: tuple[DemoStep, ...]
    mode: int = CLEAN
    off_at: int | None = None
    code: bool = False  # the text to type is a code shown on the first screen only
    goal: Goal | None = None  # what the checker asks (marked-launch: the app to open last)


def episode_rng(config: DatasetConfig, e: int, what: str = "rollout") -> random.Random:
    """Episode ``e``'s own random stream for ``what`` (its rollout, its layouts)."""
    return random.Random(f"kvagent-dataset:{what}:{config.seed}:{e}")


def rollout(config: DatasetConfig, e: int) -> Episode:
    """Episode ``e``'s instance and expert rollout (deterministic; raises
    ``DemonstrationError`` if the expert fails, which the tests say it does not)."""
    rng = episode_rng(config, e)
    kind = config.kinds[e % len(config.kinds)]
    seed = next(train_seeds(rng.randrange(MAX_SEED // 2)))
    assert not is_eval_seed(seed), seed  # train_seeds' promise, kept here too
    task = sample_task(kind, seed)
    w, h = config.screen
    draw = rng.random()
    mode = (PERTURBED if draw < config.perturbed
            else SLIPPED if draw < config.perturbed + config.slipped else CLEAN)
    at = (rng.randrange(len(demonstration(task, w, h, enter_key=config.enter_key)))
          if mode != CLEAN else None)
    early, run = None, 1
    if mode == SLIPPED and (config.early_typing > 0 or config.max_slip_run > 1):
        text = task.goal.text if task.goal is not None else None
        early = text if text and rng.random() < config.early_typing else None
        run = rng.randint(1, config.max_slip_run)
    steps = demonstration(task, w, h, rng=rng, with_done=config.with_done,
                          perturb_at=at if mode == PERTURBED else None,
                          slip_at=at if mode == SLIPPED else None, slip_run=run,
                          early_text=early,
                          click_grid=(sub_cell_grid(config.menu_entries) if config.sub_cell
                                      else CELL), enter_key=config.enter_key,
                          word_slips=config.word_slips)
    return Episode(e, kind, seed, task.instruction, steps, mode, at,
                   code=task.goal is not None and task.goal.code, goal=task.goal)


class Generator:
    """Examples of episodes for one engine (its tokenizer and frozen vision encoder)."""

    def __init__(self, engine: Engine, config: DatasetConfig) -> None:
        self.engine, self.config = engine, config
        self.factory = SegmentFactory(engine)
        agent = AgentConfig(profile=config.profile)

        def builder(policy: str, window: int, pinned: int = 0) -> PromptBuilder:
            return PromptBuilder(self.factory, attrs.evolve(agent, policy=policy,
                                                            window=max(window, 1),
                                                            pinned=pinned),
                                 config.screen)

        #: (policy, K, pinned) → its builder; noevict's K is 0 (it shows every screenshot);
        #: the terminal layout pins (the interleaved one cannot), where K leaves room
        self.builders = {(p, k, 0): builder(p, k) for p in (TERMINAL, INTERLEAVED)
                         for k in config.windows}
        self.builders[(EVERY, 0, 0)] = builder(EVERY, 0)
        if config.pin_share > 0 or config.pin_look_back:
            self.builders.update({(TERMINAL, k, 1): builder(TERMINAL, k, 1)
                                  for k in {*config.windows, 2} if k >= 2})

    @property
    def eog(self) -> tuple[int, ...]:
        return self.builders[(EVERY, 0, 0)].eog

    def layouts(self, rng: random.Random) -> list[tuple[str, int, int]]:
        """The (policy, K, pinned) of one step's variants: terminal and interleaved in turn;
        a terminal one pinned with ``pin_share`` (drawn only when that share is not 0)."""
        out = []
        for v in range(self.config.variants):
            k = rng.choice(self.config.windows)
            if v % 2 == 0:
                pin = (self.config.pin_share > 0 and k >= 2
                       and rng.random() < self.config.pin_share)
                out.append((TERMINAL, k, int(pin)))
            else:
                out.append((EVERY, 0, 0) if rng.random() < self.config.noevict_share
                           else (INTERLEAVED, k, 0))
        return out

    def add_episode(self, ep: Episode, shard: ShardWriter) -> tuple[int, int]:
        """Write ``ep``'s examples into ``shard``; returns how many, and how many were left
        out as unanswerable (``answerable``)."""
        c, rng = self.config, episode_rng(self.config, ep.index, "layouts")
        pngs = [render_png(s.state) for s in ep.steps]
        # the logs' screenshot segments run the encoder, once per screenshot
        logs = self.builders[(EVERY, 0, 0)].logs(
            ep.instruction, [PastStep(p, s.action) for p, s in zip(pngs, ep.steps)])
        encoded = {png: self.engine.encode_image(png, image_id=log.screenshots[-1].image_id)
                   for png, log in zip(pngs, logs)}
        n = skipped = 0
        for i, (log_i, step) in enumerate(zip(logs, ep.steps)):
            if step.slip:  # the agent's mistake: in the later steps' history, never a target
                continue
            # the class the click's lookup must name (``marked``: found on screenshot 0)
            clicked = (query_class(ep.goal, step.state, step.action.x, step.action.y,
                                   c.menu_entries)
                       if isinstance(step.action, Click) else "")
            seen: set[bytes] = set()
            for policy, k, pinned in self.layouts(rng):
                ex = self.builders[(policy, k, pinned)].example(log_i, step.action)
                if c.pin_look_back and not answerable(ep, ex, step.action, clicked):
                    policy, k, pinned = TERMINAL, max(k, 2), 1
                    ex = self.builders[(policy, k, pinned)].example(log_i, step.action)
                key = digests(ex.layout)[-1]
                if key in seen:  # another K that shows the same (e.g. at step 0)
                    continue
                seen.add(key)
                if not answerable(ep, ex, step.action, clicked):
                    skipped += 1
                    continue
                pieces: list[tuple[PieceKind, Any]] = []
                rows = 0
                for p in ex.pieces:
                    if isinstance(p, ImagePiece):
                        enc = encoded[p.png]
                        pieces.append((PieceKind.IMAGE, shard.add_image(p.png, enc)))
                        rows += len(enc.prefix_tokens) + enc.n_tokens + len(enc.suffix_tokens)
                    else:
                        assert isinstance(p, TextPiece)
                        pieces.append((PieceKind.TARGET if p.train else PieceKind.TEXT,
                                       p.tokens))
                        rows += len(p.tokens)
                shard.add_example(
                    pieces, episode=ep.index, kind=c.kinds.index(ep.kind), seed=ep.seed,
                    step=i, layout=LAYOUTS.index(policy), window=k,
                    shown=sum(isinstance(p, ImagePiece) for p in ex.pieces), rows=rows,
                    target_tokens=len(ex.target.tokens), mode=ep.mode,
                    recovery=ep.off_at is not None and i >= ep.off_at, clicked=clicked)
                n += 1
        return n, skipped


def answerable(ep: Episode, ex: StepExample, action: Action, clicked: str = "") -> bool:
    """Whether the prompt holds what the target needs.  Two things a screen shows once, on
    the first screenshot only (the history holds actions, never them): remember-code's code
    and the launcher marked-launch marks (``clicked`` is ``MARKED``: the click the mark
    decides).  Typing the code or clicking the marked app is unanswerable once that
    screenshot left the window — training on it would teach the model to guess."""
    needs_first = (ep.code and isinstance(action, TypeText)) or clicked == MARKED
    return not needs_first or any(p.image is not None and p.image.step == 0
                                  for p in ex.layout)


# ---------------------------------------------------------------------------- the run

class DatasetError(ValueError):
    """The output directory holds another dataset (other config or model)."""


def _identity(engine: Engine, files: ModelFiles | None) -> dict[str, Any]:
    # the engine's core loads llama.cpp: imported when a dataset is written, not when read
    from cachepolicy.engine.loading import file_identity

    out: dict[str, Any] = {"kind": engine.kind.value, "n_vocab": engine.n_vocab,
                           "n_embd": engine.n_embd}
    for name in ("model", "mmproj"):
        path = getattr(files, name, None)
        if path is not None:
            out[name] = {"name": Path(path).name, "identity": file_identity(Path(path))}
    return out


def generate(engine: Engine, config: DatasetConfig, out: Path, *,
             files: ModelFiles | None = None,
             overwrite: bool = False,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write ``config``'s shards into ``out`` (kept: shards a previous run with the same
    config and model finished); returns the manifest.  ``DatasetError`` if ``out`` holds
    another dataset and not ``overwrite``."""
    out.mkdir(parents=True, exist_ok=True)
    head = {"format": FORMAT, "config": attrs.asdict(config), "model": _identity(engine, files),
            "layouts": list(LAYOUTS)}
    path = out / MANIFEST
    done: list[dict[str, Any]] = []
    if path.exists() and not overwrite:
        old = json.loads(path.read_text())
        # a setting added after ``old`` was written defaults to what the data were without it
        old["config"] = {**attrs.asdict(DatasetConfig()), **old.get("config", {})}
        if json.loads(json.dumps({k: old.get(k) for k in head})) != json.loads(json.dumps(head)):
            raise DatasetError(f"{out} holds another dataset (config or model differ); "
                               "use another directory or overwrite")
        done = [s for s in old["shards"] if (out / s["file"]).is_file()
                and (out / s["file"]).stat().st_size == s["bytes"]]
    gen = Generator(engine, config)
    manifest: dict[str, Any] = {}
    for k in range(config.n_shards):
        if any(s["index"] == k for s in done):
            continue
        t0 = time.perf_counter()
        writer = ShardWriter()
        eps = config.shard_range(k)
        unanswerable = 0
        for e in eps:
            unanswerable += gen.add_episode(rollout(config, e), writer)[1]
        assert writer.projector is not None, "every episode shows a screenshot"
        name = f"shard-{k:05d}.npz"
        size = writer.write(out / name)
        seconds = time.perf_counter() - t0
        stats = shard_stats(Shard(out / name, writer.projector), kinds=config.kinds,
                            layouts=LAYOUTS, modes=MODES)
        stats["unanswerable_skipped"] = unanswerable
        done.append({"index": k, "file": name, "episodes": [eps.start, eps.stop],
                     "bytes": size, "seconds": seconds, "stats": stats})
        done.sort(key=lambda s: s["index"])
        p = writer.projector
        manifest = {**head, "projector": {"prefix_tokens": list(p.prefix_tokens),
                                          "suffix_tokens": list(p.suffix_tokens),
                                          "n_embd": p.n_embd, "non_causal": p.non_causal},
                    "eog": list(gen.eog),
                    "shards": done, "totals": summarize(done)}
        write_durably(path, json.dumps(manifest, indent=1).encode())
        log.info("dataset_shard_written", shard=k, examples=stats["examples"],
                 seconds=round(seconds, 2))
        if progress is not None:
            t = manifest["totals"]
            left = config.n_shards - len(done)
            rate = t["examples_per_s"] or 0.0
            eta = left * t["seconds"] / len(done)
            progress(f"shard {len(done)}/{config.n_shards}: {stats['examples']} examples in "
                     f"{seconds:.1f} s; {t['examples']} in all, {rate:.1f} examples/s, "
                     f"about {eta:.0f} s left")
    if not manifest:
        manifest = json.loads(path.read_text())
    return manifest


def load_manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / MANIFEST).read_text())


def shards(out: Path) -> Iterator[Shard]:
    """The dataset's shards, in order."""
    m = load_manifest(out)
    p = m["projector"]
    projector = Projector(tuple(p["prefix_tokens"]), tuple(p["suffix_tokens"]), p["n_embd"],
                          p["non_causal"])
    for s in m["shards"]:
        yield Shard(out / s["file"], projector)
