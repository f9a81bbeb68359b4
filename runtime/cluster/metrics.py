"""``GET /metrics`` of a cluster: every host's counters summed, plus the cluster's own.

Hosts report their ``ServeMetrics`` and gauges (actor method ``metrics``); the front door
sums counters, histogram buckets and gauges with equal names and labels, so the families
are the ones a single ``kvagent serve`` exposes (a dashboard works against either).  The
per-host view (ledger bytes and open episodes by ``host``) and the front door's counts
(hosts by state, episodes routed, failovers) are ``kvagent_cluster_*`` families.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from runtime.serve.prometheus import ServeMetrics

Gauge = tuple[str, str, Mapping[str, str], float]


def merge(parts: Iterable[ServeMetrics]) -> ServeMetrics:
    """The sum of several hosts' counters (a new record)."""
    out = ServeMetrics()
    for m in parts:
        out.steps.update(m.steps)
        out.approximate.update(m.approximate)
        out.tokens.update(m.tokens)
        out.responses.update(m.responses)
        out.latency_buckets = [a + b for a, b in zip(out.latency_buckets, m.latency_buckets)]
        out.latency_count += m.latency_count
        out.latency_sum += m.latency_sum
    return out


def summed_gauges(per_host: Iterable[Sequence[Gauge]]) -> list[Gauge]:
    """Gauges with equal name and labels summed over hosts (first-seen order kept).  A summed
    ``peak`` is the sum of the hosts' peaks: an upper bound of the cluster's, not a peak."""
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], list] = {}
    for gauges in per_host:
        for name, help_, labels, value in gauges:
            key = (name, tuple(sorted(labels.items())))
            if key in totals:
                totals[key][3] += value
            else:
                totals[key] = [name, help_, dict(labels), value]
    return [(n, h, labels, v) for n, h, labels, v in totals.values()]


def cluster_gauges(hosts: Mapping[str, Mapping | None], *, routed: int,
                   failovers: int, lost: int) -> list[Gauge]:
    """The front door's own view: ``hosts`` maps a host's name to its status (None: lost)."""
    out: list[Gauge] = []
    alive = sum(1 for s in hosts.values() if s is not None)
    out.append(("kvagent_cluster_hosts", "Model hosts by state.", {"state": "alive"}, alive))
    out.append(("kvagent_cluster_hosts", "Model hosts by state.", {"state": "lost"}, lost))
    out.append(("kvagent_cluster_episodes_routed", "Episodes the front door keeps a host for.",
                {}, routed))
    out.append(("kvagent_cluster_failovers", "Episodes rebuilt on another host after theirs "
                "was lost (since start).", {}, failovers))
    live = sorted((name, status) for name, status in hosts.items() if status is not None)
    for name, status in live:  # a family's samples stay together (the text format's rule)
        for kind in ("budget", "held", "reserved", "peak"):
            out.append(("kvagent_cluster_host_ledger_bytes", "Each host's memory ledger.",
                        {"host": name, "kind": kind}, status["ledger"][f"{kind}_bytes"]))
    for name, status in live:
        out.append(("kvagent_cluster_host_episodes_open", "Each host's open episodes.",
                    {"host": name}, status["episodes"]["open"]))
    return out


def exposition(parts: Sequence[tuple[ServeMetrics, Sequence[Gauge]]],
               cluster: Sequence[Gauge]) -> str:
    """The Prometheus text of the whole cluster."""
    merged = merge(m for m, _ in parts)
    return merged.exposition([*summed_gauges(g for _, g in parts), *cluster])
