"""The workload of ``kvagent bench-peer``: OSWorld-style chat clients against an
OpenAI-compatible server — kvagent's or llama.cpp's — and what they measured.

A client runs one episode: step t sends the chat request of its layout (``chat_layout``:
OSWorld's Qwen3-VL sliding window, or the bounded layout), greedy, ``max_tokens``; the
answer the server gave goes into the next requests' history (as OSWorld's agent sends back
what the model said); then it pauses ``vm_seconds`` where the VM would execute the action.
The request's round trip is the step's critical path as the agent sees it (a server that
prefetches does so during the pause).  Every client has its own screenshots
(``trajectory.screenshot`` with its own offset), the same for every server.

What a step prefilled and reused comes from the server's own account: llama-server's
``timings`` (``prompt_n`` tokens processed, ``cache_n`` taken from its cache), kvagent's
``kvagent`` fields (``prefill_tokens`` — critical path and prefetch — and ``reused_tokens``).
kvagent's answers also name the cache policy that answered and whether the answer came from
an approximate state (``policy``, ``approximate``); the server counts the same steps in
``/metrics`` (``kvagent_steps_approximate_total``), read by ``approximate_steps_counted`` so
the two counts can be compared.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from runtime.bench.chat_layout import bounded_messages, sliding_window_messages

SYSTEM = ("You are a GUI agent. You are given a task, the recent screenshots and your "
          "previous answers. Answer with the next action.")
INSTRUCTION = "Open the terminal and list the files in the home folder."
LAYOUTS = ("evict", "bounded")


@attrs.frozen
class PeerStep:
    client: int
    step: int
    round_trip_s: float
    prefilled: int  # tokens the server prefilled for this step (prefetch included)
    reused: int  # prompt tokens it took from its cache
    completion_tokens: int
    critical_prefilled: int | None = None  # kvagent: prefilled after the request arrived
    policy: str | None = None  # kvagent: the cache policy that answered
    approximate: bool | None = None  # kvagent: decoded from an approximate state


@attrs.frozen
class Workload:
    layout: str  # evict | bounded
    steps: int
    window: int  # K screenshots per request
    max_tokens: int
    vm_seconds: float
    shots: Callable[[int, int], bytes]  # (client, step) → PNG


def messages(w: Workload, client: int, answers: Sequence[str]) -> list[dict[str, Any]]:
    t = len(answers)
    shots = [w.shots(client, j) for j in range(t + 1)]
    if w.layout == "evict":
        return sliding_window_messages(SYSTEM, INSTRUCTION, shots, answers,
                                       kept_answers=w.window - 1)
    return bounded_messages(SYSTEM, INSTRUCTION, shots, answers, window=w.window)


def parse_answer(body: dict[str, Any], client: int, step: int, round_trip: float,
                 ) -> tuple[str, PeerStep]:
    """The answer and the step's record, from either server's response."""
    answer = body["choices"][0]["message"].get("content") or ""
    completion = int(body.get("usage", {}).get("completion_tokens", 0))
    if "kvagent" in body:
        k = body["kvagent"]
        approximate = k.get("approximate")
        return answer, PeerStep(client, step, round_trip, int(k["prefill_tokens"]),
                                int(k["reused_tokens"]), completion,
                                int(k["critical_path_prefill_tokens"]), k.get("policy"),
                                None if approximate is None else bool(approximate))
    timings = body.get("timings", {})
    return answer, PeerStep(client, step, round_trip, int(timings.get("prompt_n", 0)),
                            int(timings.get("cache_n", 0)), completion)


async def run_client(url: str, model: str, w: Workload, client: int, *,
                     headers: dict[str, str] | None = None) -> list[PeerStep]:
    """One client's episode."""
    import httpx

    answers: list[str] = []
    out: list[PeerStep] = []
    async with httpx.AsyncClient(base_url=url, timeout=900) as c:
        for t in range(w.steps):
            body = {"model": model, "messages": messages(w, client, answers),
                    "max_tokens": w.max_tokens, "temperature": 0}
            t0 = time.perf_counter()
            r = await c.post("/v1/chat/completions", json=body, headers=headers or {})
            round_trip = time.perf_counter() - t0
            r.raise_for_status()
            answer, step = parse_answer(r.json(), client, t, round_trip)
            answers.append(answer)
            out.append(step)
            if t < w.steps - 1:
                await anyio.sleep(w.vm_seconds)
    return out


def run_clients(url: str, model: str, w: Workload, n: int, *,
                headers: Callable[[int], dict[str, str]] | None = None,
                ) -> tuple[list[PeerStep], float]:
    """``n`` clients at once (one task group, blocking until all are done); every step of
    every client, and the wall seconds.  A client's error ends the others and is raised."""
    results: dict[int, list[PeerStep]] = {}

    async def all_clients() -> None:
        async def one(i: int) -> None:
            results[i] = await run_client(url, model, w, i,
                                          headers=headers(i) if headers is not None else None)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i, name=f"peer-client-{i}")

    t0 = time.perf_counter()
    try:
        anyio.run(all_clients)
    except BaseExceptionGroup as group:  # the first client's error, as the caller expects
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from group
    wall = time.perf_counter() - t0
    return [s for i in sorted(results) for s in results[i]], wall


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation between order statistics."""
    v = sorted(values)
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def approximate_steps_counted(metrics: str) -> int:
    """The steps a kvagent server counted as approximate: the sum of the
    ``kvagent_steps_approximate_total`` samples (every API and policy) in its ``/metrics``
    text."""
    prefix = "kvagent_steps_approximate_total{"
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in metrics.splitlines()
               if line.startswith(prefix))


def summary(steps: Sequence[PeerStep], wall_s: float, *, skip: int = 1,
            ) -> dict[str, float | int | None]:
    """Steps per second (every step of every client over the wall time), latency p50 / p95
    and token means over the steps after each client's first ``skip`` (a cold start);
    ``approximate_steps``: how many of all the steps the answers marked approximate (None
    when no answer says: llama-server's)."""
    warm = [s for s in steps if s.step >= skip] or list(steps)
    lat = [s.round_trip_s for s in warm]
    crit = [s.critical_prefilled for s in warm if s.critical_prefilled is not None]
    marked = [s.approximate for s in steps if s.approximate is not None]
    return {"steps": len(steps), "wall_s": wall_s,
            "approximate_steps": sum(marked) if marked else None,
            "steps_per_s": len(steps) / wall_s if wall_s else 0.0,
            "latency_p50_s": percentile(lat, 0.5), "latency_p95_s": percentile(lat, 0.95),
            "prefilled_per_step": statistics.fmean(s.prefilled for s in warm),
            "reused_per_step": statistics.fmean(s.reused for s in warm),
            "critical_prefilled_per_step": statistics.fmean(crit) if crit else None,
            "completion_tokens_per_step": statistics.fmean(s.completion_tokens for s in warm)}
