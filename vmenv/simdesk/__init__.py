"""The simulated desktop: state, geometry, how actions change it, rendering, tasks, the env.

``env.SimDesk`` is the ``Env``; ``state`` holds the immutable records, ``apply`` the pure
state transition, ``render`` draws a state, ``geometry`` and ``widgets`` say where things
are, ``tasks`` the tasks with their checkers and scripted solutions.
"""

from vmenv.simdesk.env import SimDesk, SimDeskConfig
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks

__all__ = ["DeskState", "SimDesk", "SimDeskConfig", "Task", "default_tasks"]
