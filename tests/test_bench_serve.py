"""``kvagent bench-serve``: the real server process measured against the in-process agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _kvagent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)


def test_bench_serve_measures_the_server_and_the_in_process_agent(forged, tmp_path) -> None:
    m = forged("qwen35")
    out = tmp_path / "serve.json"
    r = _kvagent("bench-serve", "--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
                 "--steps", "3", "--vm-seconds", "0.2", "--threads", "1", "--ctx", "8192",
                 "--arms", "chat-terminal,chat-no-reuse,in-process", "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["per_step"]) == {"chat-terminal", "chat-no-reuse", "in-process"}
    assert all(len(steps) == 3 for steps in report["per_step"].values())
    terminal = report["per_step"]["chat-terminal"]
    no_reuse = report["per_step"]["chat-no-reuse"]
    # the same requests: without reuse every step prefills its whole prompt, with terminal
    # mode the warm steps prefill the new screenshot on the critical path
    assert all(s["reused_tokens"] == 0 for s in no_reuse)
    assert all(s["reused_tokens"] > 0 for s in terminal[1:])
    assert report["ratios"]["no_reuse_over_terminal_critical_tokens"] > 1.5
    assert "no_reuse_over_terminal_critical_tokens" in r.stdout  # the printed table


def test_bench_serve_refuses_bad_arguments() -> None:
    r = _kvagent("bench-serve", "--arms", "chat-terminal,warp")
    assert r.returncode == 2 and "warp" in r.stderr
    r = _kvagent("bench-serve", "--screen", "big")
    assert r.returncode == 2 and "WxH" in r.stderr
