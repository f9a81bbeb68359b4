"""Task names to tasks: a table's own names first, then sampled instances ``"<kind>@<seed>"``.

Every place that starts a task by name (``SimDesk.reset``, the OSWorld VM stand-in's
``simdesk start TASK``, ``FakeDesktopEnv``, ``simdesk_example``) resolves it here, so a
randomized instance runs wherever a classic task does: ``simdesk start menu-launch@17``.
"""

from __future__ import annotations

from collections.abc import Mapping

from vmenv.errors import UnknownTaskError
from vmenv.simdesk.kinds import all_kinds, parse_sampled_name, sample_task
from vmenv.simdesk.tasks import Task


def resolve_task(name: str, tasks: Mapping[str, Task]) -> Task:
    """``tasks[name]``, else the sampled instance ``name`` names (raises
    ``UnknownTaskError`` listing the known names and kinds)."""
    if name in tasks:
        return tasks[name]
    parsed = parse_sampled_name(name) if isinstance(name, str) else None
    if parsed is not None:
        return sample_task(*parsed)
    known = ", ".join(sorted(tasks))
    raise UnknownTaskError(f"unknown task {name!r}; known: {known} (or KIND@SEED, KIND one of "
                           f"{', '.join(all_kinds())})")
