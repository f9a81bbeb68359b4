"""The issue's "Done when": OSWorld's run_multienv with ``KvAgent(server=URL)``, run twice back
to back with ``--max-episodes`` equal to the number of workers, finishes both runs without a
429 wait.  Each worker is a real process (spawned, with its own real ``DesktopEnv`` on its
own loopback VM) that drains the task queue as run_multienv's do and ends with ``os._exit``
— no ``close``: its last episode's slot comes back because its lease request closes."""

from __future__ import annotations

import json
import multiprocessing
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve_helpers import kvagent_serve

try:
    from vmenv.osworld_vm.desktop_env_import import DESKTOP_ENV_INSTALL, load_desktop_env

    load_desktop_env()
except ModuleNotFoundError as exc:
    if exc.name != "desktop_env":
        raise
    pytest.skip(f"OSWorld's desktop_env is not installed: {DESKTOP_ENV_INSTALL}",
                allow_module_level=True)

from vmenv.osworld_vm import simdesk_example, vm_server  # noqa: E402

SCREEN = (320, 240)
WORKERS = 2  # run_multienv's --num_envs, and the server's --max-episodes


def _run(url: str, tasks: list[str], root: Path, run: int) -> list[dict[str, Any]]:
    """One run_multienv-style run: WORKERS processes drain ``tasks``; their reports."""
    from osworld_multienv_like import worker

    ctx = multiprocessing.get_context("spawn")
    queue_ = ctx.Queue()
    for name in tasks:
        queue_.put(("simdesk", simdesk_example(name, example_id=f"{name}-{run}")))
    with vm_server("open-terminal", SCREEN) as vm0, vm_server("open-terminal", SCREEN) as vm1:
        procs = [ctx.Process(target=worker, args=(
            queue_, vm.address, str(root / f"run{run}"), "", "", SCREEN,
            str(root / f"report{run}-{i}.json"), url)) for i, vm in enumerate((vm0, vm1))]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
    assert [p.exitcode for p in procs] == [0] * WORKERS
    return [json.loads((root / f"report{run}-{i}.json").read_text()) for i in range(WORKERS)]


def _count(metrics: str, route: str, status: int) -> float:
    m = re.search(rf'kvagent_http_responses_total{{route="{route}",status="{status}"}} (\S+)',
                  metrics)
    return float(m.group(1)) if m else 0.0


def test_run_multienv_twice_back_to_back_without_a_429(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    tasks = ["open-terminal", "click-ok", "type-in-field"]
    with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", str(WORKERS),
                       "--n-batch", "64") as served:
        started = time.monotonic()
        for run in (1, 2):
            reports = _run(served.url, tasks, tmp_path, run)
            assert sorted(t for r in reports for t in r["done"]) == sorted(
                f"{t}-{run}" for t in tasks)
        elapsed = time.monotonic() - started
        with httpx.Client(base_url=served.url, timeout=60) as c:
            metrics = c.get("/metrics").text
            assert _count(metrics, "episode_create", 201) == 2 * len(tasks)
            # not one refusal: every worker got a slot at once, in both runs
            assert _count(metrics, "episode_create", 429) == 0, metrics
            # the second run's workers are gone too: their episodes end with their leases
            deadline = time.monotonic() + 30
            while c.get("/health").json()["episodes"]["open"] and time.monotonic() < deadline:
                time.sleep(0.25)
            assert c.get("/health").json()["episodes"]["open"] == 0
    print(f"two run_multienv runs of {len(tasks)} tasks on {WORKERS} workers: "
          f"{elapsed:.1f} s, no 429")
    text = served.stderr()
    assert "episode_api_retry" not in text
    assert text.count("serve_lease_expired") >= WORKERS  # (each run's last episodes)
