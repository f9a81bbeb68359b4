"""The cluster's pure parts, without Ray: the placement decision and /metrics summing."""

from __future__ import annotations

import re

import attrs

from runtime.cluster import metrics
from runtime.cluster.placement import HostLoad, placement_order
from runtime.metrics import StepMetrics
from runtime.serve.prometheus import ServeMetrics


def _status(budget: int, held: int, reserved: int, open_: int, slots: int) -> dict:
    return {"ledger": {"budget_bytes": budget, "held_bytes": held, "reserved_bytes": reserved,
                       "peak_bytes": held},
            "episodes": {"open": open_, "max": slots}}


def test_most_free_bytes_first_and_full_hosts_skipped() -> None:
    loads = [HostLoad.from_status("a", _status(100, 60, 0, 1, 4)),   # 40 free
             HostLoad.from_status("b", _status(100, 10, 20, 1, 4)),  # 70 free
             HostLoad.from_status("c", _status(200, 0, 0, 2, 2)),    # 200 free, no sequence
             HostLoad.from_status("d", _status(100, 10, 20, 0, 4))]  # 70 free, fewer open
    assert [x.free_bytes for x in loads] == [40, 70, 200, 70]
    assert placement_order(loads) == ["d", "b", "a"]
    assert placement_order([loads[2]]) == []
    # over-reserved: never negative
    assert HostLoad.from_status("e", _status(100, 90, 30, 0, 1)).free_bytes == 0


def _step(status: str, critical_s: float, tokens: int) -> StepMetrics:
    failed = StepMetrics.failed("ep-1", 0, "x", critical_path_s=critical_s)
    if status == "failed":
        return failed
    return attrs.evolve(failed, status=status, critical_path_prefill_tokens=tokens,
                        decode_tokens=3)


def test_metrics_of_hosts_are_summed() -> None:
    a, b = ServeMetrics(), ServeMetrics()
    a.step("episode", _step("ok", 0.2, 10))
    b.step("episode", _step("ok", 3.0, 7))
    b.step("episode", _step("failed", 0, 0))
    a.response("episode_step", 200)
    b.response("episode_step", 200)
    gauges_a = [("kvagent_ledger_bytes", "h", {"kind": "held"}, 5.0)]
    gauges_b = [("kvagent_ledger_bytes", "h", {"kind": "held"}, 7.0)]
    text = metrics.exposition([(a, gauges_a), (b, gauges_b)], metrics.cluster_gauges(
        {"h0": _status(10, 5, 0, 1, 2), "h1": None}, routed=1, failovers=0, lost=1))
    assert 'kvagent_steps_total{api="episode",status="ok"} 2' in text
    assert 'kvagent_steps_total{api="episode",status="failed"} 1' in text
    assert 'kvagent_prefill_tokens_total{path="critical"} 17' in text
    assert 'kvagent_http_responses_total{route="episode_step",status="200"} 2' in text
    assert 'kvagent_step_latency_seconds_bucket{le="0.25"} 1' in text
    assert 'kvagent_step_latency_seconds_count 2' in text
    assert 'kvagent_ledger_bytes{kind="held"} 12' in text
    assert 'kvagent_cluster_hosts{state="lost"} 1' in text
    # every family's samples are contiguous (Prometheus' text format)
    names = [re.split(r"[{ ]", line)[0] for line in text.splitlines()
             if line and not line.startswith("#")]
    families = [n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
                for n in names]
    seen: list[str] = []
    for f in families:
        if not seen or seen[-1] != f:
            assert f not in seen, f
            seen.append(f)
