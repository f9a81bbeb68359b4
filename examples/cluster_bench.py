"""Throughput of 8 concurrent episodes on one model host vs two (``kvagent serve --ray``),
side by side in one run, on this machine.

Arms (each a fresh server, the same workload, the same forged model):
  serve-1h-2t   ``kvagent serve``: one host, --threads 2 (no Ray, no front door)
  ray-1h-2t     ``kvagent serve --ray --hosts 1 --threads 2``: the same host behind the front door
  ray-1h-1t     ``kvagent serve --ray --hosts 1 --threads 1``: one host of one core
  ray-2h-1t     ``kvagent serve --ray --hosts 2 --threads 1``: two hosts of one core each

Workload: ``--episodes`` episodes created in order (so episode k has the same number and
sampling seed in every arm), then stepped concurrently, ``--steps`` steps each, with
``--vm-s`` seconds of simulated VM time between a step's answer and the next screenshot
(the overlap window).  Throughput = steps / wall seconds.  CPU seconds per step (from
/proc, robust on a shared machine where wall time is not): of the model hosts' processes,
and of the server's whole process tree (front door, Ray's own processes, hosts).  The
responses of every arm are compared with the first arm's (exactness survives distribution).

    python examples/cluster_bench.py --size M --episodes 8 --steps 6
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from runtime.bench.trajectory import screenshot

ARMS = {
    "serve-1h-2t": ["--threads", "2"],
    "ray-1h-2t": ["--ray", "--hosts", "1", "--threads", "2"],
    "ray-1h-1t": ["--ray", "--hosts", "1", "--threads", "1"],
    "ray-2h-1t": ["--ray", "--hosts", "2", "--threads", "1"],
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux /proc)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = [root], [root]
    while frontier:
        frontier = [p for p, pp in parent.items() if pp in frontier]
        tree += frontier
    return tree


def host_pids(url: str, server_pid: int) -> list[int]:
    health = httpx.get(url + "/health", timeout=30).json()
    if "hosts" in health:  # a cluster: the host actors' processes
        return [h["pid"] for h in health["hosts"].values() if h["alive"]]
    return [server_pid]


def start(model: Path, mmproj: Path, extra: list[str], slots: int, err: Path,
          ) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "runtime.cli", "serve", "--port", "0", "--model", str(model),
           "--mmproj", str(mmproj), "--ctx", "4096", "--max-episodes", str(slots),
           "--memory-budget", "4GiB", *extra]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(30)
        sys.exit(f"the server did not start: {err.read_text()[-2000:]}")
    return proc, json.loads(line)["url"]


async def workload(url: str, episodes: int, steps: int, vm_s: float, width: int,
                   ) -> tuple[float, list[list[str]], list[float], set[str]]:
    responses: list[list[str]] = [[] for _ in range(episodes)]
    critical: list[float] = []
    hosts: set[str] = set()
    shots = [[base64.b64encode(screenshot(10 * k + i, width, width * 3 // 4)).decode()
              for i in range(steps)] for k in range(episodes)]
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        ids = []
        for k in range(episodes):
            r = await c.post("/v1/episodes", json={"instruction": f"Task {k}: open the terminal.",
                                                   "options": {"temperature": 1.0}})
            r.raise_for_status()
            ids.append(r.json()["episode_id"])

        async def run(k: int) -> None:
            for i in range(steps):
                r = await c.post(f"/v1/episodes/{ids[k]}/step", json={"screenshot": shots[k][i]})
                r.raise_for_status()
                body = r.json()
                responses[k].append(body["response"])
                critical.append(body["info"]["critical_path_s"])
                hosts.add(r.headers.get("x-kvagent-host", "single"))
                await anyio.sleep(vm_s)  # the VM executes the action

        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for k in range(episodes):
                tg.start_soon(run, k)
        wall = time.perf_counter() - t0
        for ep in ids:
            await c.delete(f"/v1/episodes/{ep}")
    return wall, responses, critical, hosts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="M", help="forged model size (tiny, S, M, L)")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--vm-s", type=float, default=0.5)
    p.add_argument("--width", type=int, default=640, help="screenshot width (4:3)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    from runtime.engine_setup import DefaultModel, resolve_model

    files = resolve_model(None, None, default=DefaultModel("qwen35", args.size))
    rows: list[dict[str, Any]] = []
    reference: list[list[str]] | None = None
    for name in args.arms.split(","):
        extra = ARMS[name]
        hosts = int(extra[extra.index("--hosts") + 1]) if "--hosts" in extra else 1
        slots = -(-args.episodes // hosts)
        err = Path(f"/tmp/cluster-bench-{name}-{os.getpid()}.err")
        proc, url = start(files.model, files.mmproj, extra, slots, err)
        try:
            engines, tree = host_pids(url, proc.pid), process_tree(proc.pid)
            before = {p: cpu_seconds(p) for p in tree}
            wall, responses, critical, served = anyio.run(
                workload, url, args.episodes, args.steps, args.vm_s, args.width)
            used = {p: cpu_seconds(p) - before[p] for p in tree}
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        reference = reference or responses
        steps = args.episodes * args.steps
        rows.append({"arm": name, "hosts": len(served), "wall_s": round(wall, 2),
                     "steps_per_s": round(steps / wall, 3),
                     "host_cpu_s_per_step": round(sum(used[p] for p in engines) / steps, 3),
                     "all_cpu_s_per_step": round(sum(used.values()) / steps, 3),
                     "mean_critical_s": round(sum(critical) / len(critical), 3),
                     "same_outputs": responses == reference})
        print(json.dumps(rows[-1]), flush=True)
    base = {r["arm"]: r["steps_per_s"] for r in rows}
    print(f"\nqwen35 {args.size}, {args.episodes} episodes x {args.steps} steps, "
          f"{args.width}px screenshots, {args.vm_s} s VM time per step")
    print(f"{'arm':<14}{'hosts':>6}{'wall s':>9}{'steps/s':>9}{'crit s':>8}"
          f"{'vs ray-1h-1t':>14}{'vs serve-1h-2t':>16}{'host cpu/step':>15}"
          f"{'all cpu/step':>14}  same outputs")
    for r in rows:
        ratios = [f"{r['steps_per_s'] / base[a]:.2f}x" if a in base else "-"
                  for a in ("ray-1h-1t", "serve-1h-2t")]
        print(f"{r['arm']:<14}{r['hosts']:>6}{r['wall_s']:>9}{r['steps_per_s']:>9}"
              f"{r['mean_critical_s']:>8}{ratios[0]:>14}{ratios[1]:>16}"
              f"{r['host_cpu_s_per_step']:>15}{r['all_cpu_s_per_step']:>14}  "
              f"{r['same_outputs']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
