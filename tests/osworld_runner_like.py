"""OSWorld's runner loop, as a test helper: ``run_single_example_like`` makes
``lib_run_single.run_single_example``'s calls in its order (that loop is not in the
desktop-env wheel and is not copied here), minus its 60 s / 20 s sleeps.  Used against the
fake DesktopEnv (test_osworld_agent) and the real one (test_osworld_desktopenv).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from types import SimpleNamespace
from typing import Any

TRAJ_KEYS = {"step_num", "action_timestamp", "action", "response", "reward", "done", "info",
             "screenshot_file"}
ARGS = SimpleNamespace(sleep_after_execution=0.0)


def run_single_example_like(agent: Any, env: Any, example: dict[str, Any], max_steps: int,
                            instruction: str, args: Any, example_result_dir: str,
                            scores: list[float]) -> list[tuple[Any, ...]]:
    """lib_run_single.run_single_example's steps; returns what predict returned."""
    runtime_logger = logging.getLogger(f"desktopenv.example.{example['id']}")
    env.reset(task_config=example)
    try:
        agent.reset(runtime_logger, vm_ip=env.vm_ip)
    except Exception:  # noqa: BLE001  (OSWorld's own retry form)
        agent.reset(vm_ip=env.vm_ip)
    obs = env._get_obs()  # (OSWorld sleeps 60 s before this)
    done = False
    step_idx = 0
    env.controller.start_recording()
    returned: list[tuple[Any, ...]] = []
    while not done and step_idx < max_steps:
        response, actions = agent.predict(instruction, obs)
        returned.append((response, actions))
        for action in actions:
            action_timestamp = datetime.datetime.now().strftime("%Y%m%d@%H%M%S%f")
            obs, reward, done, info = env.step(action, args.sleep_after_execution)
            shot = f"step_{step_idx + 1}_{action_timestamp}.png"
            with open(os.path.join(example_result_dir, shot), "wb") as f:
                f.write(obs["screenshot"])
            with open(os.path.join(example_result_dir, "traj.jsonl"), "a") as f:
                f.write(json.dumps({"step_num": step_idx + 1, "action_timestamp": action_timestamp,
                                    "action": action, "response": response, "reward": reward,
                                    "done": done, "info": info, "screenshot_file": shot}))
                f.write("\n")
            if done:
                break
        step_idx += 1
    result = env.evaluate()  # (OSWorld sleeps 20 s before this)
    scores.append(result)
    with open(os.path.join(example_result_dir, "result.txt"), "w", encoding="utf-8") as f:
        f.write(f"{result}\n")
    env.controller.end_recording(os.path.join(example_result_dir, "recording.mp4"))
    return returned


class InfoRecorder:
    """Passes reset/predict through and keeps each step's ``last_info``."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.infos: list[dict[str, Any]] = []

    def reset(self, *args: Any, **kwargs: Any) -> None:
        self.agent.reset(*args, **kwargs)

    def predict(self, instruction: str, obs: dict[str, Any]) -> tuple[str, list[str]]:
        out = self.agent.predict(instruction, obs)
        self.infos.append(self.agent.last_info)
        return out
