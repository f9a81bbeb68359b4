"""Parallel OSWorld over a Ray cluster: the multi-node counterpart of ``run_multienv.py``.

``run_parallel`` starts ``workers`` env workers — Ray actors, placed by Ray wherever a CPU is
free, each owning one environment (a ``DesktopEnv``) and one agent (a client of the
cluster's front door: the model hosts are shared, the VMs are not) — and drains the task
list through them, one task at a time per worker.  Every task lands in OSWorld's result
layout, ``{root}/pyautogui/screenshot/{model}/{domain}/{task_id}/`` (``traj.jsonl``,
screenshots, ``result.txt``), written by the loop the caller passes (OSWorld's own
``lib_run_single.run_single_example``, or a stand-in with its signature).  A task whose
``result.txt`` records a reward (a regular file holding a finite number, as
``kvagent run`` counts it) is skipped, so an interrupted run resumes where it stopped.  A task
that raises is reported and leaves no ``result.txt`` (the next run tries it again).  Paths
built from task ids stay inside the result root and go through no link (``ResultLayout``:
an id such as ``../x`` or an episode directory planted as a link refuses the run up front).

The callables travel to the workers with Ray's pickling: ``make_env()`` and
``make_agent()`` build a worker's environment and agent (``make_agent`` is where a runner
chooses its agent — one line).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import structlog

from runtime.run.recording import ResultLayout, UnusableResultError, read_result

log = structlog.get_logger("kvagent.osworld_run")

RunExample = Callable[..., Any]  # lib_run_single.run_single_example's signature


@attrs.frozen
class OsworldTask:
    domain: str
    example: Mapping[str, Any]

    @property
    def task_id(self) -> str:
        return str(self.example["id"])


@attrs.frozen
class TaskOutcome:
    domain: str
    task_id: str
    score: float | None  # None: the task raised (see ``error``)
    seconds: float
    worker: int
    error: str = ""


def result_dir(root: Path, model: str, domain: str, task_id: str) -> Path:
    """OSWorld's layout (screenshot-only agents, pyautogui actions); ``UnsafePathError`` for
    a name that would leave ``root`` or a path through a link (``ResultLayout.task_dir``)."""
    return ResultLayout(root, model, domain).task_dir(task_id)


def pending(tasks: Iterable[OsworldTask], root: Path, model: str) -> list[OsworldTask]:
    """The tasks whose ``result.txt`` records no reward yet (absent, or a link or not a
    number: rerun, with a warning)."""
    todo = []
    for t in tasks:
        try:
            if read_result(result_dir(root, model, t.domain, t.task_id)) is not None:
                continue
        except UnusableResultError as exc:
            log.warning("osworld_result_unusable", domain=t.domain, task_id=t.task_id,
                        reason=str(exc))
        todo.append(t)
    return todo


class EnvWorker:
    """One environment and one agent, running tasks one after another (a Ray actor)."""

    def __init__(self, index: int, make_env: Callable[[], Any], make_agent: Callable[[], Any],
                 run_example: RunExample, max_steps: int, args: Any) -> None:
        self.index = index
        self.env = make_env()
        self.agent = make_agent()
        self.run_example, self.max_steps, self.args = run_example, max_steps, args

    def run(self, task: OsworldTask, out: str) -> TaskOutcome:
        Path(out).mkdir(parents=True, exist_ok=True)
        scores: list[float] = []
        t0 = time.monotonic()
        try:
            self.run_example(self.agent, self.env, dict(task.example), self.max_steps,
                             task.example["instruction"], self.args, out, scores)
        except Exception as exc:  # noqa: BLE001  one task's failure is reported, not fatal
            (Path(out) / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
            return TaskOutcome(task.domain, task.task_id, None, time.monotonic() - t0,
                               self.index, f"{type(exc).__name__}: {exc}")
        score = scores[-1] if scores else None
        return TaskOutcome(task.domain, task.task_id, score, time.monotonic() - t0, self.index)

    def close(self) -> None:
        try:
            self.agent.close()
        finally:
            self.env.close()


def run_parallel(tasks: Iterable[OsworldTask], *, result_root: Path, model_name: str,
                 workers: int, make_env: Callable[[], Any], make_agent: Callable[[], Any],
                 run_example: RunExample, max_steps: int = 15, args: Any = None,
                 worker_cpus: float = 1.0, task_timeout_s: float = 3600.0,
                 on_outcome: Callable[[TaskOutcome], None] | None = None,
                 ) -> list[TaskOutcome]:
    """Run every pending task on ``workers`` env workers (Ray must be initialised)."""
    import ray
    from ray.util import ActorPool

    todo = pending(tasks, result_root, model_name)
    if not todo:
        return []
    args = args if args is not None else SimpleNamespace(sleep_after_execution=0.0)
    remote = ray.remote(EnvWorker).options(num_cpus=worker_cpus, max_restarts=0)
    actors = [remote.remote(i, make_env, make_agent, run_example, max_steps, args)
              for i in range(min(workers, len(todo)))]
    outcomes: list[TaskOutcome] = []
    try:
        pool = ActorPool(actors)
        for task in todo:
            out = result_dir(result_root, model_name, task.domain, task.task_id)
            pool.submit(lambda a, job: a.run.remote(*job), (task, str(out)))
        while pool.has_next():
            outcome = pool.get_next_unordered(timeout=task_timeout_s)
            log.info("osworld_task_done", domain=outcome.domain, task_id=outcome.task_id,
                     score=outcome.score, seconds=round(outcome.seconds, 2),
                     worker=outcome.worker, error=outcome.error or None)
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)
    finally:
        try:
            ray.get([a.close.remote() for a in actors], timeout=120)
        except Exception as exc:  # noqa: BLE001  the actors are ended below anyway
            log.warning("osworld_worker_close_failed", error=repr(exc)[:300])
        for a in actors:
            ray.kill(a)
    return outcomes
