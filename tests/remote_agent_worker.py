"""A worker process like one of OSWorld's run_multienv.py workers: one ``KvAgent(server=URL)``
runs one task over replayed screenshots and prints its results as one JSON line.

    python tests/remote_agent_worker.py URL INSTRUCTION STEPS WIDTH HEIGHT
"""

from __future__ import annotations

import json
import os
import sys

from runtime.bench.trajectory import screenshot
from runtime.osworld import KvAgent


def main(url: str, instruction: str, steps: int, width: int, height: int) -> None:
    agent = KvAgent(server=url, screen_size=(width, height), server_retry_s=240)
    agent.reset(vm_ip="127.0.0.1")
    out = []
    for i in range(steps):
        response, actions, info = agent.predict_with_info(
            instruction, {"screenshot": screenshot(i, width, height)})
        out.append({"response": response, "actions": actions,
                    "episode_id": info["episode_id"], "reused": info["reused_tokens"]})
    print(json.dumps({"pid": os.getpid(), "steps": out}), flush=True)
    agent.close()


if __name__ == "__main__":
    url, instruction, steps, width, height = sys.argv[1:6]
    main(url, instruction, int(steps), int(width), int(height))
