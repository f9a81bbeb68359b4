"""The one writer of ``traj.jsonl`` (OSWorld's per-step trajectory file) and its screenshots.

Used by kvagent's result recorder (``runtime.run.recording``), by ``record_trajectory`` (replay
files) and by the OSWorld runner example.  Durability: a step's PNG is written atomically
(``write_durably``: a temporary file, fsync'd, renamed, the directory fsync'd) before the
line naming it; every line is flushed and fsync'd before the call returns — a crash loses at
most the step being written.  Blocking:
call it from a worker thread inside an event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Self

TRAJ_FILE = "traj.jsonl"


def fsync_dir(path: Path) -> None:
    """Make ``path``'s directory entries (a new or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Temporary files of ``write_durably`` are named ``.{name}.{random}{TMP_SUFFIX}``.
TMP_SUFFIX = ".tmp"
#: Mode of the files written here (what open() gives under the usual umask 022).
FILE_MODE = 0o644


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a reader sees the old file or the whole new
    one (a temporary file in the same directory, fsync'd, renamed over).

    The temporary file is created exclusively under a fresh random name (``mkstemp``:
    O_CREAT | O_EXCL, which never follows a symlink), and the rename replaces a link at
    ``path`` itself rather than its target: a link planted in a shared directory — under
    the temporary name or the final one — never gets another file overwritten.  A failed
    write removes its temporary file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp makes 0600; results are meant to be read
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def open_append(path: Path) -> IO[str]:
    """``path`` opened for appending text, created if missing — never through a symlink
    (O_NOFOLLOW: a link planted under the name is an ``OSError``, not a write elsewhere)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    return os.fdopen(fd, "a", encoding="utf-8")


def is_stale_temporary(path: Path) -> bool:
    """A leftover temporary file of an interrupted ``write_durably``."""
    return path.name.startswith(".") and path.name.endswith(TMP_SUFFIX)


def trajectory_line(step_num: int, *, action: Any, screenshot_file: str, reward: float,
                    done: bool, info: dict[str, Any] | None = None,
                    response: str | None = None, action_timestamp: str | None = None,
                    action_text: str | None = None, instruction: str | None = None) -> str:
    """One traj.jsonl line: OSWorld's fields (``response`` and ``action_timestamp`` as its
    runner writes them) plus kvagent's optional ``action_text`` / ``instruction``."""
    entry: dict[str, Any] = {"step_num": step_num}
    if action_timestamp is not None:
        entry["action_timestamp"] = action_timestamp
    entry["action"] = action
    if response is not None:
        entry["response"] = response
    entry.update(reward=reward, done=done, info=info or {}, screenshot_file=screenshot_file)
    if action_text is not None:
        entry["action_text"] = action_text
    if instruction is not None:
        entry["instruction"] = instruction
    return json.dumps(entry, default=str, ensure_ascii=False) + "\n"


class TrajectoryWriter:
    """Appends to ``directory/traj.jsonl`` (created if missing); see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._file: IO[str] | None = open_append(directory / TRAJ_FILE)  # closed by close()
        fsync_dir(directory)

    @property
    def closed(self) -> bool:
        return self._file is None

    def write_line(self, line: str) -> None:
        if self._file is None:
            raise ValueError(f"the trajectory writer of {self.directory} is closed")
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())

    def write_step(self, step_num: int, *, screenshot: bytes, screenshot_file: str,
                   **fields: Any) -> str:
        """The screen after the step's action, then its line (``fields``: see
        ``trajectory_line``).  Returns the screenshot's file name.  The PNG is written
        atomically (never a partial or 0-byte file); no bytes at all is a ValueError before
        anything is written."""
        if not isinstance(screenshot, bytes | bytearray) or not screenshot:
            raise ValueError(f"step {step_num}: no screenshot bytes to write")
        # the PNG's entry is durable before a line names it
        write_durably(self.directory / screenshot_file, bytes(screenshot))
        self.write_line(trajectory_line(step_num, screenshot_file=screenshot_file, **fields))
        return screenshot_file

    def write_error(self, message: str) -> None:
        """OSWorld's runner marks a crashed example with an ``{"Error": ...}`` line."""
        self.write_line(json.dumps({"Error": message}, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
