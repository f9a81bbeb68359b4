"""Recorded trajectories: the in-memory record and the on-disk layout (OSWorld's traj.jsonl).

Directory layout (what OSWorld's runner writes, plus an optional step-0 line)::

    traj.jsonl   one JSON object per line:
                 {"step_num": int, "action": str | null, "screenshot_file": str,
                  "reward"?: number, "done"?: bool, "info"?: object, "action_text"?: str,
                  "instruction"?: str, ...}
    step_0.png   the screen after reset (the line with step_num 0 and action null)
    step_1.png   the screen after the first action, ...

A line's screenshot is the screen *after* its action (OSWorld's convention).  When the step-0
line is missing (OSWorld does not save the first screen), the first recorded screenshot
stands in for it.  ``action_text`` (the action language) is preferred over ``action``
(pyautogui code) as the frame's recorded action.

Loading validates everything up front — JSON, fields, increasing step numbers, each PNG —
and refuses screenshot paths that leave the directory (absolute, ``..``, or symlinks out),
files that are not regular files (a FIFO would block the reader forever, a device would
never end), files over ``MAX_SCREENSHOT_BYTES`` and trajectories whose distinct screenshots
pass ``MAX_TOTAL_SCREENSHOT_BYTES``; a file named by several lines is read once.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from vmenv.errors import ScreenshotError, TrajectoryError, TrajectoryPathError
from vmenv.png import png_size
from vmenv.trajectory_writer import TRAJ_FILE

#: A trajectory file larger than this is refused (a long episode's lines are a few MB at most).
MAX_TRAJ_BYTES = 64 << 20
#: A screenshot file larger than this is refused (an uncompressed 8K RGBA PNG is ~130 MB; real
#: screenshots are well under 10 MB), and the distinct screenshots of one trajectory may
#: total at most ``MAX_TOTAL_SCREENSHOT_BYTES``: a few hundred lines naming big files must not
#: exhaust memory before ``--max-steps`` applies.
MAX_SCREENSHOT_BYTES = 32 << 20
MAX_TOTAL_SCREENSHOT_BYTES = 1 << 30


@attrs.frozen
class Frame:
    """One recorded screen and the action the recording took on it (None after the last)."""

    screenshot: bytes = attrs.field(repr=False)
    width: int
    height: int
    action: str | None
    reward: float = 0.0  # recorded reward on arriving at this screen


@attrs.frozen
class Trajectory:
    """A recorded episode: at least one frame; frame 0 is the screen after reset."""

    frames: tuple[Frame, ...]
    instruction: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.frames:
            raise TrajectoryError("a trajectory needs at least one screenshot")

    @property
    def actions(self) -> tuple[str | None, ...]:
        """The recorded action on each frame."""
        return tuple(f.action for f in self.frames)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[bytes, str | None]], *,
                   instruction: str = "") -> Trajectory:
        """From (screenshot PNG, action taken on it) pairs; validates every PNG."""
        frames = []
        for i, (png, action) in enumerate(pairs):
            try:
                w, h = png_size(png)
            except ScreenshotError as exc:
                raise TrajectoryError(f"pair {i}: {exc}") from exc
            if action is not None and not isinstance(action, str):
                raise TrajectoryError(f"pair {i}: the action must be a string or None")
            frames.append(Frame(png, w, h, action))
        return cls(tuple(frames), instruction)


def _safe_path(root: Path, name: Any, where: str) -> Path:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise TrajectoryError(f"{where}: screenshot_file must be a non-empty string")
    rel = Path(name)
    if rel.is_absolute():
        raise TrajectoryPathError(f"{where}: absolute screenshot path {name!r} refused")
    resolved = (root / rel).resolve()
    if not resolved.is_relative_to(root):  # '..' components or a symlink pointing out
        raise TrajectoryPathError(
            f"{where}: screenshot path {name!r} leaves the trajectory directory")
    return resolved


def _read_screenshot(path: Path, where: str) -> bytes:
    """A regular file of at most ``MAX_SCREENSHOT_BYTES``, checked before it is opened for
    reading (``stat`` neither blocks on a FIFO nor reads a device)."""
    try:
        info = path.stat()
    except OSError as exc:
        raise TrajectoryError(f"{where}: cannot read {path.name}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise TrajectoryError(f"{where}: {path.name} is not a regular file")
    if info.st_size > MAX_SCREENSHOT_BYTES:
        raise TrajectoryError(f"{where}: {path.name} is {info.st_size} bytes, more than the "
                              f"{MAX_SCREENSHOT_BYTES} a screenshot may have")
    try:
        # O_NONBLOCK: if the file was swapped for a FIFO since the stat, opening does not hang
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise TrajectoryError(f"{where}: {path.name} is not a regular file")
            return f.read(MAX_SCREENSHOT_BYTES + 1)[:MAX_SCREENSHOT_BYTES]
    except OSError as exc:
        raise TrajectoryError(f"{where}: cannot read {path.name}: {exc.strerror}") from exc


def _number(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TrajectoryError(f"{where}: {field} must be a finite number, got {value!r}")
    return float(value)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    try:
        if path.stat().st_size > MAX_TRAJ_BYTES:
            raise TrajectoryError(f"{path} is larger than {MAX_TRAJ_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrajectoryError(f"cannot read {path}: {exc}") from exc
    lines = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TrajectoryError(f"{path.name} line {n}: not JSON ({exc.msg})") from exc
        if not isinstance(entry, dict):
            raise TrajectoryError(f"{path.name} line {n}: expected a JSON object")
        entry["_line"] = n
        lines.append(entry)
    if not lines:
        raise TrajectoryError(f"{path} has no steps")
    return lines


def load_trajectory(directory: str | Path) -> Trajectory:
    """Read and validate a trajectory directory (blocking: run it off the event loop)."""
    root = Path(directory).resolve()
    if not root.is_dir():
        raise TrajectoryError(f"not a directory: {directory}")
    entries = _read_lines(root / TRAJ_FILE)
    shots: list[tuple[bytes, int, int]] = []
    actions: list[str | None] = []
    rewards: list[float] = []
    instruction, last_step = "", -1
    read: dict[Path, tuple[bytes, int, int]] = {}  # each distinct file read and checked once
    total = 0
    for e in entries:
        where = f"{TRAJ_FILE} line {e['_line']}"
        step = e.get("step_num")
        if isinstance(step, bool) or not isinstance(step, int) or step <= last_step:
            raise TrajectoryError(
                f"{where}: step_num must be an int above {last_step}, got {step!r}")
        last_step = step
        action = e.get("action_text", e.get("action"))
        if action is not None and not isinstance(action, str):
            action = json.dumps(action, sort_keys=True)  # computer_13 dict actions, as text
        path = _safe_path(root, e.get("screenshot_file"), where)
        if path not in read:
            png = _read_screenshot(path, where)
            total += len(png)
            if total > MAX_TOTAL_SCREENSHOT_BYTES:
                raise TrajectoryError(f"{where}: the trajectory's screenshots pass "
                                      f"{MAX_TOTAL_SCREENSHOT_BYTES} bytes")
            try:
                read[path] = (png, *png_size(png))
            except ScreenshotError as exc:
                raise TrajectoryError(f"{where}: {path.name}: {exc}") from exc
        shots.append(read[path])
        actions.append(action)
        rewards.append(_number(e.get("reward", 0.0), where, "reward"))
        if not instruction and isinstance(e.get("instruction"), str):
            instruction = e["instruction"]
    # line k's action led to line k's screen, so it was taken on the screen before it
    taken = [*actions[1:], None]
    frames = tuple(Frame(png, w, h, a, r) for (png, w, h), a, r in zip(shots, taken, rewards))
    return Trajectory(frames, instruction)
