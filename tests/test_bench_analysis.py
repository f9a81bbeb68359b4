"""The bench report's arithmetic on synthetic records: the decode fit, the bound, the
study's optimum, latency against evict and the targets (no model needed)."""

from __future__ import annotations

import pytest

from runtime.bench.analysis import analyze
from runtime.bench.bound import study_optimum
from runtime.bench.fit import decode_fit, fit_line
from runtime.bench.targets import targets


def test_fit_recovers_a_known_line() -> None:
    # the study's decode model: 31.3 ms + 4.6e-6 s per context token
    ctx = [1000, 5000, 12000, 20000, 44000]
    steps = [{"context_tokens": c, "decode_tokens": 16, "decode_s": 16 * (0.0313 + 4.6e-6 * c)}
             for c in ctx]
    fit = decode_fit(steps + [{"context_tokens": 9, "decode_tokens": 0, "decode_s": 0.0}])
    assert fit is not None and fit["points"] == 5  # the step that decoded nothing is left out
    assert fit["a_s"] == pytest.approx(0.0313, rel=1e-9)
    assert fit["b_s_per_token"] == pytest.approx(4.6e-6, rel=1e-9)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    assert (fit["context_min"], fit["context_max"]) == (1000, 44000)


def test_fit_r2_of_noisy_points_and_degenerate_cases() -> None:
    xs, ys = [0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0]
    fit = fit_line(xs, ys)
    assert fit is not None
    # by hand: mean x 1.5, mean y 2.5, Sxy 4, Sxx 5 → b 0.8, a 1.3; residuals −0.3, 0.9,
    # −0.9, 0.3 → SSres 1.8 of SStot 5
    assert (fit.a, fit.b) == (pytest.approx(1.3), pytest.approx(0.8))
    assert fit.r2 == pytest.approx(1 - 1.8 / 5)
    flat_x = fit_line([7.0, 7.0], [1.0, 3.0])
    assert flat_x is not None and flat_x.b is None and flat_x.a == 2.0 and flat_x.r2 is None
    flat_y = fit_line([1.0, 2.0], [5.0, 5.0])
    assert flat_y is not None and flat_y.b == 0.0 and flat_y.r2 is None
    assert fit_line([], []) is None


def test_study_optimum_is_its_own_formula() -> None:
    # the issue: the study printed 858.1 s, its formula gives 1818.9 − (131.5 − 62.9) × 9.4
    assert study_optimum(1818.9, 131.5, 62.9, 9.4) == pytest.approx(1174.06)


def _step(i: int, *, new: int, prefill: int, prefill_s: float, encode_s: float,
          decode_s: float, crit: float, vm_s: float = 1.0) -> dict:
    return {"step": i, "new_content_tokens": new, "prefill_tokens": prefill,
            "prefill_s": prefill_s, "encode_s": encode_s, "decode_s": decode_s,
            "decode_tokens": 4, "context_tokens": 100 + 10 * i, "vm_s": vm_s,
            "critical_path_s": crit}


def _arm(name: str, steps: list[dict], wall: float) -> dict:
    return {"arm": name, "refused": None, "steps": steps,
            "summary": {"wall_s": wall, "critical_path_s_last": steps[-1]["critical_path_s"],
                        "critical_path_s_mean": sum(s["critical_path_s"] for s in steps)
                        / len(steps)}}


def test_bound_optimum_and_latency_from_synthetic_arms() -> None:
    # evict: 300 tokens per step in 3 s (10 ms/token); noevict: 100 in 0.5 s (5 ms/token)
    evict = [_step(i, new=100, prefill=300, prefill_s=3.0, encode_s=0.4 + i / 10,
                   decode_s=0.2, crit=4.0 + i) for i in range(3)]
    noevict = [_step(i, new=100, prefill=100, prefill_s=0.5, encode_s=0.3,
                     decode_s=0.3, crit=1.0) for i in range(3)]
    refused = {"arm": "relocate", "refused": "no", "steps": [], "summary": {"refused": "no"}}
    arms = [_arm("evict", evict, 20.0), _arm("noevict", noevict, 8.0), refused]
    blocks = analyze(arms)
    bound = blocks["bound"]
    assert bound["prefill_s_per_token"] == pytest.approx(0.005)
    assert bound["prefill_rate_arm"] == "noevict"
    assert bound["encode_s_steps"] == pytest.approx([0.3, 0.3, 0.3])  # noevict encodes faster
    # per step: encode 0.3 + 100 × 5 ms + the arm's decode; plus 1 s of VM time
    e, n = arms[0]["summary"], arms[1]["summary"]
    assert e["bound_s"] == pytest.approx(3 * (1.0 + 0.3 + 0.5 + 0.2))
    assert n["bound_s"] == pytest.approx(3 * (1.0 + 0.3 + 0.5 + 0.3))
    assert e["wall_over_bound"] == pytest.approx(20.0 / 6.0)
    assert bound["critical_path_steps_s"] == pytest.approx([1.0, 1.0, 1.0])  # evict's
    best = blocks["optimum"]
    assert best["computed_not_run"] is True
    assert best["optimum_s"] == pytest.approx(20.0 - (3.0 - 0.5) * 3)
    assert n["wall_over_optimum"] == pytest.approx(8.0 / 12.5)
    assert n["critical_path_s_over_evict_last"] == pytest.approx(1.0 / 6.0)
    assert e["critical_path_s_over_evict_last"] == 1.0
    assert n["critical_path_s_over_evict_mean"] == pytest.approx(1.0 / 5.0)
    assert "bound_s" not in refused["summary"]
    fit = blocks["decode_fit_all_arms"]
    assert fit["points"] == 6 and fit["context_min"] == 100 and fit["context_max"] == 120


def test_optimum_needs_evict_and_noevict() -> None:
    arms = [_arm("terminal-slot", [_step(0, new=10, prefill=10, prefill_s=0.1, encode_s=0.1,
                                         decode_s=0.1, crit=0.3)], 2.0)]
    blocks = analyze(arms)
    assert blocks["optimum"] is None and arms[0]["summary"]["wall_over_optimum"] is None
    assert arms[0]["summary"]["critical_path_s_over_evict_last"] is None


def test_targets_read_off_a_report() -> None:
    def arm(name: str, **summary: float) -> dict:
        return {"arm": name, "refused": None, "summary": summary}

    report = {
        "config": {"steps": 20, "window": 3, "image_tokens_target": 512, "vm_seconds": 1.5,
                   "episodes": 4, "overlap": True},
        "arms": [arm("terminal-slot+overlap", critical_over_new_content_max=0.98,
                     critical_path_s_over_evict_last=0.55, wall_over_bound=1.02),
                 arm("terminal-slot", ledger_last_over_step5=1.0),
                 arm("noevict", ledger_last_over_step5=1.0)],
        "throughput": {"ratio": 1.94}}
    block = targets(report, default_model=True)
    assert block["scenario_differences"] == []
    met = {t["name"]: t["met"] for t in block["items"]}
    assert met == {"overlap_critical_over_new_content": True,
                   "overlap_latency_last_over_evict": False,
                   "overlap_wall_over_bound": True, "slot_ledger_last_over_step5": True,
                   "noevict_ledger_grows": False, "concurrent_over_sequential": True}
    report["config"].update(steps=8, overlap=False)
    report["arms"] = report["arms"][1:]
    block = targets(report, default_model=False)
    by_name = {t["name"]: t for t in block["items"]}
    assert by_name["overlap_wall_over_bound"]["met"] is None
    assert "terminal-slot+overlap" in by_name["overlap_wall_over_bound"]["note"]
    assert by_name["concurrent_over_sequential"]["met"] is None
    assert len(block["scenario_differences"]) == 2
