"""``kvagent bench`` end to end on forged tiny models: JSON schema, exactness, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

STEP_FIELDS = {"step", "new_content_tokens", "prefill_tokens", "reused_tokens", "encode_s",
               "critical_path_prefill_tokens", "prefill_s", "decode_tokens", "decode_s",
               "context_tokens", "kv_bytes", "checkpoint_bytes", "ledger_peak_bytes",
               "rss_bytes", "vm_s", "step_wall_s", "critical_path_s"}


def check_analysis(report: dict, stdout: str) -> None:
    """The report's bound, optimum, latency, decode-fit and ledger fields against the same
    quantities recomputed here from the step records (numpy for the fit)."""
    ran = {a["arm"]: a for a in report["arms"] if not a["refused"]}
    spt = min(sum(s["prefill_s"] for s in a["steps"]) / sum(s["prefill_tokens"] for s in a["steps"])
              for a in ran.values())
    assert report["bound"]["prefill_s_per_token"] == pytest.approx(spt)
    n = report["config"]["steps"]
    encode = [min(a["steps"][i]["encode_s"] for a in ran.values()) for i in range(n)]
    evict = ran["evict"]
    for name, arm in ran.items():
        s, steps = arm["summary"], arm["steps"]
        bound = sum(s_["vm_s"] + encode[i] + s_["new_content_tokens"] * spt + s_["decode_s"]
                    for i, s_ in enumerate(steps))
        assert s["bound_s"] == pytest.approx(bound) and bound > 0
        if not arm["overlap"]:  # it prefilled at least the new content, no faster
            assert bound <= s["wall_s"], name
        assert s["wall_over_bound"] == pytest.approx(s["wall_s"] / bound)
        assert s["critical_path_s_over_evict_last"] == pytest.approx(
            steps[-1]["critical_path_s"] / evict["steps"][-1]["critical_path_s"])
        x = np.array([s_["context_tokens"] for s_ in steps], dtype=float)
        y = np.array([s_["decode_s"] / s_["decode_tokens"] for s_ in steps])
        slope, intercept = np.polyfit(x, y, 1)
        fit = s["decode_fit"]
        assert fit["points"] == n
        assert fit["a_s"] == pytest.approx(intercept, rel=1e-6, abs=1e-9)
        assert fit["b_s_per_token"] == pytest.approx(slope, rel=1e-6, abs=1e-12)
        assert fit["r2"] == pytest.approx(np.corrcoef(x, y)[0, 1] ** 2, abs=1e-9)
        assert s["ledger_last_over_step5"] == pytest.approx(
            steps[-1]["ledger_peak_bytes"] / steps[4]["ledger_peak_bytes"])
    best = report["optimum"]
    assert best["computed_not_run"] is True
    per_step = [sum(s["prefill_s"] for s in ran[a]["steps"]) / n for a in ("evict", "noevict")]
    assert best["optimum_s"] == pytest.approx(evict["summary"]["wall_s"]
                                              - (per_step[0] - per_step[1]) * n)
    # noevict's context, and with it the ledger, grows every step; terminal-slot's is bounded
    assert ran["noevict"]["summary"]["ledger_last_over_step5"] > 1.0
    assert ran["terminal-slot"]["summary"]["ledger_last_over_step5"] <= 1.05
    for item in report["targets"]["items"]:
        if item["measured"] is not None:
            ok = {"<=": item["measured"] <= item["target"], ">": item["measured"] > item["target"],
                  ">=": item["measured"] >= item["target"]}[item["op"]]
            assert item["met"] is ok, item
    assert {"overlap_wall_over_bound", "overlap_latency_last_over_evict",
            "concurrent_over_sequential"} <= {i["name"] for i in report["targets"]["items"]}
    for text in ("wall/bound", "crit last/evict", "critical-path latency per step",
                 "optimum of the study (computed from evict and noevict, not run)",
                 "targets (issue 13):"):
        assert text in stdout, text


def check_png(path: Path) -> None:
    """A PNG of the bench plot's size: 10 in × (3 panels × 3.4 in) at 100 dpi."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (1000, 1020)


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
    check_analysis(report, res.stdout)
    check_png(tmp_path / "bench.png")  # next to --json by default
    assert report["plot"] == str(tmp_path / "bench.png")


def test_bench_rejects_bad_arguments(forged, capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (the command line itself is run by the other bench tests)."""
    from runtime.cli import build_parser

    def refused(*args: str) -> str:
        capsys.readouterr()
        parsed = build_parser().parse_args(["bench", *args])
        assert parsed.run(parsed) == 2
        return capsys.readouterr().err

    m = forged("qwen35")
    assert "unknown arm" in refused("--model", str(m.model_path), "--mmproj",
                                    str(m.mmproj_path), "--arms", "lru")
    assert "--mmproj" in refused("--model", str(m.model_path))
    assert "--steps" in refused("--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
                                "--steps", "0")


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
    assert report["decode"]["concurrent"]["tokens"] == report["decode"]["sequential"]["tokens"]
    # f16's default shape with the bench's fixed-length answers (no grammar): each
    # generation alone in one-row calls — no pad row, no guess
    seq = report["decode"]["sequential"]
    assert seq["rows"] == seq["calls"] > 0 and seq["pad_rows"] == seq["drafted"] == 0
    conc = {i["name"]: i for i in report["targets"]["items"]}["concurrent_over_sequential"]
    assert conc["met"] is None and "overlap" in conc["note"]  # this run had overlap off
    assert report["plot"] is None  # no arms ran: nothing per arm to draw
    if all(e["status"] == "ok" for e in report["episodes"] + report["sequential_episodes"]):
        assert report["outputs_identical_to_sequential"] is True


def test_bench_decode_rows_reach_the_engine(forged, tmp_path: Path) -> None:
    """--decode-shape lanes --decode-rows 1: one lane, so concurrent episodes' decode rows
    never share a call (and their outputs stay those of the back-to-back run); out of
    1..16 it is refused."""
    m = forged("qwen35")
    out = tmp_path / "lanes.json"
    res = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--steps", "3",
                "--image-tokens", "48", "--decode-tokens", "4", "--episodes", "3",
                "--decode-rows", "1", "--decode-shape", "lanes", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["config"]["decode_rows"] == 1
    assert report["config"]["decode_shape"].startswith("lanes: up to 1 generations")
    assert report["decode"]["concurrent"]["rows_per_call"] == 1
    assert report["outputs_identical_to_sequential"] is True
    bad = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--decode-rows",
                "17")
    assert bad.returncode == 2 and "--decode-rows must be 1..16" in bad.stderr


def test_bench_squeeze_without_and_with_the_replay_rung(forged, tmp_path: Path) -> None:
    """--compare-replay-rung: the concurrent phase twice on one budget, the second with the
    replay rung; the comparison printed and in the JSON, every step's record saying whether
    it was decoded from an approximate state, and no unmarked step differing from the
    sequential (exact) run.  (Whether the rung helps depends on the model: test_replay_rung
    and docs/benchmarks.md.)"""
    m = forged("qwen35")
    out = tmp_path / "rung.json"
    res = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--steps", "4",
                "--image-tokens", "48", "--decode-tokens", "4", "--episodes", "8",
                "--memory-budget", "1.0x", "--compare-replay-rung", "--rung-repeats", "2",
                "--replay-budget", "8", "--json", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "replay rung: steps/s with / without" in res.stdout
    report = json.loads(out.read_text())
    assert report["config"]["compare_replay_rung"] is True
    rung = report["replay_rung"]
    assert rung["without"]["repeats"] == rung["with"]["repeats"] == 2  # A B B A
    assert rung["without"]["steps"] == rung["with"]["steps"] == 64
    assert rung["without"]["wall_s"] == pytest.approx(sum(rung["without"]["wall_s_each"]))
    assert rung["without"]["approximate_steps"] == rung["without"]["replay_rung_recurrent"] == 0
    assert rung["with"]["replay_rung_checkpoints"] + rung["with"]["replay_rung_recurrent"] > 0
    assert rung["unmarked_differences"] == 0 and report["outputs_identical_to_sequential"]
    assert rung["steps_per_s_ratio"] == pytest.approx(
        rung["with"]["steps_per_s"] / rung["without"]["steps_per_s"])
    steps = [st for ep in rung["episodes"] for st in ep["steps"]]
    assert len(steps) == 32 and all({"approximate", "replay_tokens"} <= set(st) for st in steps)
    assert sum(st["approximate"] for st in steps) <= rung["with"]["approximate_steps"]
    refused = bench("--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
                    "--compare-replay-rung")
    assert refused.returncode == 2 and "--episodes" in refused.stderr


def test_arm_names() -> None:
    from runtime.bench.arms import ArmSpec, split_arm
    from runtime.commands.options import bench_agent_defaults

    spec = ArmSpec.parse("tail-replay@5%+overlap")
    assert spec == ArmSpec("tail-replay", True, "5%")
    agent = spec.agent(bench_agent_defaults())
    assert (agent.policy, agent.overlap, agent.replay_budget) == ("tail-replay", True, "5%")
    assert ArmSpec.parse("terminal-slot") == ArmSpec("terminal-slot")
    assert split_arm("noevict-tail@64+overlap") == ("noevict-tail", True)
    for bad, message in (("lru", "unknown arm"), ("terminal-slot@5%", "is exact"),
                         ("tail-replay@", "replay budget"), ("tail-replay@150%", "0..1")):
        with pytest.raises(ValueError, match=message):
            ArmSpec.parse(bad)


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
                "--json", str(out), "--plot", str(tmp_path / "plots" / "overlap.png"))
    assert res.returncode == 0, res.stderr
    check_png(tmp_path / "plots" / "overlap.png")
    assert not (tmp_path / "overlap.png").exists()  # --plot overrides the default place
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
