"""What a simulated-desktop "VM" understands besides pyautogui code, and the OSWorld task
config that uses it.

OSWorld describes a task as an example dict: ``config`` (setup steps run on the VM before the
agent starts) and ``evaluator`` (getters that read the VM, a metric that scores what they
read).  A simdesk example uses only steps and evaluators that OSWorld's own code runs with
light dependencies, and two commands the simulated VM answers on /execute:

* ``simdesk start TASK`` — a fresh desktop with TASK's starting state (the setup step,
  through SetupController's ``execute`` step → /setup/execute);
* ``simdesk check`` — the task checker's verdict as a line of text (the evaluator:
  getter ``vm_command_line`` → /execute, metric ``check_include_exclude`` against a ``rule``).

``FakeDesktopEnv`` reads the same examples (it takes the task from the setup step and scores
with the checker directly), so one example runs on the fake and on the real DesktopEnv.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vmenv.errors import UnknownTaskError
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.tasks import Task, default_tasks

#: The program name of the simulated VM's own commands.
SIMDESK_COMMAND = "simdesk"
#: What ``simdesk check`` prints for a solved / unsolved task (one line, then the task name).
CHECK_PASS = "simdesk-check: pass"
CHECK_FAIL = "simdesk-check: fail"
#: ``platform.system()`` of the simulated VM (OSWorld's default os_type is Ubuntu).
VM_PLATFORM = "Linux"


def start_command(task: str) -> list[str]:
    """The setup command that starts ``task`` on a fresh desktop."""
    return [SIMDESK_COMMAND, "start", task]


def check_command() -> list[str]:
    """The command whose output reports the current task's checker verdict."""
    return [SIMDESK_COMMAND, "check"]


def simdesk_example(task: str, *, example_id: str | None = None,
                    tasks: Mapping[str, Task] | None = None) -> dict[str, Any]:
    """An OSWorld example (id, instruction, config, evaluator) for a simulated-desktop task."""
    chosen = resolve_task(task, dict(tasks) if tasks is not None else default_tasks())
    return {
        "id": example_id or task, "snapshot": "simdesk", "source": "kvagent-simdesk",
        "instruction": chosen.instruction, "related_apps": [],
        "config": [{"type": "execute", "parameters": {"command": start_command(task)}}],
        "evaluator": {
            "func": "check_include_exclude",
            "result": {"type": "vm_command_line", "command": check_command()},
            "expected": {"type": "rule", "rules": {"include": [CHECK_PASS], "exclude": []}},
        },
    }


def example_task(example: Mapping[str, Any]) -> str:
    """The simdesk task an example starts (its ``simdesk start TASK`` setup step); raises
    ``UnknownTaskError`` for an example that is not a simulated-desktop task."""
    for step in example.get("config") or ():
        if not isinstance(step, Mapping) or step.get("type") != "execute":
            continue
        command = (step.get("parameters") or {}).get("command")
        if (isinstance(command, list) and len(command) == 3
                and command[:2] == [SIMDESK_COMMAND, "start"]):
            return str(command[2])
    raise UnknownTaskError(f"example {example.get('id')!r} is not a simulated-desktop task "
                           f"(no {SIMDESK_COMMAND!r} start step in its config)")
