"""kvagent.vmenv: environments behind one async interface (docs/structure.md).

* ``SimDesk`` — a deterministic simulated desktop rendered with Pillow, with tasks and
  checkers and a VM-latency knob;
* ``ReplayEnv`` — replays a recorded trajectory (benchmarks); ``record_trajectory`` writes one.
"""

from vmenv.base import Env, Observation, StepOutcome
from vmenv.errors import (
    EnvBusyError, EnvClosedError, EnvStateError, EnvTimeoutError, EpisodeOverError,
    MissingScreenshotError, NotResetError, ScreenshotError, TrajectoryError, TrajectoryPathError,
    UnknownTaskError, UnknownWidgetError, VmEnvError,
)
from vmenv.png import image_size, png_size, screenshot_png
from vmenv.replay import ReplayEnv, record_trajectory
from vmenv.simdesk.env import SimDesk, SimDeskConfig
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks
from vmenv.trajectory import Frame, Trajectory, load_trajectory

__all__ = [
    "DeskState",
    "Env",
    "EnvBusyError",
    "EnvClosedError",
    "EnvStateError",
    "EnvTimeoutError",
    "EpisodeOverError",
    "Frame",
    "MissingScreenshotError",
    "NotResetError",
    "Observation",
    "ReplayEnv",
    "ScreenshotError",
    "SimDesk",
    "SimDeskConfig",
    "StepOutcome",
    "Task",
    "Trajectory",
    "TrajectoryError",
    "TrajectoryPathError",
    "UnknownTaskError",
    "UnknownWidgetError",
    "VmEnvError",
    "default_tasks",
    "image_size",
    "load_trajectory",
    "png_size",
    "record_trajectory",
    "screenshot_png",
]
