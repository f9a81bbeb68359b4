"""``kvagent bench`` end to end on forged tiny models: JSON schema, exactness, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

STEP_FIELDS = {"step", "new_content_tokens", "prefill_tokens", "reused_tokens", "encode_s",
               "critical_path_prefill_tokens", "prefill_s", "decode_tokens", "decode_s",
               "context_tokens", "kv_bytes", "checkpoint_bytes", "ledger_peak_bytes",
               "rss_bytes", "vm_s", "step_wall_s", "critical_path_s"}


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "bench", "--threads", "1", *args],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_bench_json_and_exactness(forged, tmp_path: Path, arch: str) -> None:
    m = forged(arch)
    out = tmp_path / "bench.json"
    res = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--steps", "6",
                "--image-tokens", "48", "--decode-tokens", "4", "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "step 6/6" in res.stderr  # progress while it runs
    assert "terminal-slot" in res.stdout and "prefill first" in res.stdout  # the table
    report = json.loads(out.read_text())
    assert report["config"]["steps"] == 6 and report["config"]["window"] == 3
    arms = {a["arm"]: a for a in report["arms"]}
    assert list(arms) == ["evict", "noevict", "terminal-scratch", "terminal-slot", "relocate",
                          "terminal-slot+overlap"]
    for name, arm in arms.items():
        assert {"arm", "policy", "overlap", "refused", "steps", "summary", "output_sha256"} <= set(arm)
        if arm["refused"]:
            continue
        assert len(arm["steps"]) == 6
        for step in arm["steps"]:
            assert STEP_FIELDS <= set(step), STEP_FIELDS - set(step)
    assert arms["terminal-slot"]["output_sha256"] == arms["terminal-scratch"]["output_sha256"]
    assert arms["terminal-slot"]["summary"]["identical_to_reference"] is True
    slot = [s["prefill_tokens"] for s in arms["terminal-slot"]["steps"]]
    scratch = [s["prefill_tokens"] for s in arms["terminal-scratch"]["steps"]]
    assert slot[-1] < scratch[-1]
    if arch == "qwen35":
        assert arms["relocate"]["refused"] and "hybrid" in arms["relocate"]["refused"]
        assert arms["relocate"]["output_sha256"] is None
    else:
        assert arms["relocate"]["refused"] is None
        assert "drift_kl_mean" in arms["relocate"]["summary"]


def test_bench_rejects_bad_arguments(forged) -> None:
    m = forged("qwen35")
    unknown = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--arms", "lru")
    assert unknown.returncode == 2 and "unknown arm" in unknown.stderr
    no_mmproj = bench("--model", str(m.model_path))
    assert no_mmproj.returncode == 2 and "--mmproj" in no_mmproj.stderr
    bad_steps = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--steps", "0")
    assert bad_steps.returncode == 2 and "--steps" in bad_steps.stderr


def test_bench_episodes_under_a_tight_budget(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    out = tmp_path / "episodes.json"
    res = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--steps", "5",
                "--image-tokens", "48", "--decode-tokens", "4", "--episodes", "8",
                "--memory-budget", "3.2x", "--vm-seconds", "0.02", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "episodes: " in res.stderr and " running, " in res.stderr  # the live summary line
    assert "throughput ratio" in res.stdout
    report = json.loads(out.read_text())
    assert report["arms"] == []
    budget = report["ledger"]["budget_bytes"]
    assert budget == int(3.2 * report["ledger"]["one_episode_peak_bytes"])
    assert report["ledger"]["peak_bytes"] <= budget
    assert len(report["episodes"]) == 8
    for ep in report["episodes"]:
        assert ep["status"] in ("ok", "degraded") and len(ep["steps"]) == 5
        for step in ep["steps"]:
            assert STEP_FIELDS <= set(step) and step["status"] in ("ok", "degraded")
    t = report["throughput"]
    assert t["ratio"] == pytest.approx(t["concurrent_steps_per_s"] / t["sequential_steps_per_s"])
    assert '"event": "fallback"' in res.stderr  # memory pressure went down the ladder
    assert report["decode"]["concurrent"]["rows"] == report["decode"]["sequential"]["rows"]
    assert report["decode"]["sequential"]["rows_per_call"] == 1
    if all(e["status"] == "ok" for e in report["episodes"] + report["sequential_episodes"]):
        assert report["outputs_identical_to_sequential"] is True


def test_bench_rejects_a_bad_budget(forged) -> None:
    m = forged("qwen35")
    res = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--episodes", "2",
                "--memory-budget", "lots")
    assert res.returncode == 2 and "--memory-budget" in res.stderr


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_overlap_arm_critical_path_is_the_new_screenshot(forged, tmp_path: Path, arch) -> None:
    m = forged(arch)
    out = tmp_path / "overlap.json"
    res = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--steps", "7",
                "--image-tokens", "64", "--decode-tokens", "4", "--vm-seconds", "0.05",
                "--arms", "terminal-scratch,terminal-slot,terminal-slot+overlap",
                "--json", str(out))
    assert res.returncode == 0, res.stderr
    arms = {a["arm"]: a for a in json.loads(out.read_text())["arms"]}
    over = arms["terminal-slot+overlap"]
    assert over["overlap"] is True and over["policy"] == "terminal-slot"
    assert over["output_sha256"] == arms["terminal-scratch"]["output_sha256"]
    for step in over["steps"][3:]:  # window full
        assert step["critical_path_prefill_tokens"] <= 1.15 * step["new_content_tokens"]
        assert step["critical_path_prefill_tokens"] < step["prefill_tokens"]
        assert step["prefetch_prefill_tokens"] > 0
    assert over["summary"]["critical_over_new_content_max"] <= 1.15
    plain = arms["terminal-slot"]["steps"]
    assert [s["prefill_tokens"] for s in over["steps"]] == [s["prefill_tokens"] for s in plain]
