"""Run OSWorld tasks in parallel over a Ray cluster (the multi-node run_multienv.py).

The model hosts run behind one front door (``kvagent serve --ray``, see docs/scaling.md);
this script starts ``--workers`` env workers as Ray actors on the same cluster, each with its
own DesktopEnv and an agent that talks to the front door, and drains the task list into
OSWorld's result layout, skipping tasks whose result.txt exists.

    # here, without VMs: simulated desktops (vmenv's DesktopEnv stand-in), 4 simdesk tasks
    kvagent serve --ray --hosts 2 --threads 1 --port 8000 &     # prints its ray_address
    python examples/osworld_run_ray.py --fake --url http://127.0.0.1:8000 \\
        --address 127.0.0.1:PORT --workers 2
    # a real OSWorld checkout, VMs through a provider (docker shown), on the cluster
    python examples/osworld_run_ray.py --url http://HEAD:8000 --address auto \\
        --osworld-root ~/OSWorld --provider docker --workers 16 --domain chrome
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from runtime.cluster.osworld_run import OsworldTask, run_parallel
from runtime.logs import configure_logging


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the front door (kvagent serve [--ray])")
    p.add_argument("--address", default="auto", help="the Ray cluster (host:port or auto)")
    p.add_argument("--workers", type=int, default=2, help="env workers (one VM each)")
    p.add_argument("--worker-cpus", type=float, default=1.0, help="CPUs Ray reserves each")
    p.add_argument("--fake", action="store_true", help="simulated desktops instead of VMs")
    p.add_argument("--tasks", default="open-terminal,click-ok,type-in-field,save-note",
                   help="--fake: simdesk tasks")
    p.add_argument("--osworld-root", type=Path, help="OSWorld checkout (lib_run_single.py)")
    p.add_argument("--provider", default="docker", help="DesktopEnv provider_name")
    p.add_argument("--path-to-vm", default=None)
    p.add_argument("--domain", default="all")
    p.add_argument("--test-meta", default="evaluation_examples/test_all.json")
    p.add_argument("--result-dir", type=Path, default=Path("results"))
    p.add_argument("--model-name", default="kvagent", help="the {model} part of the layout")
    p.add_argument("--max-steps", type=int, default=15)
    p.add_argument("--sleep-after-execution", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=0.0)
    return p.parse_args()


def make_agent(url: str, screen: tuple[int, int], temperature: float) -> Any:
    """The runner's agent: KvAgent as a client of the front door (the model is the
    cluster's; each worker holds one episode at a time)."""
    from runtime.osworld import KvAgent

    return KvAgent(server=url, screen_size=screen, temperature=temperature)


def fake_env() -> Any:
    from vmenv.osworld_fake import FakeDesktopEnv

    return FakeDesktopEnv(width=640, height=480)


def osworld_env(root: str, provider: str, path_to_vm: str | None) -> Any:
    sys.path.insert(0, root)
    from desktop_env.desktop_env import DesktopEnv  # type: ignore[import-not-found]

    return DesktopEnv(provider_name=provider, path_to_vm=path_to_vm, action_space="pyautogui",
                      screen_size=(1920, 1080), headless=True, require_a11y_tree=False,
                      os_type="Ubuntu")


def osworld_loop(root: str) -> Any:
    """OSWorld's own run_single_example, imported in the worker from the checkout."""
    def run(*args: Any) -> Any:
        sys.path.insert(0, root)
        import lib_run_single  # type: ignore[import-not-found]

        return lib_run_single.run_single_example(*args)
    return run


run_single_example_fake: Any = None  # set in main (--fake); pickled with fake_loop


def fake_loop(agent: Any, env: Any, example: dict[str, Any], max_steps: int,
              instruction: str, args: Any, out: str, scores: list[float]) -> None:
    """run_single_example's steps for the simulated desktop (examples/osworld_runner.py)."""
    assert run_single_example_fake is not None
    run_single_example_fake(agent, env, example, argparse.Namespace(
        max_steps=max_steps, sleep_after_execution=args.sleep_after_execution), Path(out),
        scores)


def tasks_of(args: argparse.Namespace) -> list[OsworldTask]:
    if args.fake:
        from vmenv.osworld_fake import simdesk_example

        return [OsworldTask("simdesk", simdesk_example(t.strip()))
                for t in args.tasks.split(",") if t.strip()]
    if args.osworld_root is None:
        sys.exit("give --osworld-root (an OSWorld checkout) or --fake")
    root = args.osworld_root
    meta = json.loads((root / args.test_meta).read_text(encoding="utf-8"))
    out = []
    for domain, ids in meta.items():
        if args.domain in ("all", domain):
            for task_id in ids:
                path = root / "evaluation_examples" / "examples" / domain / f"{task_id}.json"
                out.append(OsworldTask(domain, json.loads(path.read_text(encoding="utf-8"))))
    return out


def main() -> None:
    args = parse_args()
    configure_logging("warning")
    if args.address != "auto" and args.address.startswith("127."):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # a one-machine Ray: loopback
    import ray
    import ray.cloudpickle

    ray.init(address=args.address, log_to_driver=False)
    screen = (640, 480) if args.fake else (1920, 1080)
    if args.fake:
        import osworld_runner  # examples/ (this script's directory): pickled by value

        global run_single_example_fake
        ray.cloudpickle.register_pickle_by_value(osworld_runner)
        run_single_example_fake = osworld_runner.run_single_example_fake
        make_env, loop = fake_env, fake_loop
    else:
        root = str(args.osworld_root.resolve())
        make_env = functools.partial(osworld_env, root, args.provider, args.path_to_vm)
        loop = osworld_loop(root)
    outcomes = run_parallel(
        tasks_of(args), result_root=args.result_dir, model_name=args.model_name,
        workers=args.workers, worker_cpus=args.worker_cpus, make_env=make_env,
        make_agent=functools.partial(make_agent, args.url, screen, args.temperature),
        run_example=loop, max_steps=args.max_steps,
        args=argparse.Namespace(sleep_after_execution=args.sleep_after_execution),
        on_outcome=lambda o: print(f"{o.domain}/{o.task_id}: score {o.score} in "
                                   f"{o.seconds:.1f} s (worker {o.worker}) {o.error}"))
    scored = [o.score for o in outcomes if o.score is not None]
    print(f"{len(outcomes)} task(s) run, {len(outcomes) - len(scored)} failed, success rate "
          f"{sum(scored) / max(len(scored), 1):.2f}; results under {args.result_dir}")
    ray.shutdown()


if __name__ == "__main__":
    main()
