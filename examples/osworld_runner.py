"""Run KvAgent inside OSWorld's own runner (or, with --fake, against a simulated desktop).

KvAgent is a synchronous OSWorld agent: construct it once per worker process and hand it to
``lib_run_single.run_single_example`` exactly like OSWorld's own agents.  Results land in
OSWorld's layout, ``{result_dir}/pyautogui/screenshot/{model}/{domain}/{task_id}/``:
``traj.jsonl`` (one line per action), ``step_{n}_{timestamp}.png``, ``result.txt`` and
``recording.mp4`` (the VM's recording; the fake records none).

    # here, without a VM: kvagent's trained demo agent (kvagent-agent-qwen35, shipped in
    # runtime/agent_models/: it solves simdesk's tasks and knows nothing else)
    python examples/osworld_runner.py --fake
    # a real OSWorld checkout with its VMs (docker provider shown)
    python examples/osworld_runner.py --osworld-root ~/OSWorld --provider docker \\
        --model Qwen3.5-9B-Q4_K_M.gguf --mmproj mmproj-Qwen3.5-9B-f16.gguf --domain chrome

In run.py / run_multienv.py the only change is the agent line (of each worker):
``agent = KvAgent(model, mmproj, profile="qwen3vl", screen_size=(1920, 1080))``; for N
workers on one machine set ``KVAGENT_THREADS`` to cores // N.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

from runtime.engine_setup import DEMO_MODEL
from runtime.logs import configure_logging
from runtime.osworld import KvAgent
from runtime.profiles import names as profile_names
from runtime.run.recording import UnusableResultError, read_result
from vmenv.actions.coords import parse_wxh


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fake", action="store_true", help="simulated desktop instead of a VM")
    p.add_argument("--osworld-root", type=Path, help="OSWorld checkout (lib_run_single.py)")
    p.add_argument("--model", type=Path,
                   help=f"GGUF vision model (default: {DEMO_MODEL.describe()})")
    p.add_argument("--mmproj", type=Path, help="its vision projector GGUF")
    p.add_argument("--profile", default="kvagent", choices=profile_names(),
                   help="the model family's prompt and output format")
    p.add_argument("--policy", default="terminal-slot")
    p.add_argument("--no-overlap", dest="overlap", action="store_false")
    p.add_argument("--threads", type=int, default=None,
                   help="engine threads (default: $KVAGENT_THREADS or min(4, cores))")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-budget", default=None, help="e.g. 12GiB (default: unlimited)")
    p.add_argument("--result-dir", type=Path, default=Path("results"))
    p.add_argument("--model-name", default="kvagent", help="the {model} part of the layout")
    p.add_argument("--max-steps", type=int, default=15)
    p.add_argument("--sleep-after-execution", dest="sleep_after_execution", type=float,
                   default=0.0, help="OSWorld's pause after each action (overlap hides work "
                                     "behind it)")
    p.add_argument("--tasks", default="open-terminal,click-ok",
                   help="--fake: simdesk tasks (classic names or sampled KIND@SEED)")
    p.add_argument("--screen", default="640x384",
                   help="--fake: the simulated desktop's size (default 640x384: the size the "
                        "shipped agents were trained at)")
    p.add_argument("--provider", default="docker", help="DesktopEnv provider_name")
    p.add_argument("--path-to-vm", default=None)
    p.add_argument("--domain", default="all")
    p.add_argument("--test-meta", default="evaluation_examples/test_all.json")
    return p.parse_args()


def result_dir(args: argparse.Namespace, domain: str, task_id: str) -> Path:
    d = args.result_dir / "pyautogui" / "screenshot" / args.model_name / domain / task_id
    d.mkdir(parents=True, exist_ok=True)
    return d


def run_single_example_fake(agent: KvAgent, env: Any, example: dict[str, Any],
                            args: argparse.Namespace, out: Path, scores: list[float]) -> None:
    """What lib_run_single.run_single_example does, without its 60 s / 20 s VM waits."""
    env.reset(task_config=example)
    agent.reset(None, vm_ip=env.vm_ip)
    obs, done, step = env._get_obs(), False, 0
    env.controller.start_recording()
    while not done and step < args.max_steps:
        response, actions = agent.predict(example["instruction"], obs)
        for action in actions:
            stamp = datetime.datetime.now().strftime("%Y%m%d@%H%M%S%f")
            obs, reward, done, info = env.step(action, args.sleep_after_execution)
            shot = f"step_{step + 1}_{stamp}.png"
            (out / shot).write_bytes(obs["screenshot"])
            with open(out / "traj.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step_num": step + 1, "action_timestamp": stamp,
                                    "action": action, "response": response, "reward": reward,
                                    "done": done, "info": info, "screenshot_file": shot}) + "\n")
            print(f"  step {step + 1}: {response!r} -> {action!r} "
                  f"(critical path {agent.last_info.get('critical_path_s', 0):.3f} s)")
            if done:
                break
        step += 1
    result = env.evaluate()
    scores.append(result)
    (out / "result.txt").write_text(f"{result}\n", encoding="utf-8")
    env.controller.end_recording(str(out / "recording.mp4"))


def run_fake(agent: KvAgent, args: argparse.Namespace) -> list[float]:
    from vmenv.osworld_fake import FakeDesktopEnv, simdesk_example

    width, height = args.screen
    env, scores = FakeDesktopEnv(width=width, height=height), []
    try:
        for task in (t.strip() for t in args.tasks.split(",") if t.strip()):
            out = result_dir(args, "simdesk", task)
            print(f"{task} -> {out}")
            run_single_example_fake(agent, env, simdesk_example(task), args, out, scores)
    finally:
        env.close()
    return scores


def run_osworld(agent: KvAgent, args: argparse.Namespace) -> list[float]:
    """OSWorld's run.py loop, trimmed: its own DesktopEnv and run_single_example."""
    if args.osworld_root is None:
        sys.exit("give --osworld-root (an OSWorld checkout) or --fake")
    sys.path.insert(0, str(args.osworld_root))
    import lib_run_single  # type: ignore[import-not-found]
    from desktop_env.desktop_env import DesktopEnv  # type: ignore[import-not-found]

    root = args.osworld_root
    meta = json.loads((root / args.test_meta).read_text(encoding="utf-8"))
    env = DesktopEnv(provider_name=args.provider, path_to_vm=args.path_to_vm,
                     action_space="pyautogui", screen_size=(1920, 1080), headless=True,
                     require_a11y_tree=False, os_type="Ubuntu")
    scores: list[float] = []
    try:
        for domain, ids in meta.items():
            if args.domain not in ("all", domain):
                continue
            for task_id in ids:
                out = result_dir(args, domain, task_id)
                try:
                    if read_result(out) is not None:
                        continue  # finished earlier (OSWorld resumes the same way)
                except UnusableResultError as exc:  # a link, not a number: run it again
                    print(f"warning: {task_id}: {exc}; running it again", file=sys.stderr)
                path = root / "evaluation_examples" / "examples" / domain / f"{task_id}.json"
                example = json.loads(path.read_text(encoding="utf-8"))
                lib_run_single.run_single_example(agent, env, example, args.max_steps,
                                                  example["instruction"], args, str(out),
                                                  scores)
    finally:
        env.close()
    return scores


def main() -> None:
    args = parse_args()
    try:
        args.screen = parse_wxh(args.screen, option="--screen", low=(64, 64))
    except ValueError as exc:
        sys.exit(f"osworld_runner: error: {exc}")
    configure_logging("warning")
    if args.model is None:
        print(f"no --model: using {DEMO_MODEL.describe()}: it knows simdesk's tasks only")
    # n_ctx: derived from the window, --max-steps and the screen (checked before loading)
    agent = KvAgent(args.model, args.mmproj, profile=args.profile, policy=args.policy,
                    overlap=args.overlap, n_threads=args.threads,
                    memory_budget=args.memory_budget, temperature=args.temperature,
                    seed=args.seed, max_steps=args.max_steps,
                    screen_size=args.screen if args.fake else (1920, 1080))
    with agent:
        scores = run_fake(agent, args) if args.fake else run_osworld(agent, args)
    # OSWorld's loop: an episode ends on the agent's DONE / FAIL or at --max-steps, and the
    # score is the checker on the final state (never simdesk's stop-on-success oracle)
    print(f"{len(scores)} task(s), success rate {sum(scores) / max(len(scores), 1):.2f} "
          "(OSWorld's rule: ends on DONE/FAIL or max steps); "
          f"results under {args.result_dir}")


if __name__ == "__main__":
    main()
