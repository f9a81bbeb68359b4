"""The server's counters and the Prometheus text exposition of them (``GET /metrics``).

Counters are plain numbers updated by the event loop (one thread): steps by API and status,
the approximate ones by API and policy, prefill tokens on and off the critical path, reused and decoded tokens, HTTP responses by
route and status, and a histogram of critical-path seconds.  Gauges (open episodes, ledger
bytes, decode calls) are read when scraped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import attrs

from runtime.metrics import StepMetrics

#: Critical-path latency buckets, seconds.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@attrs.define
class ServeMetrics:
    steps: Counter[tuple[str, str]] = attrs.Factory(Counter)  # (api, status)
    #: steps decoded from an approximate state (``StepMetrics.approximate``), by (api, policy)
    approximate: Counter[tuple[str, str]] = attrs.Factory(Counter)
    tokens: Counter[str] = attrs.Factory(Counter)
    responses: Counter[tuple[str, int]] = attrs.Factory(Counter)  # (route, status)
    latency_buckets: list[int] = attrs.Factory(lambda: [0] * len(BUCKETS))
    latency_count: int = 0
    latency_sum: float = 0.0

    def step(self, api: str, m: StepMetrics) -> None:
        self.steps[(api, m.status)] += 1
        if m.approximate:
            self.approximate[(api, m.policy)] += 1
        self.tokens["prefill_critical"] += m.critical_path_prefill_tokens
        self.tokens["prefill_prefetch"] += m.prefetch_prefill_tokens
        self.tokens["reused"] += m.reused_tokens
        self.tokens["decode"] += m.decode_tokens
        if m.status != "failed":
            self.latency_count += 1
            self.latency_sum += m.critical_path_s
            for i, bound in enumerate(BUCKETS):
                if m.critical_path_s <= bound:
                    self.latency_buckets[i] += 1

    def response(self, route: str, status: int) -> None:
        self.responses[(route, status)] += 1

    def exposition(self, gauges: Iterable[tuple[str, str, Mapping[str, str], float]]) -> str:
        """The Prometheus text format; ``gauges``: (name, help, labels, value)."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        family("kvagent_steps_total", "counter", "Agent steps by API and status.")
        for (api, status), n in sorted(self.steps.items()):
            out.append(f"kvagent_steps_total{_labels({'api': api, 'status': status})} {n}")
        family("kvagent_steps_approximate_total", "counter",
               "Agent steps decoded from an approximate state (an approximate --policy or "
               "episode policy), by API and policy; none under an exact policy.")
        for (api, policy), n in sorted(self.approximate.items()):
            out.append(f"kvagent_steps_approximate_total"
                       f"{_labels({'api': api, 'policy': policy})} {n}")
        family("kvagent_prefill_tokens_total", "counter",
               "Tokens prefilled, on the critical path or by the overlapped prefetch.")
        for path in ("critical", "prefetch"):
            out.append(f"kvagent_prefill_tokens_total{_labels({'path': path})} "
                       f"{self.tokens['prefill_' + path]}")
        family("kvagent_reused_tokens_total", "counter", "Prompt tokens taken from the cache.")
        out.append(f"kvagent_reused_tokens_total {self.tokens['reused']}")
        family("kvagent_decode_tokens_total", "counter", "Tokens decoded.")
        out.append(f"kvagent_decode_tokens_total {self.tokens['decode']}")
        family("kvagent_http_responses_total", "counter", "HTTP responses by route and status.")
        for (route, status), n in sorted(self.responses.items()):
            out.append(f"kvagent_http_responses_total"
                       f"{_labels({'route': route, 'status': str(status)})} {n}")
        family("kvagent_step_latency_seconds", "histogram",
               "Critical-path seconds: screenshot in hand to action ready.")
        for bound, n in zip(BUCKETS, self.latency_buckets):
            out.append(f"kvagent_step_latency_seconds_bucket{_labels({'le': f'{bound:g}'})} {n}")
        out.append(f'kvagent_step_latency_seconds_bucket{{le="+Inf"}} {self.latency_count}')
        out.append(f"kvagent_step_latency_seconds_sum {self.latency_sum}")
        out.append(f"kvagent_step_latency_seconds_count {self.latency_count}")
        seen: set[str] = set()
        for name, help_, labels, value in gauges:
            if name not in seen:
                family(name, "gauge", help_)
                seen.add(name)
            out.append(f"{name}{_labels(labels)} {_number(value)}")
        return "\n".join(out) + "\n"


def _number(value: float) -> str:
    """A sample value as Prometheus text: integers exactly (byte counts run past 2^31), other
    numbers in repr's shortest round-trip form."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return repr(float(value))
