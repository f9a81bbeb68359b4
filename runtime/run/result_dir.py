"""A run's result directory across reruns: resume, refuse to mix, or redo on request.

Like OSWorld's runner, a rerun into a result directory continues the run: an episode whose
directory has a ``result.txt`` — a regular file holding a finite number (``read_result``) —
is finished and skipped; any other episode (never started, cut off by a kill, or ended in an
error — those leave no ``result.txt`` — or whose ``result.txt`` is a link or not a number,
with a warning saying so) is restarted from a clean directory.  What makes an episode's
results "of this run" is recorded per task in a manifest (``kvagent_run.json`` in the domain
directory, next to the episode directories): for each task id, the configuration that
produced it — model and projector files, env, the agent's configuration, the step limit,
the screen.

A rerun whose configuration differs for one of its tasks — or which finds results of its
tasks that no manifest accounts for — is refused (nothing is deleted) unless ``overwrite``,
which redoes exactly the task directories of this invocation and their manifest entries;
every other episode in the domain stays as it is, byte for byte.  A domain holding results
without any kvagent manifest (another tool's run) is refused too, and ``overwrite`` leaves
those results alone as well.  An episode directory that is a symbolic link (to ``.``, to a
sibling, anywhere) is refused with or without ``overwrite``, nothing deleted
(``ResultLayout.task_dir``): the link is neither followed nor removed.

Two phases, so a refusal costs nothing: ``plan_resume`` only reads (call it before the model
loads), ``ResumePlan.apply`` writes (after the model has loaded).  ``check_writable`` finds an
unwritable ``--result-dir`` up front without creating anything.  ``remove_stale_temporaries``
clears the temporary files an interrupted atomic write left behind (end of a run).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog

from runtime.run.recording import (
    METRICS_FILE, RESULT_FILE, RecordingError, ResultLayout, UnsafePathError,
    UnusableResultError, read_result,
)
from vmenv.trajectory_writer import TRAJ_FILE, is_stale_temporary, write_durably

MANIFEST_FILE = "kvagent_run.json"
MANIFEST_VERSION = 2

log = structlog.get_logger("kvagent.result_dir")


class ResultDirError(RecordingError):
    """The result directory cannot take this run (unwritable, or another run's results)."""


def check_writable(result_dir: Path) -> None:
    """Raise ``ResultDirError`` unless ``result_dir`` exists as a writable directory or can be
    created.  Creates nothing: probes the nearest existing ancestor with an anonymous file."""
    path = Path(result_dir).absolute()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ResultDirError(f"result dir {result_dir}: {probe} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ResultDirError(f"result dir {result_dir} is not writable: cannot create files "
                             f"in {probe} ({exc.strerror or exc})") from exc


def manifest(**fields: Any) -> dict[str, Any]:
    """What identifies a run's configuration (JSON-normalized, so it compares equal to what
    was written and read back); the manifest file records it per task."""
    return json.loads(json.dumps(fields, sort_keys=True, default=str))


def _has_results(directory: Path) -> bool:
    return any((directory / name).exists() for name in (TRAJ_FILE, METRICS_FILE, RESULT_FILE))


@attrs.frozen
class ResumePlan:
    """What a run does in its result directory: which task ids it runs (new, restarted or
    redone) and which it keeps (finished), and the manifest entries it records."""

    layout: ResultLayout
    manifest: dict[str, Any]  # this run's configuration
    run: tuple[str, ...]
    finished: tuple[str, ...]
    restarted: tuple[str, ...]  # in ``run``: partial results of an earlier run, cleared
    overwrite: bool = False  # redo this invocation's task directories
    #: the manifest's entries of other tasks, written back unchanged
    others: dict[str, Any] = attrs.Factory(dict)
    #: (task id, why) for the tasks in ``run`` whose ``result.txt`` records no reward
    unusable: tuple[tuple[str, str], ...] = ()

    @property
    def resuming(self) -> bool:
        return bool(self.finished or self.restarted)

    def describe(self) -> str:
        if self.overwrite:
            return (f"--overwrite: redoing {len(self.run)} episode(s) in "
                    f"{self.layout.domain_dir} ({len(self.others)} other episode(s) kept)")
        if not self.resuming:
            return f"results: {self.layout.domain_dir}"
        return (f"resuming the run in {self.layout.domain_dir}: {len(self.finished)} finished "
                f"episode(s) kept, {len(self.run)} to run ({len(self.restarted)} restarted "
                f"from scratch)" + "".join(
                    f"\nwarning: {task}: {why}; the episode counts as unfinished and is rerun"
                    for task, why in self.unusable))

    def apply(self) -> None:
        """Remove this invocation's task directories when overwriting, then record the
        manifest entries of its tasks.  Blocking.  The directories of ``restarted`` are
        cleared when their recorder opens."""
        domain = self.layout.real_domain_dir()  # looked at again: the model loaded since
        if self.overwrite:
            # Looked at again (the model loaded since the plan), every one before the first is
            # removed: a link planted at any of them refuses the whole overwrite, nothing
            # deleted.  task_dir never follows a link, so each path names a real directory of
            # this invocation's episodes; rmtree refuses a link that appears after this check
            # (and never follows links inside the tree).
            directories = [self.layout.task_dir(task) for task in self.run]
            for directory in directories:
                if directory.exists():
                    shutil.rmtree(directory)
                    log.info("result_dir_task_overwritten", path=str(directory))
        domain.mkdir(parents=True, exist_ok=True)
        tasks = {**self.others, **{t: self.manifest for t in (*self.finished, *self.run)}}
        write_durably(domain / MANIFEST_FILE, (json.dumps(
            {"kvagent_manifest": MANIFEST_VERSION, "tasks": tasks}, indent=1,
            sort_keys=True) + "\n").encode())


def read_manifest(domain: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest's entries by task id (None if there is no manifest); ResultDirError if
    unreadable.  A version-1 manifest (one configuration for the whole domain) stands for
    every episode directory present."""
    path = domain / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultDirError(f"{path} is unreadable ({exc}); pass --overwrite to redo this "
                             f"run's episodes") from exc
    if not isinstance(found, dict) or not isinstance(found.get("kvagent_manifest"), int):
        raise ResultDirError(f"{path} is not a kvagent run manifest; pass --overwrite")
    if found["kvagent_manifest"] == 1:
        config = {k: v for k, v in found.items() if k != "kvagent_manifest"}
        return {d.name: config for d in domain.iterdir() if d.is_dir()}
    tasks = found.get("tasks")
    if not isinstance(tasks, dict) or not all(isinstance(v, dict) for v in tasks.values()):
        raise ResultDirError(f"{path} is not a kvagent run manifest; pass --overwrite")
    return tasks


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ, nested ones by their path (``agent.pinned``)."""
    out: list[str] = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += [f"{k}.{sub}" for sub in _differences(a, b)]
        else:
            out.append(k)
    return out


def plan_resume(layout: ResultLayout, run_manifest: dict[str, Any], task_ids: Sequence[str],
                *, overwrite: bool = False) -> ResumePlan:
    """Decide, reading only, what this run does in ``layout`` (see the module docstring);
    raises ``ResultDirError`` to refuse."""
    domain = layout.real_domain_dir()
    dirs = {t: layout.task_dir(t) for t in task_ids}
    if overwrite:
        entries = _readable_entries(domain)
    else:
        entries = read_manifest(domain) if domain.is_dir() else None
    mine = set(task_ids)
    others = {t: e for t, e in (entries or {}).items() if t not in mine}
    if overwrite:
        return ResumePlan(layout, run_manifest, tuple(task_ids), (), (), overwrite=True,
                          others=others)
    if entries is None:
        foreign = sorted(d.name for d in domain.iterdir() if d.is_dir() and _has_results(d)) \
            if domain.is_dir() else []
        if foreign:
            raise ResultDirError(
                f"{domain} holds results of another run ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}) without a kvagent manifest; use "
                f"another --result-dir, or --overwrite to redo this run's episodes there")
        return ResumePlan(layout, run_manifest, tuple(task_ids), (), ())
    conflicts: list[str] = []
    for t in task_ids:
        entry = entries.get(t)
        if entry is None and dirs[t].is_dir() and _has_results(dirs[t]):
            conflicts.append(f"{t} (results no manifest entry accounts for)")
        elif entry is not None and entry != run_manifest:
            conflicts.append(f"{t} (differs in: {', '.join(_differences(entry, run_manifest))})")
    if conflicts:
        raise ResultDirError(
            f"{domain} holds episodes of a run with another configuration: "
            f"{'; '.join(conflicts[:3])}{'; ...' if len(conflicts) > 3 else ''}; mixing two "
            f"runs in one episode directory is refused: use another --result-dir, the same "
            f"options to resume, or --overwrite to redo these episodes")
    finished: list[str] = []
    unusable: list[tuple[str, str]] = []
    for t in task_ids:
        try:
            if read_result(dirs[t]) is not None:
                finished.append(t)
        except UnusableResultError as exc:
            unusable.append((t, str(exc)))
            log.warning("result_dir_result_unusable", task_id=t, path=str(dirs[t]),
                        reason=str(exc))
    run = tuple(t for t in task_ids if t not in finished)
    restarted = tuple(t for t in run if dirs[t].is_dir() and any(dirs[t].iterdir()))
    return ResumePlan(layout, run_manifest, run, tuple(finished), restarted, others=others,
                      unusable=tuple(unusable))


def _readable_entries(domain: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest's entries for an overwrite: an unreadable manifest is replaced, so it
    counts as none."""
    if not domain.is_dir():
        return None
    try:
        return read_manifest(domain)
    except ResultDirError:
        return None


def remove_stale_temporaries(layout: ResultLayout, task_ids: Sequence[str]) -> int:
    """Remove the temporary files interrupted atomic writes left in the domain directory
    and the episode directories of ``task_ids`` (links removed as links); their count."""
    removed = 0
    directories: list[Path] = []
    for task in (None, *task_ids):  # None: the domain directory
        try:
            directories.append(layout.real_domain_dir() if task is None
                               else layout.task_dir(task))
        except UnsafePathError as exc:  # a link planted during the run: never tidied through
            log.warning("result_dir_tidy_skipped", task_id=task, reason=str(exc))
    for directory in directories:
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if is_stale_temporary(path) and (path.is_symlink() or path.is_file()):
                path.unlink(missing_ok=True)
                removed += 1
    if removed:
        log.info("result_dir_stale_temporaries_removed", count=removed)
    return removed
