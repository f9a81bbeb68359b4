"""A DesktopEnv provider for the loopback VM server (imports OSWorld: load it through
``desktop_env_import.load_desktop_env``).

How it plugs in.  ``DesktopEnv.__init__`` gets its VM manager and provider from
``create_vm_manager_and_provider(provider_name, region)``, a name it looks up in its own
module's globals, and then accepts only its fixed provider names.  So, without editing or
subclassing OSWorld: ``install_loopback_provider`` wraps that one binding, once; the wrapper
answers the region ``LOOPBACK_REGION`` with ``LoopbackVMManager`` / ``LoopbackProvider``
(OSWorld's own ``VMManager`` / ``Provider`` ABCs) and hands every other call to OSWorld's
factory unchanged.  The provider name is ``"docker"``, whose semantics in DesktopEnv are the
loopback server's: the "VM" starts clean (no revert before the first reset) and its address
is ``ip:server_port:chromium_port:vnc_port:vlc_port``.  A run.py-style construction::

    env = DesktopEnv(provider_name="docker", region=LOOPBACK_REGION,
                     path_to_vm=server.address,          # "127.0.0.1:PORT"
                     action_space=agent.action_space, screen_size=(w, h), headless=True,
                     require_a11y_tree=False, os_type="Ubuntu")

Chromium, VNC and VLC are not served: their ports are reported as 0.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import requests
import structlog
from desktop_env.providers.base import Provider, VMManager  # type: ignore[import-not-found]

log = structlog.get_logger("kvagent.osworld_vm")

#: The ``region`` that selects the loopback provider (with ``provider_name="docker"``).
LOOPBACK_REGION = "kvagent-loopback"
PROVIDER_NAME = "docker"
#: Seconds ``start_emulator`` waits for the server to answer; per-request timeout.
START_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0


def _url(path_to_vm: str, path: str) -> str:
    return f"http://{path_to_vm}{path}"


class LoopbackProvider(Provider):  # type: ignore[misc]
    """The "VM" is a loopback VM server already running at ``path_to_vm`` (``host:port``);
    its owner (``vm_server``) starts and stops the process, not DesktopEnv."""

    def start_emulator(self, path_to_vm: str, headless: bool, os_type: str = "Ubuntu") -> None:
        """Wait until the server answers (it is already running)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                requests.get(_url(path_to_vm, "/platform"),
                             timeout=REQUEST_TIMEOUT_S).raise_for_status()
                return
            except requests.RequestException as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no loopback VM server at {path_to_vm}: {exc}") from exc
                time.sleep(0.1)

    def get_ip_address(self, path_to_vm: str) -> str:
        host, _, port = path_to_vm.rpartition(":")
        return f"{host}:{int(port)}:0:0:0"  # server, chromium, vnc, vlc

    def save_state(self, path_to_vm: str, snapshot_name: str) -> None:
        raise NotImplementedError("the simulated VM has one snapshot: the task's start")

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        """Back to the current task's starting state; the VM stays where it is."""
        requests.post(_url(path_to_vm, "/simdesk/revert"),
                      timeout=REQUEST_TIMEOUT_S).raise_for_status()
        log.info("loopback_vm_reverted", vm=path_to_vm, snapshot=snapshot_name)
        return path_to_vm

    def stop_emulator(self, path_to_vm: str, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the server's owner stops it."""


class LoopbackVMManager(VMManager):  # type: ignore[misc]
    """No registry: each DesktopEnv is given its server's address as ``path_to_vm``."""

    def initialize_registry(self, **kwargs: Any) -> None:
        pass

    def add_vm(self, vm_path: str, **kwargs: Any) -> None:
        pass

    def delete_vm(self, vm_path: str, *args: Any, **kwargs: Any) -> None:
        pass

    def occupy_vm(self, vm_path: str, pid: int, *args: Any, **kwargs: Any) -> None:
        pass

    def list_free_vms(self, **kwargs: Any) -> list[str]:
        return []

    def check_and_clean(self, **kwargs: Any) -> None:
        pass

    def get_vm_path(self, *args: Any, **kwargs: Any) -> str:
        raise ValueError("the loopback provider needs path_to_vm='host:port' of a running "
                         "server (vmenv.osworld_vm.vm_server)")


def install_loopback_provider(desktop_env_module: ModuleType) -> None:
    """Make ``DesktopEnv(provider_name="docker", region=LOOPBACK_REGION, ...)`` use the
    loopback provider (idempotent; other providers are untouched)."""
    original = desktop_env_module.create_vm_manager_and_provider
    if getattr(original, "kvagent_loopback", False):
        return

    def create_vm_manager_and_provider(provider_name: str, region: str,
                                       use_proxy: bool = False) -> tuple[Any, Any]:
        if region != LOOPBACK_REGION:
            return original(provider_name, region, use_proxy=use_proxy)
        if provider_name.lower().strip() != PROVIDER_NAME:
            raise ValueError(f"region {LOOPBACK_REGION!r} goes with provider_name="
                             f"{PROVIDER_NAME!r}, not {provider_name!r}")
        return LoopbackVMManager(), LoopbackProvider(region)

    create_vm_manager_and_provider.kvagent_loopback = True  # type: ignore[attr-defined]
    desktop_env_module.create_vm_manager_and_provider = create_vm_manager_and_provider
