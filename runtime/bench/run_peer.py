"""``kvagent bench peer`` (``kvagent bench-peer``): the same OSWorld-style workload against
``kvagent serve`` and against a user-supplied llama.cpp ``llama-server`` — the arms, the
paired rounds, the medians, the ratios and the report (the workload's clients:
``runtime.bench.peer``; the arguments: ``runtime/commands/bench_peer.py``).

The kvagent arm runs ``--kvagent-policy`` when one is given (checked against the model's
files before any server starts: ``policy_problem``); its approximate steps are counted from
the answers and, independently, from the server's ``/metrics`` at the end of each round —
a difference is reported, never hidden.  ``--workload`` picks the forged model when no
``--model`` is given (``WORKLOADS``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs

from cachepolicy.engine.model_facts import read_facts
from cachepolicy.engine.records import DEFAULT_DECODE_ROWS
from runtime.bench.llama_server import llama_server, peak_rss_bytes, server_args
from runtime.bench.peer import Workload, approximate_steps_counted, run_clients, summary
from runtime.bench.serve_process import serve_process
from runtime.bench.trajectory import screenshot
from runtime.config import PolicyChoice
from runtime.engine_setup import BENCH_MODEL, DefaultModel, ModelFiles, resolve_model
from runtime.model_check import policy_fits
from vmenv.trajectory_writer import write_durably

__all__ = ["SINGLE_ARMS", "WORKLOADS", "measure", "model_files", "policy_problem",
           "print_report", "ratios", "run", "run_arm", "table", "workload_model"]

#: ``--workload``: the forged model each names (the first is the default)
WORKLOADS: dict[str, DefaultModel] = {"qwen35-m": BENCH_MODEL,
                                      "llama-m": DefaultModel("llama", "M")}


def workload_model(name: str | None) -> DefaultModel:
    """The forged model of ``--workload name`` (None: the default workload's)."""
    return WORKLOADS[name or next(iter(WORKLOADS))]


def policy_problem(policy: str, model: Path, mmproj: Path) -> str | None:
    """Why ``kvagent serve --policy policy`` cannot run on these files (read without loading
    the weights: the model's layer kind and position rules, as ``kvagent check-model``
    judges every policy), or None."""
    name = PolicyChoice.parse(policy, what="--kvagent-policy").policy
    fit = next(f for f in policy_fits(read_facts(model, mmproj)) if f.name == name)
    return None if fit.applies else f"--kvagent-policy {policy}: {fit.why}"


def model_files(args: argparse.Namespace) -> tuple[str | None, ModelFiles]:
    """The ``--workload`` run (None: the user's ``--model``) and its files, the forged
    model forged on first use."""
    workload = None if args.model is not None else (args.workload or next(iter(WORKLOADS)))
    return workload, resolve_model(args.model, args.mmproj, default=workload_model(workload))


def run(args: argparse.Namespace, parts: list[str], size: tuple[int, int]) -> int:
    """Every arm of ``parts`` on screenshots of ``size``; the report on stdout and in
    ``--json``.  A ``--kvagent-policy`` the model cannot run: exit 2 with the reason, before
    any server starts."""
    workload, files = model_files(args)
    assert files.mmproj is not None  # a vision model: resolved with its projector
    if args.kvagent_policy is not None:
        problem = policy_problem(args.kvagent_policy, files.model, files.mmproj)
        if problem is not None:
            print(f"kvagent bench-peer: error: {problem}", file=sys.stderr)
            return 2
    report = measure(args, parts, size, files.model, files.mmproj, workload=workload)
    print_report(report)
    if args.json_out is not None:
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
    return 0


#: (server, layout) of the single-agent arms
SINGLE_ARMS = (("llama-server", "evict"), ("llama-server", "bounded"), ("kvagent", "evict"))


def _workload(args: argparse.Namespace, layout: str, size: tuple[int, int]) -> Any:
    cache: dict[tuple[int, int], bytes] = {}

    def shot(client: int, step: int) -> bytes:  # every client its own screens, each once
        key = (client, step)
        if key not in cache:
            cache[key] = screenshot(1000 * client + step, *size)
        return cache[key]

    return Workload(layout, args.steps, args.screenshots, args.max_tokens, args.vm_seconds,
                    shot)


def run_arm(args: argparse.Namespace, server: str, layout: str, clients: int,
            size: tuple[int, int], model: Path, mmproj: Path, tmp: Path) -> dict[str, Any]:
    """One arm on a fresh server: every client's steps, the wall time and the peak RSS."""
    w = _workload(args, layout, size)
    label = f"{server}/{layout} x{clients}"
    print(f"[{label}] {args.steps} steps per client, K={args.screenshots}", file=sys.stderr,
          flush=True)
    if server == "llama-server":
        sargs = server_args(model, mmproj, ctx=args.ctx, slots=clients, threads=args.threads)
        with llama_server(args.llama_server, sargs, tmp / "llama-server.log") as peer:
            steps, wall = run_clients(peer.url, "model", w, clients)
            rss = peak_rss_bytes(peer.process.pid)
    else:
        # kvagent's decode settings as a user runs it (like llama-server's): more lanes
        # only when more clients than the default lanes decode at once; or the lanes asked
        rows = args.decode_rows
        if rows is None and clients > DEFAULT_DECODE_ROWS:
            rows = clients
        lanes = ["--decode-rows", str(rows)] if rows is not None else []
        policy = getattr(args, "kvagent_policy", None)
        kargs = ["--model", str(model), "--mmproj", str(mmproj), "--mode", "terminal",
                 "--ctx", str(args.ctx), "--threads", str(args.threads),
                 "--max-episodes", str(clients), *lanes,
                 "--window", str(args.screenshots),
                 "--max-completion-tokens", str(args.max_tokens),
                 *(["--policy", policy] if policy is not None else [])]
        with serve_process(kargs, tmp / "kvagent-serve.log") as served:
            steps, wall = run_clients(
                served.url, served.model, w, clients,
                headers=lambda i: {"X-Kvagent-Conversation": f"peer-{i}"})
            rss = peak_rss_bytes(served.process.pid)
            metrics = _metrics(served.url)
        out = {"server": server, "layout": layout, "clients": clients, "peak_rss_bytes": rss,
               **summary(steps, wall)}
        # the second count of the approximate steps: the server's own, at the round's end
        out["approximate_steps_metrics"] = approximate_steps_counted(metrics)
        answered = out["approximate_steps"] or 0
        out["approximate_counts_agree"] = answered == out["approximate_steps_metrics"]
        if not out["approximate_counts_agree"]:
            print(f"[{label}] approximate steps: the answers marked {answered}, the server's "
                  f"/metrics counted {out['approximate_steps_metrics']}", file=sys.stderr,
                  flush=True)
        out["policy"] = ",".join(sorted({s.policy for s in steps if s.policy})) or None
        return {**out, "per_step": [attrs.asdict(s) for s in steps]}
    return {"server": server, "layout": layout, "clients": clients, "peak_rss_bytes": rss,
            **summary(steps, wall), "per_step": [attrs.asdict(s) for s in steps]}


def _metrics(url: str) -> str:
    """The server's ``GET /metrics`` text."""
    import httpx  # the HTTP client loads only when a server is asked

    r = httpx.get(f"{url}/metrics", timeout=60)
    r.raise_for_status()
    return r.text


def measure(args: argparse.Namespace, parts: list[str], size: tuple[int, int], model: Path,
            mmproj: Path, *, workload: str | None = None) -> dict[str, Any]:
    """Every arm of the asked parts, ``--rounds`` times (the order reversed every other
    round); per arm the medians over rounds.  ``workload``: the ``--workload`` the model
    was forged for (None: the user's files)."""
    arms: list[tuple[str, str, int]] = []
    if "single" in parts:
        arms += [(s, layout, 1) for s, layout in SINGLE_ARMS]
    if "concurrent" in parts:
        arms += [("llama-server", "evict", args.clients), ("kvagent", "evict", args.clients)]
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="kvagent-bench-peer-") as tmp:
        for rnd in range(args.rounds):
            for server, layout, n in (arms if rnd % 2 == 0 else list(reversed(arms))):
                key = f"{server}/{layout} x{n}"
                runs.setdefault(key, []).append(
                    run_arm(args, server, layout, n, size, model, mmproj, Path(tmp)))
    return {"config": {"model": str(model), "mmproj": str(mmproj), "screen": list(size),
                       "steps": args.steps, "screenshots": args.screenshots,
                       "vm_seconds": args.vm_seconds, "max_tokens": args.max_tokens,
                       "clients": args.clients, "rounds": args.rounds,
                       "threads": args.threads, "ctx": args.ctx,
                       "decode_rows": args.decode_rows,
                       "llama_server": str(args.llama_server), "workload": workload,
                       "kvagent_policy": getattr(args, "kvagent_policy", None)},
            "arms": {k: _median_of(v) for k, v in runs.items()}, "runs": runs}


_NUMERIC = ("steps_per_s", "latency_p50_s", "latency_p95_s", "prefilled_per_step",
            "reused_per_step", "critical_prefilled_per_step", "completion_tokens_per_step",
            "peak_rss_bytes", "wall_s")


def _median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: rounds[0][k] for k in ("server", "layout", "clients")}
    for k in _NUMERIC:
        vals = [r[k] for r in rounds if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    out["rounds"] = len(rounds)
    if rounds[0]["server"] == "kvagent":  # what answered, over all its rounds (not medians)
        out["policy"] = rounds[0].get("policy")
        out["steps_all_rounds"] = sum(r["steps"] for r in rounds)
        out["approximate_steps"] = sum(r.get("approximate_steps") or 0 for r in rounds)
        out["approximate_steps_metrics"] = sum(r.get("approximate_steps_metrics") or 0
                                               for r in rounds)
        out["approximate_counts_agree"] = all(r.get("approximate_counts_agree", True)
                                              for r in rounds)
    return out


def ratios(report: dict[str, Any]) -> dict[str, float]:
    """The comparisons the issue asks for, from the medians (per-round pairs would need
    the same rounds on both sides; they are in ``runs``)."""
    a = report["arms"]
    out: dict[str, float] = {}
    kv, best = a.get("kvagent/evict x1"), a.get("llama-server/bounded x1")
    if kv and best:
        out["single_latency_p50_kvagent_over_llama_bounded"] = (kv["latency_p50_s"]
                                                                / best["latency_p50_s"])
    ev = a.get("llama-server/evict x1")
    if kv and ev:
        out["single_latency_p50_kvagent_over_llama_evict"] = (kv["latency_p50_s"]
                                                              / ev["latency_p50_s"])
    n = report["config"]["clients"]
    kn, ln = a.get(f"kvagent/evict x{n}"), a.get(f"llama-server/evict x{n}")
    if kn and ln:
        out["concurrent_steps_per_s_kvagent_over_llama"] = (kn["steps_per_s"]
                                                            / ln["steps_per_s"])
        if kn["peak_rss_bytes"] and ln["peak_rss_bytes"]:
            out["concurrent_peak_rss_kvagent_over_llama"] = (kn["peak_rss_bytes"]
                                                             / ln["peak_rss_bytes"])
    return out


def table(report: dict[str, Any]) -> str:
    lines = ["| server | layout | clients | steps/s | latency p50 s | p95 s | peak RSS MiB | "
             "prefilled / step | reused / step | critical-path prefilled / step | answer "
             "tokens |", "|" + "---|" * 11]
    policy = report["config"].get("kvagent_policy")
    for s in report["arms"].values():
        rss = f"{s['peak_rss_bytes'] / 2**20:.0f}" if s["peak_rss_bytes"] else "-"
        crit = (f"{s['critical_prefilled_per_step']:.0f}"
                if s["critical_prefilled_per_step"] is not None else "-")
        lines.append(f"| {_server_label(s, policy)} | {s['layout']} | {s['clients']} | "
                     f"{s['steps_per_s']:.3f} | {s['latency_p50_s']:.3f} | "
                     f"{s['latency_p95_s']:.3f} | {rss} | {s['prefilled_per_step']:.0f} | "
                     f"{s['reused_per_step']:.0f} | {crit} | "
                     f"{s['completion_tokens_per_step']:.1f} |")
    return "\n".join(lines)


def _server_label(arm: dict[str, Any], policy: str | None) -> str:
    """The table's server column: kvagent's names the policy it was asked to run and, when
    any of its steps were approximate, says how many (and whether the server's count
    agreed); without one, the policy its answers named (the server's default: chrono-slot
    for the chat API's terminal mode)."""
    if arm["server"] != "kvagent":
        return arm["server"]
    if policy is None:
        return f"kvagent ({arm['policy']})" if arm.get("policy") else arm["server"]
    label = f"kvagent --policy {policy}"
    n = arm.get("approximate_steps") or 0
    if n:
        label += f", approximate: {n} of {arm['steps_all_rounds']} steps"
    if not arm.get("approximate_counts_agree", True):
        label += (f" (the server counted {arm['approximate_steps_metrics']}: the counts "
                  f"disagree)")
    return label


def print_report(report: dict[str, Any]) -> None:
    c = report["config"]
    print(f"{c['steps']} steps per client, K={c['screenshots']} screenshots of "
          f"{c['screen'][0]}x{c['screen'][1]}, {c['vm_seconds']} s of VM time, "
          f"{c['max_tokens']} answer tokens, {c['threads']} thread(s), kvagent decode "
          f"lanes {c['decode_rows'] or 'default'}, medians of "
          f"{c['rounds']} paired rounds")
    model = f"workload {c['workload']}" if c.get("workload") else c["model"]
    print(f"model: {model}; kvagent serve --policy "
          f"{c.get('kvagent_policy') or 'default (exact)'}")
    print(table(report))
    for name, value in ratios(report).items():
        print(f"{name}: {value:.2f}")
