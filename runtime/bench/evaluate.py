"""``kvagent bench-eval``: held-out task success per cache policy, through the loop that ships.

N simdesk instances on evaluation seeds (``runtime.run.instances``: instance i of kind i mod
8, the i-th evaluation seed) run under every arm — a policy, optionally ``+overlap`` — each
instance as an ordinary ``run_agents`` episode on a real ``SimDesk`` with its checker, the
agent's own actions executed (no teacher forcing), decoded as ``kvagent run`` decodes
(greedy under the profile's grammar unless told otherwise).

Per arm: task success (the env's checker passed on the episode's final state; 95 % Wilson
interval) overall and per kind, counted by OSWorld's rule unless told otherwise (an episode
ends on the agent's done() / fail() or at max_steps; ``stop_on_success``: also the moment the
checker passes — ``runtime.run.success``, named in every entry as ``success_rule``), how many
episodes the agent ended with done(), and per step whether the action equals its reference arm's on the same instance:

* ``terminal-scratch`` is the reference of the terminal layout (``terminal-slot``, and
  ``relocate``, whose drift the executor measures against it too); ``evict`` of the
  interleaved one (``noevict``); ``P+overlap`` has ``P``'s reference;
* steps are compared while the two episodes have agreed so far — after the first different
  action the screens differ, so later steps are not comparable and are not counted;
* exact arms (``terminal-slot`` ± overlap against ``terminal-scratch``, and every
  ``P+overlap`` against ``P``'s reference when ``P`` is one) must agree on every step;
  ``noevict`` shows the same screenshots as ``evict`` only while an episode is within its
  first K steps (it keeps every screenshot), so it is compared but not expected to agree;
  ``relocate`` is approximate;
* the tail-replay arms are approximate, each against the exact policy of its own layout:
  ``tail-replay`` against ``terminal-scratch``, ``noevict-tail`` against ``noevict``,
  ``faithful-tail`` against ``faithful``; ``P@B`` runs ``P`` with replay budget ``B``
  (``tail-replay@5%``, ``tail-replay@64``), so one run compares budgets.

Per arm beside success: the difference in success from its reference on the same instances
(points, with a 95 % interval for paired outcomes: ``runtime.run.success``), and what its
steps cost — prefill and replayed tokens, critical-path seconds, checkpoint bytes, steps
decoded from an approximate state, and the drift (next-token KL, top-1 agreement against
the exact prompt) where ``--replay-drift`` (or relocate) measured it.

Arms a model cannot run (relocate on a hybrid, the tail-replay policies on an attention-only
model) are reported as refused.  A reference arm not asked for runs anyway (it is what the
others are judged by), and so does its own reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from cachepolicy.engine import Engine
from cachepolicy.errors import PolicyRefusedError
from runtime.bench.arms import ArmSpec, split_arm
from runtime.bench.text_grid import grid
from runtime.config import AgentConfig
from runtime.metrics import EpisodeResult
from runtime.run.agents import EpisodeEvent, RunConfig, run_agents, simdesk_specs
from runtime.run.instances import kind_of
from runtime.run.success import (
    OSWORLD_RULE, PairedDifference, SuccessRate, ended_by_done, rule_label, succeeded,
    success_rule,
)
from vmenv.simdesk.render import SECONDS_PER_STEP

#: The arms evaluated when none are given (relocate is refused on hybrid models).
DEFAULT_ARMS = ("terminal-scratch", "terminal-slot", "terminal-slot+overlap", "evict",
                "noevict", "relocate")
TERMINAL_REFERENCE, INTERLEAVED_REFERENCE = "terminal-scratch", "evict"
#: policy → (its reference policy, whether it must give the reference's actions, what to
#: expect when it need not)
RELATIONS: dict[str, tuple[str, bool, str]] = {
    "terminal-scratch": (TERMINAL_REFERENCE, True, ""),
    "terminal-slot": (TERMINAL_REFERENCE, True, ""),
    # exact on its own layout — the window in the client's order, each screenshot followed
    # by its answer's line — which is neither the terminal nor the interleaved one
    "chrono-slot": (TERMINAL_REFERENCE, False, "another layout (the window in time order)"),
    "relocate": (TERMINAL_REFERENCE, False, "approximate"),
    "evict": (INTERLEAVED_REFERENCE, True, ""),
    "noevict": (INTERLEAVED_REFERENCE, False, "same screenshots only within K steps"),
    "tail-replay": (TERMINAL_REFERENCE, False, "approximate"),
    "noevict-tail": ("noevict", False, "approximate"),
    "faithful-tail": ("faithful", False, "approximate"),
    "kamera": (TERMINAL_REFERENCE, False, "approximate"),
    "random-evict": (TERMINAL_REFERENCE, False, "approximate"),
    "recency-evict": (TERMINAL_REFERENCE, False, "approximate"),
}
_UNKNOWN = (TERMINAL_REFERENCE, False, "not declared")


def reference_of(arm: str) -> tuple[str, bool]:
    """(the reference arm, whether ``arm`` must agree with it on every step).  A policy
    this module does not know is compared with the terminal reference, not expected exact."""
    ref, exact, _ = RELATIONS.get(split_arm(arm)[0], _UNKNOWN)
    return ref, exact


def with_references(arms: Sequence[str]) -> tuple[str, ...]:
    """``arms`` in order, after the reference arms they need and lack, and the references of
    those (each arm once, a reference before the arms judged by it)."""
    missing: list[str] = []
    for arm in arms:
        chain, ref = [], reference_of(arm)[0]
        while ref not in arms and ref not in missing and ref not in chain:
            chain.append(ref)
            ref = reference_of(ref)[0]
        missing += reversed(chain)
    return tuple(dict.fromkeys([*missing, *arms]))


@attrs.frozen
class ArmRun:
    """One arm over every instance (episodes in instance order), or why it was refused."""

    arm: str
    refused: str | None
    episodes: tuple[EpisodeResult, ...] = ()
    wall_s: float = 0.0
    success_rule: str = OSWORLD_RULE  # what ended its episodes (``runtime.run.success``)


def run_arms(engine: Engine, arms: Sequence[str], tasks: Sequence[str], agent: AgentConfig, *,
             max_steps: int, screen: tuple[int, int], vm_seconds: float = 0.0,
             concurrency: int = 4, clock_step_s: int = SECONDS_PER_STEP,
             stop_on_success: bool = False,
             on_event: Callable[[str, EpisodeEvent], None] | None = None) -> list[ArmRun]:
    """Every arm over every task (blocking: runs its own event loop); ``concurrency``
    episodes at once through one scheduler (the engine needs ``concurrency + 1``
    sequences: relocate's drift is measured on the last); simdesk's clock advances
    ``clock_step_s`` a step; ``stop_on_success`` ends an episode when its checker passes
    (default: OSWorld's rule)."""
    async def main() -> list[ArmRun]:
        return [await _run_arm(engine, arm, tasks, agent, max_steps=max_steps, screen=screen,
                               vm_seconds=vm_seconds, concurrency=concurrency,
                               clock_step_s=clock_step_s, stop_on_success=stop_on_success,
                               on_event=on_event)
                for arm in arms]

    return anyio.run(main)


async def _run_arm(engine: Engine, arm: str, tasks: Sequence[str], agent: AgentConfig, *,
                   max_steps: int, screen: tuple[int, int], vm_seconds: float,
                   concurrency: int, clock_step_s: int, stop_on_success: bool,
                   on_event: Callable[[str, EpisodeEvent], None] | None) -> ArmRun:
    try:
        arm_agent = ArmSpec.parse(arm).agent(agent)
    except PolicyRefusedError as exc:
        return ArmRun(arm, str(exc), success_rule=success_rule(stop_on_success))
    config = RunConfig(agent=arm_agent, episodes=len(tasks),
                       tasks=tuple(tasks), max_steps=max_steps, screen=screen,
                       vm_seconds=vm_seconds, clock_step_s=clock_step_s,
                       stop_on_success=stop_on_success)
    specs = simdesk_specs(config)
    episodes: list[EpisodeResult] = []
    wall = 0.0
    for i in range(0, len(specs), concurrency):
        try:
            run = await run_agents(engine, config, None, specs=specs[i: i + concurrency],
                                   on_event=(lambda e: on_event(arm, e)) if on_event else None)
        except PolicyRefusedError as exc:
            return ArmRun(arm, str(exc), success_rule=config.success_rule)
        episodes += run.episodes
        wall += run.wall_s
    return ArmRun(arm, None, tuple(episodes), wall, config.success_rule)


# ---------------------------------------------------------------------------- judging

def step_agreement(episode: EpisodeResult, reference: EpisodeResult) -> list[bool]:
    """Per comparable step, whether ``episode``'s action is ``reference``'s: steps are
    compared up to and including the first disagreement (after it the inputs differ)."""
    out: list[bool] = []
    for mine, ref in zip(episode.steps, reference.steps):
        same = (mine.action == ref.action and mine.status != "failed"
                and ref.status != "failed")
        out.append(same)
        if not same:
            break
    return out


def _agreement(pairs: Sequence[tuple[EpisodeResult, EpisodeResult]], exact: bool,
               window: int) -> tuple[dict[str, Any], list[list[bool]]]:
    """The agreement summary of (episode, reference episode) pairs, and each pair's steps."""
    per = [step_agreement(e, f) for e, f in pairs]
    flat = [a for ag in per for a in ag]
    within = [a for ag in per for a in ag[:window]]
    same_length = all(e.n_steps == f.n_steps for e, f in pairs)
    return {"compared_steps": len(flat), "agreed_steps": sum(flat),
            "rate": sum(flat) / len(flat) if flat else None,
            "within_window_rate": sum(within) / len(within) if within else None,
            "identical_episodes": sum(e.output_sha256 == f.output_sha256
                                      and e.n_steps == f.n_steps for e, f in pairs),
            "exact_holds": all(flat) and same_length if exact else None}, per


def _episode(e: EpisodeResult, agree: list[bool] | None) -> dict[str, Any]:
    return {"episode_id": e.episode_id, "task": e.task, "status": e.status,
            "reward": e.reward, "success": succeeded(e.reward, e.status),
            "ended_by_done": ended_by_done([s.action for s in e.steps]),
            "steps": e.n_steps, "actions": [s.action for s in e.steps],
            "degraded_steps": sum(s.status == "degraded" for s in e.steps),
            "unparsable": e.unparsable, "output_sha256": e.output_sha256,
            "error": e.error or None, "agreement": agree,
            "drift_kl": [s.drift_kl for s in e.steps if s.drift_kl is not None] or None,
            "drift_top1_agree": ([s.drift_top1_agree for s in e.steps
                                  if s.drift_top1_agree is not None] or None)}


def _success(episodes: Sequence[EpisodeResult], kind: str | None = None) -> SuccessRate:
    chosen = [e for e in episodes if kind is None or kind_of(e.task or "") == kind]
    return SuccessRate(sum(succeeded(e.reward, e.status) for e in chosen), len(chosen))


def _cost(episodes: Sequence[EpisodeResult]) -> dict[str, Any]:
    """What an arm's steps cost and how many were decoded from an approximate state."""
    steps = [s for e in episodes for s in e.steps if s.status != "failed"]
    n = len(steps) or 1
    return {"steps": len(steps),
            "prefill_tokens_per_step": sum(s.prefill_tokens for s in steps) / n,
            "critical_path_prefill_tokens_per_step": sum(
                s.critical_path_prefill_tokens for s in steps) / n,
            "replay_tokens_per_step": sum(s.replay_tokens for s in steps) / n,
            "reused_tokens_per_step": sum(s.reused_tokens for s in steps) / n,
            "prefill_s_per_step": sum(s.prefill_s for s in steps) / n,
            "critical_path_s_mean": sum(s.critical_path_s for s in steps) / n,
            # the critical path up to the first decoded token: encoding the screenshot,
            # waiting for the prefetch, prefilling (not --replay-drift's reference prefill,
            # which the step's wall time does include)
            "first_token_s_mean": sum(s.encode_s + s.prefetch_wait_s + s.prefill_s
                                      for s in steps) / n,
            "checkpoint_bytes_peak": max((s.checkpoint_bytes for s in steps), default=0),
            "approximate_steps": sum(s.approximate for s in steps),
            # KV held: the sequence + checkpoints + the screenshot store (mean over steps)
            "kv_bytes_mean": sum(s.kv_bytes for s in steps) / n,
            "held_bytes_mean": sum(s.kv_bytes + s.checkpoint_bytes + s.stored_bytes
                                   for s in steps) / n,
            "stored_bytes_peak": max((s.stored_bytes for s in steps), default=0),
            "store_tokens_per_step": sum(s.store_tokens for s in steps) / n,
            "critical_path_store_tokens_per_step": sum(
                s.critical_store_tokens for s in steps) / n,
            "splice_s_per_step": sum(s.splice_s for s in steps) / n,
            # the unchanged-screenshot guess (``--guess``): steps that took its work / not
            "guess_hits": sum(s.guess == "hit" for s in steps),
            "guess_misses": sum(s.guess == "miss" for s in steps),
            "store_s_per_step": sum(s.store_s for s in steps) / n}


def judge(runs: Sequence[ArmRun], tasks: Sequence[str], window: int) -> list[dict[str, Any]]:
    """Per arm: success overall and per kind, agreement with its reference, every episode."""
    by_arm = {r.arm: r for r in runs}
    kinds = list(dict.fromkeys(kind_of(t) for t in tasks))
    out = []
    for r in runs:
        ref_arm, exact = reference_of(r.arm)
        policy, overlap = split_arm(r.arm)
        entry: dict[str, Any] = {"arm": r.arm, "policy": policy, "overlap": overlap,
                                 "reference": ref_arm, "exact_expected": exact,
                                 "expectation": RELATIONS.get(policy, _UNKNOWN)[2] or "exact",
                                 "refused": r.refused, "success_rule": r.success_rule}
        if r.refused is not None:
            out.append(entry)
            continue
        ref = by_arm.get(ref_arm)
        entry["success"] = _success(r.episodes).as_dict()
        entry["success_by_kind"] = {k: _success(r.episodes, k).as_dict() for k in kinds}
        entry["ended_by_done"] = sum(ended_by_done([s.action for s in e.steps])
                                     for e in r.episodes)
        agrees: list[list[bool] | None] = [None] * len(r.episodes)
        entry["agreement"] = None  # the reference itself (or its reference was refused)
        entry["success_vs_reference"] = None
        if ref is not None and ref.refused is None and ref.arm != r.arm:
            entry["agreement"], per = _agreement(list(zip(r.episodes, ref.episodes)), exact,
                                                 window)
            agrees = list(per)
            entry["success_vs_reference"] = PairedDifference.of(
                [(succeeded(e.reward, e.status), succeeded(f.reward, f.status))
                 for e, f in zip(r.episodes, ref.episodes)]).as_dict()
        entry["cost"] = _cost(r.episodes)
        drifts = [d for e in r.episodes for d in (s.drift_kl for s in e.steps) if d is not None]
        if drifts:
            top1 = [t for e in r.episodes for t in (s.drift_top1_agree for s in e.steps)
                    if t is not None]
            entry["drift"] = {"kl_mean": sum(drifts) / len(drifts), "kl_max": max(drifts),
                              "top1_agreement": sum(top1) / len(top1)}
        entry["steps"] = sum(e.n_steps for e in r.episodes)
        entry["wall_s"] = r.wall_s
        entry["episodes"] = [_episode(e, a) for e, a in zip(r.episodes, agrees)]
        out.append(entry)
    return out


# ---------------------------------------------------------------------------- tables

def _rate(d: dict[str, Any]) -> str:
    return str(SuccessRate(d["successes"], d["n"]))


def success_table(arms: Sequence[dict[str, Any]]) -> str:
    """One row per arm: success (95 % CI, under the rule named above the table), episodes
    the agent ended with done(), agreement with the reference, identical outputs."""
    rules = sorted({a.get("success_rule", OSWORLD_RULE) for a in arms})
    rows = [("arm", "task success (95% CI)", "vs reference (95% CI)", "steps", "done()",
             "agreement with reference", "identical episodes")]
    for a in arms:
        if a["refused"] is not None:
            rows.append((a["arm"], "refused", "", "", "", a["refused"].split(";")[0], ""))
            continue
        ag = a["agreement"]
        n = a["success"]["n"]
        diff = a.get("success_vs_reference")
        delta = "" if diff is None else str(PairedDifference(
            diff["both"], diff["arm_only"], diff["reference_only"], diff["neither"]))
        if ag is None:
            agree, same = "(reference)", ""
        else:
            rate = "n/a" if ag["rate"] is None else f"{100 * ag['rate']:.0f}%"
            verdict = (("exact" if ag["exact_holds"] else "NOT EXACT") if a["exact_expected"]
                       else a["expectation"])
            agree = (f"{ag['agreed_steps']}/{ag['compared_steps']} ({rate}) vs "
                     f"{a['reference']}: {verdict}")
            same = f"{ag['identical_episodes']}/{n}"
        rows.append((a["arm"], _rate(a["success"]), delta, str(a["steps"]),
                     f"{a.get('ended_by_done', 0)}/{n}", agree, same))
    return "task success by " + "; ".join(map(rule_label, rules)) + "\n" + grid(rows)


def cost_table(arms: Sequence[dict[str, Any]]) -> str:
    """One row per arm that ran: what a step cost (means over its steps), the checkpoints it
    held, how many steps were decoded from an approximate state, and the drift if measured."""
    rows = [("arm", "prefill tok/step", "critical-path tok/step", "replayed tok/step",
             "store tok/step (critical)", "first token s", "KV edit ms/step", "held KiB (mean)",
             "checkpoint KiB (peak)", "approximate steps", "KL (mean)", "top-1")]
    for a in arms:
        if a["refused"] is not None:
            continue
        c, d = a["cost"], a.get("drift")
        rows.append((a["arm"], f"{c['prefill_tokens_per_step']:.0f}",
                     f"{c['critical_path_prefill_tokens_per_step']:.0f}",
                     f"{c['replay_tokens_per_step']:.0f}",
                     f"{c.get('store_tokens_per_step', 0):.0f} "
                     f"({c.get('critical_path_store_tokens_per_step', 0):.0f})",
                     f"{c['first_token_s_mean']:.3f}",
                     f"{1000 * c.get('splice_s_per_step', 0):.1f}",
                     f"{c.get('held_bytes_mean', 0) / 1024:.0f}",
                     f"{c['checkpoint_bytes_peak'] / 1024:.0f}",
                     f"{c['approximate_steps']}/{c['steps']}",
                     "" if d is None else f"{d['kl_mean']:.2e}",
                     "" if d is None else f"{100 * d['top1_agreement']:.0f}%"))
    return grid(rows)


def kind_table(arms: Sequence[dict[str, Any]]) -> str:
    """Success per kind (rows) and arm (columns)."""
    ran = [a for a in arms if a["refused"] is None]
    if not ran:
        return ""
    kinds = list(ran[0]["success_by_kind"])
    rows = [("kind", *(a["arm"] for a in ran))]
    for k in kinds:
        rows.append((k, *(f"{a['success_by_kind'][k]['successes']}/"
                          f"{a['success_by_kind'][k]['n']}" for a in ran)))
    return grid(rows)
