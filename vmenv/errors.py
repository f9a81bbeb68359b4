"""Typed errors of the environment layer, grouped by cause.

* misuse of an env (``EnvStateError``): stepping before ``reset``, after the episode ended,
  while another step is running, or after ``close`` (``EnvClosedError``);
* ``UnknownTaskError`` / ``UnknownWidgetError`` — a name the env does not know;
* ``TrajectoryError`` — a recorded trajectory is corrupt or unreadable;
  ``TrajectoryPathError`` when one of its paths would escape the trajectory directory;
* ``ScreenshotError`` — bytes that are not a valid screenshot image
  (``MissingScreenshotError`` when there are none at all);
* ``EnvTimeoutError`` — an env call did not return within its bound (the VM hangs).
"""

from __future__ import annotations


class VmEnvError(Exception):
    """Base class for errors raised by ``vmenv``."""


class EnvStateError(VmEnvError):
    """The env was used out of order (a caller bug, not a VM failure)."""


class NotResetError(EnvStateError):
    """``step`` was called before ``reset``."""


class EpisodeOverError(EnvStateError):
    """``step`` was called after the episode reported ``done``; call ``reset`` first."""


class EnvBusyError(EnvStateError):
    """Another ``reset`` / ``step`` of the same env is still running."""


class EnvClosedError(EnvStateError):
    """The env was closed."""


class UnknownTaskError(VmEnvError, KeyError):
    """No task of that name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown task"


class UnknownWidgetError(VmEnvError, KeyError):
    """No widget of that name is on the screen right now."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown widget"


class ScreenshotError(VmEnvError):
    """Bytes that are not a valid screenshot (PNG, or a format ``vmenv.png`` converts)."""


class MissingScreenshotError(ScreenshotError):
    """The env returned no screenshot (OSWorld's DesktopEnv gives None after three failed
    tries)."""


class EnvTimeoutError(VmEnvError):
    """An env call did not return within its bound; the call was abandoned (a VM that hangs
    or does not answer).  The env's state is unknown afterwards: close it."""


class TrajectoryError(VmEnvError):
    """A recorded trajectory is corrupt: bad JSON, missing fields or files, bad screenshots."""


class TrajectoryPathError(TrajectoryError):
    """A trajectory entry names a path outside the trajectory directory."""
