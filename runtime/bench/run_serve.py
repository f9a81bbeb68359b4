"""``kvagent bench serve`` (``kvagent bench-serve``): what an OSWorld-style agent pays per step
through ``kvagent serve`` (the real server process, over real HTTP) against the same agent
in-process — the arms run side by side on one model, summarized and reported (the arms are
described in ``runtime/commands/bench_serve.py``, with the arguments).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from runtime.bench.chat_layout import sliding_window_messages
from runtime.bench.serve_process import serve_process
from runtime.bench.trajectory import screenshot
from runtime.engine_setup import DEMO_MODEL, resolve_model
from runtime.osworld import KvAgent
from vmenv.trajectory_writer import write_durably

__all__ = ["INSTRUCTION", "SYSTEM", "run"]

SYSTEM = ("You are a GUI agent. You are given a task, the recent screenshots and your "
          "previous answers. Answer with the next action.")
INSTRUCTION = "Open the terminal and list the files in the home folder."


def run(args: argparse.Namespace, arms: list[str], size: tuple[int, int]) -> int:
    """``arms`` of ``kvagent bench serve`` on screenshots of ``size``: the report on stdout
    and in ``--json``."""
    files = resolve_model(args.model, args.mmproj, default=DEMO_MODEL)
    model, mmproj = files.model, files.mmproj

    shots = [screenshot(i, *size) for i in range(args.steps)]
    bench = _Bench(args, model, mmproj, shots, size)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="kvagent-bench-serve-") as tmp:
        for mode in ("terminal", "faithful"):
            wanted = [a for a in arms if _server_mode(a) == mode]
            if not wanted:
                continue
            with bench.server(mode, Path(tmp)) as served:
                for arm in wanted:
                    results[arm] = bench.arm(arm, served)
        if "in-process" in arms:
            results["in-process"] = bench.arm("in-process", None)
    report = _report(args, model, size, results)
    _print(report)
    if args.json_out is not None:
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
    return 0


def _server_mode(arm: str) -> str | None:
    return {"chat-terminal": "terminal", "chat-faithful": "faithful",
            "chat-no-reuse": "faithful", "episode-remote": "terminal"}.get(arm)


class _Bench:
    def __init__(self, args: argparse.Namespace, model: Path, mmproj: Path,
                 shots: list[bytes], size: tuple[int, int]) -> None:
        self.args, self.model, self.mmproj, self.shots, self.size = (args, model, mmproj,
                                                                     shots, size)

    def server(self, mode: str, tmp: Path) -> Any:
        a = self.args
        print(f"[server] kvagent serve --mode {mode} ({self.model.name})", file=sys.stderr,
              flush=True)
        return serve_process(
            ["--model", str(self.model), "--mmproj", str(self.mmproj), "--mode", mode,
             "--ctx", str(a.ctx), "--threads", str(a.threads), "--max-episodes", "2",
             "--window", str(a.screenshots), "--max-completion-tokens", str(a.max_tokens)],
            tmp / f"serve-{mode}.log")

    def arm(self, arm: str, served: Any) -> list[dict[str, Any]]:
        print(f"[{arm}] {self.args.steps} steps, K={self.args.screenshots}", file=sys.stderr,
              flush=True)
        if arm.startswith("chat-"):
            return self._chat(served, fresh_each_step=arm == "chat-no-reuse")
        return self._agent(served.url if served is not None else None)

    def _chat(self, served: Any, *, fresh_each_step: bool) -> list[dict[str, Any]]:
        a = self.args
        conversation = f"bench-{uuid.uuid4().hex[:8]}"
        answers: list[str] = []
        steps = []
        with httpx.Client(base_url=served.url, timeout=600) as c:
            for t in range(a.steps):
                messages = sliding_window_messages(SYSTEM, INSTRUCTION, self.shots[:t + 1],
                                                   answers, kept_answers=a.screenshots - 1)
                key = f"{conversation}-{t}" if fresh_each_step else conversation
                t0 = time.perf_counter()
                r = c.post("/v1/chat/completions",
                           headers={"X-Kvagent-Conversation": key},
                           json={"model": served.model, "messages": messages,
                                 "max_tokens": a.max_tokens, "temperature": 0})
                round_trip = time.perf_counter() - t0
                r.raise_for_status()
                body = r.json()
                answers.append(body["choices"][0]["message"]["content"])
                k = body["kvagent"]
                steps.append(_step(t, k, round_trip))
                _progress(t, steps[-1])
                time.sleep(a.vm_seconds)
        return steps

    def _agent(self, url: str | None) -> list[dict[str, Any]]:
        a = self.args
        common: dict[str, Any] = {"profile": "qwen3vl", "window": a.screenshots,
                                  "max_tokens": a.max_tokens, "screen_size": self.size}
        agent = (KvAgent(server=url, **common) if url is not None else
                 KvAgent(self.model, self.mmproj, n_ctx=a.ctx, n_threads=a.threads,
                         max_steps=a.steps, **common))
        steps = []
        try:
            agent.reset()
            for t in range(a.steps):
                t0 = time.perf_counter()
                _, _, info = agent.predict_with_info(INSTRUCTION,
                                                     {"screenshot": self.shots[t]})
                steps.append(_step(t, info, info.get("round_trip_s",
                                                     time.perf_counter() - t0)))
                _progress(t, steps[-1])
                time.sleep(a.vm_seconds)
        finally:
            agent.close()
        return steps


def _step(t: int, m: dict[str, Any], round_trip_s: float) -> dict[str, Any]:
    return {"step": t, "prefill_tokens": m["prefill_tokens"],
            "reused_tokens": m["reused_tokens"],
            "critical_path_prefill_tokens": m["critical_path_prefill_tokens"],
            "prefetch_prefill_tokens": m["prefetch_prefill_tokens"],
            "critical_path_s": m["critical_path_s"], "round_trip_s": round_trip_s}


def _progress(t: int, step: dict[str, Any]) -> None:
    print(f"  step {t}: critical-path prefill {step['critical_path_prefill_tokens']} tokens, "
          f"reused {step['reused_tokens']}, round trip {step['round_trip_s']:.3f} s",
          file=sys.stderr, flush=True)


def _summary(steps: list[dict[str, Any]]) -> dict[str, float]:
    warm = steps[1:]  # step 1 is a cold start for every arm

    def mean(key: str) -> float:
        return statistics.fmean(s[key] for s in warm)

    def median(key: str) -> float:
        return statistics.median(s[key] for s in warm)

    return {"critical_path_prefill_tokens": mean("critical_path_prefill_tokens"),
            "prefill_tokens": mean("prefill_tokens"), "reused_tokens": mean("reused_tokens"),
            "critical_path_s_median": median("critical_path_s"),
            "round_trip_s_median": median("round_trip_s")}


def _report(args: argparse.Namespace, model: Path, size: tuple[int, int],
            results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary = {arm: _summary(steps) for arm, steps in results.items()}
    ratios: dict[str, float] = {}

    def ratio(name: str, a: str, b: str, key: str) -> None:
        if a in summary and b in summary and summary[b][key] > 0:
            ratios[name] = summary[a][key] / summary[b][key]

    cp, rt = "critical_path_prefill_tokens", "round_trip_s_median"
    ratio("no_reuse_over_terminal_critical_tokens", "chat-no-reuse", "chat-terminal", cp)
    ratio("faithful_over_terminal_critical_tokens", "chat-faithful", "chat-terminal", cp)
    ratio("no_reuse_over_terminal_round_trip", "chat-no-reuse", "chat-terminal", rt)
    ratio("faithful_over_terminal_round_trip", "chat-faithful", "chat-terminal", rt)
    ratio("remote_over_in_process_round_trip", "episode-remote", "in-process", rt)
    return {"model": str(model), "steps": args.steps, "screenshots": args.screenshots,
            "screen": list(size), "vm_seconds": args.vm_seconds,
            "max_tokens": args.max_tokens, "threads": args.threads,
            "summary": summary, "ratios": ratios, "per_step": results}


def _print(report: dict[str, Any]) -> None:
    w, h = report["screen"]
    print(f"{report['steps']} steps, K={report['screenshots']} screenshots of {w}x{h}, "
          f"{report['max_tokens']} tokens per answer (means / medians over steps 2..)")
    print(f"{'arm':16} {'critical prefill':>16} {'prefill':>8} {'reused':>8} "
          f"{'server crit s':>13} {'round trip s':>12}")
    for arm, s in report["summary"].items():
        print(f"{arm:16} {s['critical_path_prefill_tokens']:16.0f} {s['prefill_tokens']:8.0f} "
              f"{s['reused_tokens']:8.0f} {s['critical_path_s_median']:13.3f} "
              f"{s['round_trip_s_median']:12.3f}")
    for name, value in report["ratios"].items():
        print(f"{name}: {value:.2f}x")
