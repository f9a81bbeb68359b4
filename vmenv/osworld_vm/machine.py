"""The simulated machine behind the loopback VM server: one desktop, one task at a time.

``/execute`` receives a command (an argv list, or a string with ``shell``) and gets back what
a process run would give: output, error, return code.  Nothing is ever run:

* ``python -c CODE`` — CODE is read by ``vmenv.pyautogui_parse`` (OSWorld's controller prelude
  dropped): pyautogui calls are applied to the desktop as action records; the one query
  program OSWorld sends (``import platform; print(platform.system())``) is answered; any
  other code exits 1 with the reader's reason and leaves the desktop unchanged;
* ``simdesk start TASK`` / ``simdesk check`` — see ``protocol``;
* anything else exits 127 ("not available on the simulated desktop").

Not thread-safe: the server calls it from its event loop only.  States are immutable, so a
state handed out (to render a screenshot elsewhere) never changes under its reader.
"""

from __future__ import annotations

import ast
import collections
import shlex
from collections.abc import Mapping
from typing import Any

import attrs
import structlog

from vmenv.actions import Action, format_action
from vmenv.errors import UnknownTaskError
from vmenv.osworld_vm.protocol import (
    CHECK_FAIL, CHECK_PASS, SIMDESK_COMMAND, VM_PLATFORM,
)
from vmenv.pyautogui_parse import UnsupportedCodeError, apply_code, parse_program
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks

log = structlog.get_logger("kvagent.osworld_vm")

#: The query PythonController.get_vm_platform sends (after its prelude), as AST dumps.
_PLATFORM_QUERY = tuple(ast.dump(s) for s in
                        ast.parse("import platform; print(platform.system())").body)
#: A recording keeps this many frames (the most recent ones).
MAX_RECORDED_FRAMES = 500
_PYTHONS = ("python", "python3")


@attrs.frozen
class ExecResult:
    """What the VM's /execute reports for one command."""

    output: str = ""
    error: str = ""
    returncode: int = 0

    def as_json(self) -> dict[str, Any]:
        """The body OSWorld's VM server returns (a finished process is a 'success')."""
        return {"status": "success", "output": self.output, "error": self.error,
                "returncode": self.returncode}


def action_record(action: Action) -> dict[str, Any]:
    """An action as JSON-ready data: ``{"kind": ..., <its fields>}`` (tuples become lists)."""
    fields = attrs.asdict(action, recurse=False)
    return {"kind": action.kind, **{k: list(v) if isinstance(v, tuple) else v
                                    for k, v in fields.items()}}


class SimMachine:
    """The desktop state, the current task, the actions applied, an optional recording."""

    def __init__(self, task: str, screen: tuple[int, int], *,
                 tasks: Mapping[str, Task] | None = None) -> None:
        self.screen = screen
        self.tasks = dict(tasks) if tasks is not None else default_tasks()
        self.applied: list[Action] = []  # every action applied since the last (re)start
        self._task = self._known(task)
        self._state = self._fresh(self._task)
        self._frames: collections.deque[DeskState] | None = None

    @property
    def state(self) -> DeskState:
        return self._state

    @property
    def task(self) -> Task:
        return self._task

    def start(self, task: str) -> None:
        """A fresh desktop with ``task``'s starting state (raises ``UnknownTaskError``)."""
        self._task = self._known(task)
        self.applied.clear()
        self._set(self._fresh(self._task))
        log.info("osworld_vm_start", task=task)

    def revert(self) -> None:
        """Back to the current task's starting state (the provider's snapshot revert)."""
        self.start(self._task.name)

    def solved(self) -> bool:
        return bool(self._task.check(self._state))

    def execute(self, command: Any, shell: bool = False) -> ExecResult:
        """Run ``command`` the simulated way (see the module docstring)."""
        if isinstance(command, str):
            try:
                argv = shlex.split(command) if shell else [command]
            except ValueError as exc:
                return ExecResult(error=f"bad command line: {exc}", returncode=2)
        elif isinstance(command, list) and all(isinstance(a, str) for a in command):
            argv = list(command)
        else:
            return ExecResult(error="command must be a string or a list of strings",
                              returncode=2)
        if len(argv) == 3 and argv[0] in _PYTHONS and argv[1] == "-c":
            return self._python(argv[2])
        if argv and argv[0] == SIMDESK_COMMAND:
            return self._simdesk(argv[1:])
        name = argv[0] if argv else "(empty)"
        return ExecResult(error=f"{name}: not available on the simulated desktop",
                          returncode=127)

    def start_recording(self) -> None:
        self._frames = collections.deque([self._state], maxlen=MAX_RECORDED_FRAMES)

    def end_recording(self) -> tuple[DeskState, ...] | None:
        """The states shown since ``start_recording`` (None if no recording was running)."""
        frames, self._frames = self._frames, None
        return tuple(frames) if frames is not None else None

    def status(self) -> dict[str, Any]:
        """Inspection for tests and humans (not part of OSWorld's API)."""
        return {"task": self._task.name, "solved": self.solved(),
                "pointer": list(self._state.pointer), "screen": list(self.screen),
                "step": self._state.step, "actions": [action_record(a) for a in self.applied],
                "recording": self._frames is not None}

    # ------------------------------------------------------------------ internals

    def _python(self, code: str) -> ExecResult:
        try:
            body = parse_program(code, prelude=True)
            if tuple(ast.dump(s) for s in body) == _PLATFORM_QUERY:
                return ExecResult(output=VM_PLATFORM + "\n")
            state, actions = apply_code(self._state, code, prelude=True)
        except UnsupportedCodeError as exc:
            log.warning("osworld_vm_refused_code", reason=str(exc))
            return ExecResult(error=f"UnsupportedCodeError: {exc}\n", returncode=1)
        self.applied.extend(actions)
        self._set(attrs.evolve(state, step=state.step + 1))  # the taskbar clock moves on
        log.debug("osworld_vm_applied", actions=[format_action(a) for a in actions])
        return ExecResult()

    def _simdesk(self, args: list[str]) -> ExecResult:
        if args == ["check"]:
            verdict = CHECK_PASS if self.solved() else CHECK_FAIL
            return ExecResult(output=f"{verdict} {self._task.name}\n")
        if len(args) == 2 and args[0] == "start":
            try:
                self.start(args[1])
            except UnknownTaskError as exc:
                return ExecResult(error=f"{exc}\n", returncode=1)
            return ExecResult(output=f"started {args[1]}\n")
        return ExecResult(error="usage: simdesk start TASK | simdesk check\n", returncode=2)

    def _set(self, state: DeskState) -> None:
        state.check_integrity()
        self._state = state
        if self._frames is not None:
            self._frames.append(state)

    def _known(self, task: str) -> Task:
        return resolve_task(task, self.tasks)

    def _fresh(self, task: Task) -> DeskState:
        state = task.setup(DeskState.empty(*self.screen))
        state.check_integrity()
        return state
