"""Episode results in OSWorld's layout, written while the episode runs.

One directory per episode::

    {result_dir}/{action_space}/{observation_type}/{model}/{domain}/{task_id}/
        traj.jsonl      one line per step: step_num, action_timestamp, action (pyautogui code
                        or DONE / FAIL / WAIT — never the raw model text), response (the
                        model's text), reward, done, info, screenshot_file
        step_{n}_{timestamp}.png   the screen after step n's action
        metrics.jsonl   kvagent's per-step measurements (one line per step)
        result.txt      the final reward, written when the episode ends

Durability: every line is flushed and fsync'd before the call returns, and a step's PNG is
on disk before the ``traj.jsonl`` line naming it, so a crash loses at most the step being
written.  Names that would leave ``result_dir`` (absolute, ``..``, separators, NUL) raise
``UnsafePathError`` before anything is created.

No path below ``result_dir`` goes through a link: a symbolic link at any component kvagent
builds (action space, observation type, model, domain, episode directory) is refused with
``UnsafePathError`` naming it, never followed — a link to ``.`` or to a sibling episode would
otherwise make an episode's directory another one's (or the whole domain), and a rerun would
delete or write it.  Refusing (rather than removing the link) is the choice because kvagent
never creates such links: one was put there on purpose, and the user decides what it meant.
``result_dir`` itself may be a link (results on another disk).  An episode is finished only
if its ``result.txt`` is a regular file (opened with ``O_NOFOLLOW``) holding a finite number
(``read_result``).

All methods block (file I/O): call them from a worker thread inside an event loop.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import IO, Any, Self

import attrs
import structlog

from vmenv.trajectory_writer import (
    TRAJ_FILE, TrajectoryWriter, is_stale_temporary, open_append, write_durably,
)

ACTION_SPACE = "pyautogui"
OBSERVATION_TYPE = "screenshot"
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.txt"
#: a reward as written (``f"{reward}\n"``) is at most ~25 bytes; anything longer is not one
MAX_RESULT_BYTES = 64
TIMESTAMP_FORMAT = "%Y%m%d@%H%M%S"  # OSWorld's action_timestamp

log = structlog.get_logger("kvagent.recording")


class RecordingError(Exception):
    """Base class for errors raised while recording results."""


class UnsafePathError(RecordingError, ValueError):
    """A task id, domain or model name would put files outside the result directory, or a
    path below it goes through a symbolic link."""


class UnusableResultError(RecordingError):
    """An episode's ``result.txt`` exists but does not record a reward (a link, not a regular
    file, not a finite number): the episode is not finished."""


def check_component(value: object, what: str) -> str:
    """Return ``value`` if it is usable as one directory name inside the result dir."""
    if not isinstance(value, str):
        raise UnsafePathError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise UnsafePathError(f"{what} must not be empty")
    if value in (".", ".."):
        raise UnsafePathError(f"{what} {value!r} refers to a directory, not a name")
    if any(ord(c) < 32 for c in value):
        raise UnsafePathError(f"{what} {value!r} contains NUL or a control character")
    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if any(s in value for s in seps):
        raise UnsafePathError(f"{what} {value!r} contains a path separator")
    if Path(value).is_absolute():
        raise UnsafePathError(f"{what} {value!r} is an absolute path")
    return value


@attrs.frozen
class ResultLayout:
    """Where a run's episodes go: ``{result_dir}/{action_space}/{observation_type}/{model}/
    {domain}/{task_id}``.  Every component is validated at construction / lookup."""

    result_dir: Path = attrs.field(converter=Path)
    model: str
    domain: str = "simdesk"
    action_space: str = ACTION_SPACE
    observation_type: str = OBSERVATION_TYPE

    def __attrs_post_init__(self) -> None:
        for what in ("action_space", "observation_type", "model", "domain"):
            check_component(getattr(self, what), what)

    @property
    def domain_dir(self) -> Path:
        return (self.result_dir / self.action_space / self.observation_type / self.model
                / self.domain)

    def task_dir(self, task_id: str) -> Path:
        """The episode directory of ``task_id``: the resolved result dir joined with the
        layout's components, none of which is a symbolic link (``UnsafePathError`` naming
        the first that is, or an episode directory that exists as a non-directory).
        Nothing is created.  Checks the disk as it is now: call it again before acting."""
        return self._real_path(check_component(task_id, "task id"))

    def real_domain_dir(self) -> Path:
        """``domain_dir`` reached through no link (``UnsafePathError`` as ``task_dir``)."""
        return self._real_path()

    def _real_path(self, *below_domain: str) -> Path:
        # Only result_dir is resolved (it may be a link, e.g. to another disk); below it,
        # each component is looked at with lstat and never followed, so the path returned
        # names a real directory (or none yet) strictly inside result_dir, whatever links
        # are planted there: a link to '.' or to a sibling would make this episode's
        # directory the domain or another episode, and --overwrite would delete it.
        path = self.result_dir.resolve()
        for part in (self.action_space, self.observation_type, self.model, self.domain,
                     *below_domain):
            path = path / part
            try:
                mode = path.lstat().st_mode
            except FileNotFoundError:
                continue  # the rest does not exist either (or will be created real)
            if stat.S_ISLNK(mode):
                raise UnsafePathError(
                    f"{path} is a symbolic link (to {os.readlink(path)}); kvagent never writes "
                    f"or deletes through a link in its result dir: remove the link, or use "
                    f"another --result-dir")
            if not stat.S_ISDIR(mode):
                raise UnsafePathError(f"{path} exists and is not a directory")
        return path


def read_result(directory: Path) -> float | None:
    """The reward an episode directory's ``result.txt`` records; None if there is none.

    ``UnusableResultError`` (saying why) if the name exists but records no reward: a symbolic
    link (dangling or not: opened with ``O_NOFOLLOW``, never followed), not a regular file
    (a directory, a FIFO: opened non-blocking, so it cannot hang), longer than a reward,
    or not a finite number.  Such an episode is not finished."""
    path = Path(directory) / RESULT_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnusableResultError(f"{RESULT_FILE} is a symbolic link") from exc
        if exc.errno == errno.ENOTDIR:
            return None  # the episode directory is not a directory: no result in it
        raise UnusableResultError(f"{RESULT_FILE} is unreadable "
                                  f"({exc.strerror or exc})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnusableResultError(f"{RESULT_FILE} is not a regular file")
        if st.st_size > MAX_RESULT_BYTES:
            raise UnusableResultError(f"{RESULT_FILE} does not hold a number "
                                      f"({st.st_size} bytes)")
        data = os.read(fd, MAX_RESULT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        reward = float(data.decode("ascii"))  # float() strips surrounding whitespace
    except (UnicodeDecodeError, ValueError):
        raise UnusableResultError(f"{RESULT_FILE} does not hold a number "
                                  f"({data[:24]!r})") from None
    if not math.isfinite(reward):
        raise UnusableResultError(f"{RESULT_FILE} does not hold a finite number ({reward})")
    return reward


class EpisodeRecorder:
    """Writes one episode's directory step by step (see the module docstring): traj.jsonl
    through vmenv's one ``TrajectoryWriter``, plus metrics.jsonl and result.txt."""

    def __init__(self, directory: Path) -> None:
        """Use ``EpisodeRecorder.create``; this opens files in an existing directory."""
        self.directory = directory
        self.steps = 0
        self._traj: TrajectoryWriter | None = TrajectoryWriter(directory)
        # held open for the episode (closed by ``close``): one line per step, fsync'd
        self._metrics: IO[str] | None = open_append(directory / METRICS_FILE)

    @classmethod
    def create(cls, layout: ResultLayout, task_id: str) -> EpisodeRecorder:
        """Validate, create (or reuse) the episode directory and start empty files there.

        A previous run's files in that directory (traj, metrics, result, step PNGs, the
        temporary file of an interrupted atomic write) are removed first, so the directory
        never mixes two runs; ``runtime.run.result_dir`` decides whether a rerun may do that."""
        directory = layout.task_dir(task_id)  # raises before anything is written
        directory.mkdir(parents=True, exist_ok=True)
        # mkdir(exist_ok) accepts a link to a directory: look again now that it exists
        directory = layout.task_dir(task_id)
        for old in directory.iterdir():
            # links too (is_dir would follow one): a link under one of our names is removed
            # as a link, never written through; so is a FIFO or socket planted there
            if (old.is_symlink() or not old.is_dir()) and (
                    old.name in (TRAJ_FILE, METRICS_FILE, RESULT_FILE)
                    or (old.name.startswith("step_") and old.suffix == ".png")
                    or is_stale_temporary(old)):
                old.unlink()
        log.debug("recording_open", path=str(directory))
        return cls(directory)

    @property
    def closed(self) -> bool:
        return self._traj is None

    def _writer(self) -> TrajectoryWriter:
        if self._traj is None:
            raise RecordingError(f"the recorder of {self.directory} is closed")
        return self._traj

    def _metrics_line(self, entry: dict[str, Any]) -> None:
        if self._metrics is None:
            raise RecordingError(f"the recorder of {self.directory} is closed")
        self._metrics.write(json.dumps(entry, default=str, ensure_ascii=False) + "\n")
        self._metrics.flush()
        os.fsync(self._metrics.fileno())

    def record_step(self, *, step_num: int, action: str, response: str, reward: float,
                    done: bool, info: dict[str, Any], screenshot: bytes,
                    metrics: dict[str, Any], timestamp: dt.datetime | None = None) -> str:
        """Write the screen after the action, then its traj line, then its metrics line.

        ``action`` must already be what OSWorld executes (``to_pyautogui``); ``timestamp``
        is when the action started executing (OSWorld takes it just before ``env.step``).
        Returns the screenshot's file name."""
        stamp = (timestamp or dt.datetime.now()).strftime(TIMESTAMP_FORMAT)
        name = self._writer().write_step(
            step_num, screenshot=screenshot, screenshot_file=f"step_{step_num}_{stamp}.png",
            action_timestamp=stamp, action=action, response=response, reward=reward, done=done,
            info=info)
        self._metrics_line({"step_num": step_num, **metrics})
        self.steps += 1
        return name

    def record_metrics(self, metrics: dict[str, Any]) -> None:
        """A metrics line without a traj line (a step that failed before an action)."""
        self._metrics_line(metrics)

    def record_error(self, message: str) -> None:
        """OSWorld's runner marks a crashed example with an ``{"Error": ...}`` traj line."""
        self._writer().write_error(message)

    def finish(self, reward: float) -> Path:
        """Write ``result.txt`` (atomically: a reader sees no result or the whole one)."""
        path = self.directory / RESULT_FILE
        write_durably(path, f"{reward}\n".encode())
        return path

    def close(self) -> None:
        """Close the files (idempotent)."""
        if self._traj is not None:
            self._traj.close()
        if self._metrics is not None:
            self._metrics.close()
        self._traj = self._metrics = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
