"""Randomized task instances: ``sample_task(kind, seed)`` and the registry of kinds.

An instance is a ``Task`` named ``"<kind>@<seed>"``, self-contained (``SimDesk(config,
tasks={t.name: t})`` runs it) and deterministic: the same kind and seed give the same
instruction at every screen size and, per screen size, the same starting state, hence
byte-identical screenshots and the same expert solution.  What it draws: see ``drafts``
(kinds), ``placement`` (positions, sizes, dialogs), ``themes`` (colours), ``words`` (texts);
which seeds train and which evaluate: ``seeds``.

The instruction and goal come from an rng seeded by (kind, seed) alone; the layout from a
second rng, drawn when ``setup`` meets the screen (cells of ``placement.unit_for``), so one
seed usually looks the same, scaled, at 640x360 and 1280x720 (not always: a taskbar label
that fits at one size may not at the other, and switch-window accepts its covering windows
by pixel tests; determinism per screen size holds always).
"""

from __future__ import annotations

import random

import attrs
import structlog

from vmenv.simdesk.classic_style import place_classic_style
from vmenv.simdesk.drafts import CLASSIC, DENSE, KINDS, LOOK_BACK, OPT_IN, Draft
from vmenv.simdesk.placement import PlacementError, place_scene
from vmenv.simdesk.seeds import MAX_SEED, seed_split
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, check_goal, expert_rollout
from vmenv.simdesk.words import EVAL_ONLY_WORDS, TRAIN_WORDS

log = structlog.get_logger(__name__)

#: Layout draws per instance before giving up (no seed tested needs more than a few).
MAX_PLACEMENT_ATTEMPTS = 50
SEPARATOR = "@"


#: Names ``resolve_kinds`` takes for several kinds at once.
SELECTORS: dict[str, tuple[str, ...]] = {"look-back": LOOK_BACK, "dense": DENSE,
                                         "classic": CLASSIC}


def task_kinds() -> tuple[str, ...]:
    """The default mix, in a fixed order: every kind but the opt-in ones (``drafts.OPT_IN``)
    — what training sets and episodes without a ``--task`` draw from."""
    return tuple(k for k in KINDS if k not in OPT_IN)


def all_kinds() -> tuple[str, ...]:
    """Every kind ``sample_task`` knows, in a fixed order (the default mix first)."""
    return tuple(KINDS)


def resolve_kinds(text: str) -> tuple[str, ...]:
    """The kinds ``text`` names: kind names and selectors (``SELECTORS``: ``look-back``,
    ``dense``, ``classic``) separated by commas, in order, a selector expanded in place
    (ValueError for anything else).  The one reading of ``--task``'s kinds."""
    out: list[str] = []
    for name in text.split(","):
        if name in KINDS:
            out.append(name)
        elif name in SELECTORS:
            out += SELECTORS[name]
        else:
            sel = "; ".join(f"{k} ({', '.join(v)})" for k, v in SELECTORS.items())
            raise ValueError(f"unknown task kind {name!r}; known: {', '.join(KINDS)}, or a "
                             f"selector: {sel}")
    return tuple(out)


def sampled_name(kind: str, seed: int) -> str:
    return f"{kind}{SEPARATOR}{seed}"


def parse_sampled_name(name: str) -> tuple[str, int] | None:
    """``("menu-launch", 17)`` for ``"menu-launch@17"``; None if ``name`` is not of that form
    (an unknown kind, a seed that is not a plain decimal in ``seeds``' range)."""
    kind, sep, seed = name.rpartition(SEPARATOR)
    if (not sep or kind not in KINDS or not seed.isascii() or not seed.isdigit()
            or len(seed) > len(str(MAX_SEED)) or int(seed) > MAX_SEED):
        return None
    return kind, int(seed)


def _setup(kind: str, seed: int, draft: Draft, empty: DeskState) -> DeskState:
    rng = random.Random(f"simdesk-layout:{kind}:{seed}")
    w, h = empty.metrics.width, empty.metrics.height
    place = place_classic_style if draft.scene.classic else place_scene
    for attempt in range(MAX_PLACEMENT_ATTEMPTS):
        try:
            placed = place(rng, w, h, draft.scene)
            d = placed.layout.desktop
            pointer = (rng.randrange(d.width), rng.randrange(d.height))
            state = attrs.evolve(empty, layout=placed.layout, windows=placed.windows,
                                 pointer=pointer)
            state = draft.finish(rng, state)
        except PlacementError as exc:
            log.debug("simdesk_placement_retry", kind=kind, seed=seed, attempt=attempt,
                      reason=str(exc))
            continue
        state.check_integrity()
        return state
    raise RuntimeError(f"{kind}@{seed}: no layout after {MAX_PLACEMENT_ATTEMPTS} draws")


def sample_task(kind: str, seed: int) -> Task:
    """The instance of ``kind`` for ``seed`` (raises ``ValueError`` for an unknown kind or a
    seed outside ``seeds``' range)."""
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; known: {', '.join(KINDS)}")
    split = seed_split(seed)
    pool = TRAIN_WORDS if split == "train" else (*TRAIN_WORDS, *EVAL_ONLY_WORDS)
    draft = KINDS[kind](random.Random(f"simdesk-task:{kind}:{seed}"), pool)
    goal = draft.goal
    return Task(name=sampled_name(kind, seed), instruction=draft.instruction,
                setup=lambda empty: _setup(kind, seed, draft, empty),
                check=check_goal(goal), solve=lambda s: expert_rollout(goal, s),
                goal=goal, kind=kind, seed=seed)
