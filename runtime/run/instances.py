"""Which simdesk task each episode runs: sampled instances (``KIND@SEED``) or the classic
fixed tasks.  Shared by ``kvagent run --env simdesk`` and ``kvagent bench-eval``.

Episode i of n runs kind ``kinds[i mod len(kinds)]`` with the i-th seed of a seed choice:

* ``eval`` — the held-out evaluation seeds (``vmenv.simdesk.eval_seeds``: 1, 9, 24, …),
  which no training set draws from (the default: a demo shows tasks a trained model never
  saw);
* ``train`` — the first training seeds;
* ``A-B`` — the seeds A..B in order (cycled when there are more episodes than seeds; ``A``
  alone is ``A-A``), whichever split they belong to;
* ``classic`` — no seeds: the four fixed tasks of ``default_tasks()`` (one layout each).

A task given as ``KIND@SEED`` runs that instance in every episode; ``KIND,KIND,...`` replaces
the default mix of eight kinds (``task_kinds``; e.g. all but remember-code, which no agent
with a window of K < its steps can solve: its code is on the first screenshot only).  A kind
may be a selector, read by ``vmenv.simdesk.resolve_kinds``: ``look-back`` is remember-code
and marked-launch (the kinds whose need a K = 3 window has lost; marked-launch is outside the
default mix, so episodes without ``--task`` never run it).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from vmenv.simdesk import (
    default_tasks, eval_seeds, resolve_kinds, sampled_name, task_kinds, train_seeds,
)
from vmenv.simdesk.kinds import parse_sampled_name
from vmenv.simdesk.seeds import MAX_SEED

EVAL, TRAIN, CLASSIC = "eval", "train", "classic"


@attrs.frozen
class SeedChoice:
    """Seeds to draw episodes' instances from (``parse_seeds``)."""

    name: str  # eval | train | classic | a range "A-B"
    low: int = 0
    high: int = 0

    @property
    def classic(self) -> bool:
        return self.name == CLASSIC

    def take(self, n: int) -> tuple[int, ...]:
        """The first ``n`` seeds (a range is cycled); ``()`` for ``classic``."""
        if self.name == EVAL:
            return eval_seeds(n)
        if self.name == TRAIN:
            return tuple(itertools.islice(train_seeds(), n))
        if self.classic:
            return ()
        span = self.high - self.low + 1
        return tuple(self.low + i % span for i in range(n))


def parse_seeds(text: str) -> SeedChoice:
    """``eval`` | ``train`` | ``classic`` | ``A-B`` | ``A`` (ValueError naming ``--seeds``)."""
    text = text.strip()
    if text in (EVAL, TRAIN, CLASSIC):
        return SeedChoice(text)
    low, sep, high = text.partition("-")
    try:
        a, b = int(low), int(high if sep else low)
    except ValueError:
        raise ValueError(f"--seeds {text!r}: expected eval, train, classic, A-B or A") from None
    if not 0 <= a <= b <= MAX_SEED:
        raise ValueError(f"--seeds {text!r}: a range A-B with 0 <= A <= B <= {MAX_SEED}")
    return SeedChoice(f"{a}-{b}", a, b)


def check_task(name: str) -> str:
    """``name`` if it names a kind, several kinds (``KIND,KIND``: episodes take them in
    turn; a selector such as ``look-back`` names several) or an instance (``KIND@SEED``);
    ValueError otherwise (classic names are kinds too: ``--seeds classic`` picks their fixed
    layout)."""
    if parse_sampled_name(name) is not None:
        return name
    try:
        resolve_kinds(name)
    except ValueError as exc:
        raise ValueError(f"unknown task {name!r}: {exc}; kinds separated by commas, or an "
                         f"instance KIND@SEED") from None
    return name


def episode_tasks(episodes: int, seeds: SeedChoice | None = None,
                  task: str | None = None) -> tuple[str, ...]:
    """The task name of each of ``episodes`` episodes (see the module docstring; ``seeds``
    None: ``eval``); ValueError for a combination that names nothing (a kind without a
    fixed layout with ``classic``, a ``KIND@SEED`` task with a seed choice)."""
    if task is not None and parse_sampled_name(task) is not None:
        if seeds is not None:
            raise ValueError(f"--task {task} names its seed: no --seeds with it")
        return (task,) * episodes
    seeds = seeds or SeedChoice(EVAL)
    if seeds.classic:
        classic = tuple(default_tasks())
        if task is not None and task not in classic:
            raise ValueError(f"--seeds classic: {task!r} has no fixed layout; classic tasks: "
                             f"{', '.join(classic)}")
        names: Sequence[str] = (task,) if task is not None else classic
        return tuple(names[i % len(names)] for i in range(episodes))
    kinds = resolve_kinds(task) if task is not None else task_kinds()
    return tuple(sampled_name(kinds[i % len(kinds)], s)
                 for i, s in enumerate(seeds.take(episodes)))


def kind_of(name: str) -> str:
    """A task name's kind (a classic task's name is its kind)."""
    parsed = parse_sampled_name(name)
    return parsed[0] if parsed is not None else name

