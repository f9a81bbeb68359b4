"""The simulated desktop: state, geometry, how actions change it, rendering, tasks, the env.

``env.SimDesk`` is the ``Env``; ``state`` holds the immutable records, ``apply`` the pure
state transition, ``render`` draws a state, ``layout`` / ``geometry`` / ``widgets`` say where
things are, ``tasks`` the classic tasks with their checkers and scripted solutions.

Randomized instances (docs/simdesk.md): ``kinds.sample_task(kind, seed)`` over the kinds of
``drafts``, laid out by ``placement``; ``goals`` (what a task wants, its checker), ``expert``
(the solver's next action from any state), ``perturb`` (recovery states), ``demos``
(labelled episodes), ``seeds`` (the train / eval split).
"""

from vmenv.simdesk.demos import DemoStep, demonstration
from vmenv.simdesk.env import SimDesk, SimDeskConfig
from vmenv.simdesk.expert import RECOVERY_STEPS, next_action
from vmenv.simdesk.goals import Goal, check
from vmenv.simdesk.kinds import (
    all_kinds, resolve_kinds, sample_task, sampled_name, task_kinds,
)
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.perturb import PERTURBATIONS, perturb
from vmenv.simdesk.seeds import eval_seeds, is_eval_seed, seed_split, train_seeds
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks, expert_rollout

__all__ = [
    "PERTURBATIONS", "RECOVERY_STEPS", "DemoStep", "DeskState", "Goal", "SimDesk",
    "SimDeskConfig", "Task", "all_kinds", "check", "default_tasks", "demonstration",
    "eval_seeds", "expert_rollout", "is_eval_seed", "next_action", "perturb", "resolve_kinds",
    "resolve_task", "sample_task", "sampled_name", "seed_split", "task_kinds", "train_seeds",
]
