"""A loopback stand-in for an OSWorld VM: the simulated desktop behind OSWorld's VM HTTP API.

OSWorld's ``DesktopEnv`` talks to its VM through a small HTTP server inside the VM
(``PythonController`` / ``SetupController`` are its clients).  ``python -m vmenv.osworld_vm``
serves that API on 127.0.0.1 over a ``vmenv.simdesk.env`` desktop — another process, as a VM is
another machine — so OSWorld's real DesktopEnv runs here without a VM:

* ``protocol`` — the simulated VM's own commands and the OSWorld example that uses them;
* ``machine`` — the simulated machine: desktop state, /execute's command dispatch (pyautogui
  code is read by ``vmenv.pyautogui_parse``, never executed), recording;
* ``screens`` — screenshots (PNG or JPEG, optionally at a size other than the screen's),
  recordings, the accessibility tree;
* ``app`` / ``__main__`` — the Starlette app and the command line (uvicorn);
* ``process`` — ``vm_server(...)``: start the server as a subprocess, wait until it is ready,
  stop it;
* ``desktop_env_import`` / ``provider`` — import OSWorld's ``desktop_env`` with light
  dependencies only, and the DesktopEnv provider that points at a running server.

Importing this package imports neither Starlette nor OSWorld.
"""

from vmenv.osworld_vm.process import VmServer, VmServerError, vm_server
from vmenv.osworld_vm.protocol import (
    CHECK_FAIL, CHECK_PASS, VM_PLATFORM, check_command, example_task, simdesk_example,
    start_command,
)

__all__ = [
    "CHECK_FAIL", "CHECK_PASS", "VM_PLATFORM", "VmServer", "VmServerError", "check_command",
    "example_task", "simdesk_example", "start_command", "vm_server",
]
