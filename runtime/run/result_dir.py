"""A run's result directory across reruns: resume, refuse to mix, or start fresh.

Like OSWorld's runner, a rerun into a result directory continues the run: an episode whose
directory has a ``result.txt`` is finished and skipped; any other episode (never started,
cut off by a kill, or ended in an error — those leave no ``result.txt``) is restarted from a
clean directory.  What makes two runs "the same run" is recorded in a manifest
(``kvagent_run.json`` in the domain directory, next to the episode directories): the model
and projector files, the env, the agent's configuration, the step limit and the screen.  A
rerun with another manifest — or into a directory holding results without one — is refused
(nothing is deleted) unless ``overwrite``, which removes the domain directory first.

Two phases, so a refusal costs nothing: ``plan_resume`` only reads (call it before the model
loads), ``ResumePlan.apply`` writes (after the model has loaded).  ``check_writable`` finds an
unwritable ``--result-dir`` up front without creating anything.
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

from runtime.run.recording import METRICS_FILE, RESULT_FILE, RecordingError, ResultLayout
from vmenv.trajectory_writer import TRAJ_FILE, write_durably

MANIFEST_FILE = "kvagent_run.json"
MANIFEST_VERSION = 1

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
    """A manifest from what identifies the run (JSON-normalized, so it compares equal to
    what was written and read back)."""
    return json.loads(json.dumps({"kvagent_manifest": MANIFEST_VERSION, **fields},
                                 sort_keys=True, default=str))


def _has_results(directory: Path) -> bool:
    return any((directory / name).exists() for name in (TRAJ_FILE, METRICS_FILE, RESULT_FILE))


@attrs.frozen
class ResumePlan:
    """What a run does in its result directory: which task ids it runs (new or restarted)
    and which it keeps (finished)."""

    layout: ResultLayout
    manifest: dict[str, Any]
    run: tuple[str, ...]
    finished: tuple[str, ...]
    restarted: tuple[str, ...]  # in ``run``: partial results of an earlier run, cleared
    overwrite: bool = False  # remove the domain directory before running

    @property
    def resuming(self) -> bool:
        return bool(self.finished or self.restarted)

    def describe(self) -> str:
        if self.overwrite:
            return f"--overwrite: starting fresh in {self.layout.domain_dir}"
        if not self.resuming:
            return f"results: {self.layout.domain_dir}"
        return (f"resuming the run in {self.layout.domain_dir}: {len(self.finished)} finished "
                f"episode(s) kept, {len(self.run)} to run ({len(self.restarted)} restarted "
                f"from scratch)")

    def apply(self) -> None:
        """Write the manifest (after removing the old results when overwriting).  Blocking.
        The episode directories of ``restarted`` are cleared when their recorder opens."""
        domain = self.layout.domain_dir
        if self.overwrite and domain.exists():
            root = self.layout.result_dir.resolve()
            if domain.is_symlink() or not domain.resolve().is_relative_to(root):
                raise ResultDirError(f"refusing to remove {domain}: it leads outside {root}")
            shutil.rmtree(domain)
            log.info("result_dir_overwritten", path=str(domain))
        domain.mkdir(parents=True, exist_ok=True)
        path = domain / MANIFEST_FILE
        if not path.exists() or self.overwrite:
            write_durably(path, (json.dumps(self.manifest, indent=1, sort_keys=True)
                                 + "\n").encode())


def read_manifest(domain: Path) -> dict[str, Any] | None:
    """The manifest in ``domain`` (None if there is none); ResultDirError if unreadable."""
    path = domain / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultDirError(f"{path} is unreadable ({exc}); pass --overwrite to start "
                             f"fresh") from exc
    if not isinstance(found, dict):
        raise ResultDirError(f"{path} is not a kvagent run manifest; pass --overwrite")
    return found


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def plan_resume(layout: ResultLayout, run_manifest: dict[str, Any], task_ids: Sequence[str],
                *, overwrite: bool = False) -> ResumePlan:
    """Decide, reading only, what this run does in ``layout`` (see the module docstring);
    raises ``ResultDirError`` to refuse."""
    domain = layout.domain_dir
    dirs = {t: layout.task_dir(t) for t in task_ids}
    if overwrite:
        return ResumePlan(layout, run_manifest, tuple(task_ids), (), (), overwrite=True)
    found = read_manifest(domain) if domain.is_dir() else None
    if found is None:
        others = sorted(d.name for d in domain.iterdir() if d.is_dir() and _has_results(d)) \
            if domain.is_dir() else []
        if others:
            raise ResultDirError(
                f"{domain} holds results of another run ({', '.join(others[:3])}"
                f"{', ...' if len(others) > 3 else ''}) without a kvagent manifest; use "
                f"another --result-dir, or --overwrite to delete them")
        return ResumePlan(layout, run_manifest, tuple(task_ids), (), ())
    if found != run_manifest:
        diff = _differences(found, run_manifest)
        raise ResultDirError(
            f"{domain} holds a run with another configuration (differs in: "
            f"{', '.join(diff)}); mixing two runs in one folder is refused: use another "
            f"--result-dir, the same options to resume, or --overwrite to start fresh")
    finished = tuple(t for t in task_ids if (dirs[t] / RESULT_FILE).is_file())
    run = tuple(t for t in task_ids if t not in finished)
    restarted = tuple(t for t in run if dirs[t].is_dir() and any(dirs[t].iterdir()))
    return ResumePlan(layout, run_manifest, run, finished, restarted)
