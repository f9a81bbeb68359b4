"""A run_multienv-style worker, as a test helper (OSWorld's run_multienv.py is not in the
desktop-env wheel and is not copied here): one process with its own real ``DesktopEnv`` and
``KvAgent`` drains a shared task queue, runs each task the way ``run_single_example`` does,
and ends with ``os._exit`` — never calling ``agent.close()``, as OSWorld's workers do.

Before it exits, the worker writes a report (JSON) of what it did and of what it leaves
behind: its child processes and the engine's thread count.
"""

from __future__ import annotations

import json
import os
import queue
from pathlib import Path
from typing import Any

from osworld_runner_like import ARGS, run_single_example_like

MODEL_NAME = "kvagent-tiny"
QUEUE_WAIT_S = 5.0  # an empty queue for this long: the run is over


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def worker(tasks: Any, vm_address: str, result_root: str, model: str, mmproj: str,
           screen: tuple[int, int], report: str, server: str | None = None) -> None:
    """The worker process: build the env and the agent, drain ``tasks`` ((domain, example)
    pairs), report, ``os._exit(0)``.  ``server``: a ``kvagent serve`` URL — the agent is then
    ``KvAgent(server=URL)`` (the one line a run_multienv worker changes to share a model)."""
    status = 1
    done: list[str] = []
    try:
        from runtime.osworld import KvAgent
        from vmenv.osworld_vm.desktop_env_import import load_desktop_env
        from vmenv.osworld_vm.provider import LOOPBACK_REGION, PROVIDER_NAME

        env = load_desktop_env().DesktopEnv(
            provider_name=PROVIDER_NAME, region=LOOPBACK_REGION, path_to_vm=vm_address,
            action_space="pyautogui", screen_size=screen, headless=True, os_type="Ubuntu",
            require_a11y_tree=False, cache_dir=str(Path(result_root) / f"cache-{os.getpid()}"))
        # the one line a worker changes: OSWorld's agent → KvAgent
        if server is None:
            agent = KvAgent(model, mmproj, screen_size=screen, n_batch=64, temperature=1.0,
                            seed=os.getpid() % 1000)
        else:
            agent = KvAgent(server=server, screen_size=screen, temperature=1.0,
                            seed=os.getpid() % 1000)
        try:
            while True:
                try:
                    domain, example = tasks.get(timeout=QUEUE_WAIT_S)
                except queue.Empty:
                    break
                out = (Path(result_root) / "pyautogui" / "screenshot" / MODEL_NAME / domain
                       / example["id"])
                out.mkdir(parents=True, exist_ok=True)
                run_single_example_like(agent, env, example, 2, example["instruction"], ARGS,
                                        str(out), [])
                done.append(example["id"])
            n_threads = agent.config.engine.n_threads if server is None else 0
        finally:
            env.close()
        Path(report).write_text(json.dumps({
            "pid": os.getpid(), "done": done, "n_threads": n_threads,
            "children": children_of(os.getpid())}))
        status = 0
    finally:
        os._exit(status)  # as OSWorld's workers end: no atexit hooks, no finalizers
