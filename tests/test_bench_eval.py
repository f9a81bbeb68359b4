"""``kvagent bench-eval``: held-out success per policy and agreement with each policy's
reference, through the shipping loop on the forged (random) models — success is ~0 there,
exactness is not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.bench.evaluate import (
    ArmRun, judge, kind_table, reference_of, step_agreement, success_table, with_references,
)
from runtime.cli import build_parser
from runtime.metrics import EpisodeResult, StepMetrics
from vmenv.simdesk import eval_seeds, is_eval_seed, task_kinds

FAST = ("--max-steps", "2", "--threads", "1", "--screen", "320x240", "--concurrency", "3")


def main(argv: list[str]) -> int:
    """The command as the CLI runs it, without ``runtime.cli.main``'s logging setup (which
    would bind structlog to this test's captured, soon closed, stderr)."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


def _eval(forged: Callable[..., object], arch: str, tmp_path: Path, *args: str,
          capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    m = forged(arch)
    out = tmp_path / f"{arch}.json"
    code = main(["bench-eval", "--model", str(m.model_path),  # type: ignore[attr-defined]
                 "--mmproj", str(m.mmproj_path), *FAST, *args,  # type: ignore[attr-defined]
                 "--json", str(out)])
    printed = capsys.readouterr().out
    return code, json.loads(out.read_text()) if out.exists() else {}, printed


def test_every_policy_on_held_out_instances(forged: Callable[..., object], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, report, printed = _eval(forged, "qwen35", tmp_path, "--instances", "3",
                                  capsys=capsys)
    assert code == 0
    kinds = task_kinds()
    assert report["tasks"] == [f"{kinds[i]}@{s}" for i, s in enumerate(eval_seeds(3))]
    assert all(is_eval_seed(int(t.rpartition("@")[2])) for t in report["tasks"])
    arms = {a["arm"]: a for a in report["arms"]}
    assert set(arms) == {"terminal-scratch", "terminal-slot", "terminal-slot+overlap", "evict",
                         "noevict", "relocate"}
    assert "hybrid" in arms["relocate"]["refused"]  # where the model allows it
    for name in ("terminal-slot", "terminal-slot+overlap"):  # exact: every step agrees
        ag = arms[name]["agreement"]
        assert arms[name]["reference"] == "terminal-scratch" and ag["exact_holds"]
        assert ag["rate"] == 1.0 and ag["compared_steps"] == arms[name]["steps"] > 0
        assert ag["identical_episodes"] == 3
    assert arms["noevict"]["reference"] == "evict" and not arms["noevict"]["exact_expected"]
    for name in ("terminal-scratch", "evict"):
        assert arms[name]["agreement"] is None  # the references
    for a in arms.values():
        if a["refused"]:
            continue
        s = a["success"]
        assert s["n"] == 3 and 0 <= s["ci95_low"] <= s["ci95_high"] <= 1
        assert set(a["success_by_kind"]) == set(kinds[:3])
        for ep, task in zip(a["episodes"], report["tasks"]):
            assert ep["task"] == task and len(ep["actions"]) == ep["steps"] <= 2
            assert ep["success"] == (ep["reward"] >= 1.0)
    assert "task success (95% CI)" in printed and "vs terminal-scratch: exact" in printed
    # OSWorld's rule unless told: named in the report, per arm and above the table
    assert report["config"]["success_rule"] == "osworld"
    assert {a["success_rule"] for a in arms.values()} == {"osworld"}
    assert "task success by OSWorld's rule: ends on done()/fail() or max steps" in printed
    for a in arms.values():
        if not a["refused"]:
            said = [ep["ended_by_done"] for ep in a["episodes"]]
            assert said == [bool(ep["actions"]) and ep["actions"][-1] == "done()"
                            for ep in a["episodes"]]
            assert a["ended_by_done"] == sum(said)
    assert "open-terminal" in printed.split("kind", 2)[-1]  # the per-kind table
    assert report["config"]["clock_step_s"] == 7  # simdesk's moving clock, the default
    cost = arms["terminal-scratch"]["cost"]  # no overlap, so no guess of the next screen
    assert cost["guess_hits"] == cost["guess_misses"] == 0
    cost = arms["terminal-slot+overlap"]["cost"]
    assert cost["guess_hits"] + cost["guess_misses"] <= cost["steps"] - 3  # not at a first step


def test_relocate_is_measured_where_the_model_allows_it(
        forged: Callable[..., object], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, report, printed = _eval(forged, "llama", tmp_path, "--instances", "2",
                                  "--arms", "relocate", "--task", "click-ok",
                                  "--stop-on-success", capsys=capsys)
    assert code == 0
    assert report["tasks"] == [f"click-ok@{s}" for s in eval_seeds(2)]
    assert report["config"]["success_rule"] == "stop-on-success"  # the old rule, asked for
    assert "task success by stop-on-success: also ends when the checker passes" in printed
    arms = {a["arm"]: a for a in report["arms"]}
    assert list(arms) == ["terminal-scratch", "relocate"]  # the reference runs too
    r = arms["relocate"]
    assert r["refused"] is None and r["exact_expected"] is False
    assert r["agreement"]["compared_steps"] >= 2 and r["agreement"]["exact_holds"] is None
    assert r["drift"]["kl_mean"] >= 0 and 0 <= r["drift"]["top1_agreement"] <= 1
    assert "vs terminal-scratch: approximate" in printed


def test_a_pinned_window_refuses_the_arms_that_cannot_lay_it_out(
        forged: Callable[..., object], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--pin-first 1``: the chat layouts' arms are refused with the reason and the others
    run (the engine is sized for those); the report records the pin."""
    code, report, printed = _eval(forged, "qwen35", tmp_path, "--instances", "1",
                                  "--pin-first", "1", "--arms", "terminal-slot,evict,noevict",
                                  capsys=capsys)
    assert code == 0 and report["config"]["agent"]["pinned"] == 1
    arms = {a["arm"]: a for a in report["arms"]}
    for name in ("evict", "noevict"):
        assert "cannot pin" in arms[name]["refused"]
    assert arms["terminal-slot"]["agreement"]["exact_holds"]


def test_tail_replay_at_replay_budgets_against_the_exact_reference(
        forged: Callable[..., object], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The command the trained model's tail-replay numbers come from, on the forged one:
    budgets as arms, judged against terminal-scratch (which runs though not asked for) with
    the success difference, the drift and what each step cost; a budget of the whole prefix
    is the reference itself, step for step, and nothing in it is marked approximate."""
    code, report, printed = _eval(
        forged, "qwen35", tmp_path, "--instances", "2",
        "--arms", "terminal-slot,tail-replay@5%,tail-replay@16,tail-replay@100%",
        "--replay-drift", capsys=capsys)
    assert code == 0
    arms = {a["arm"]: a for a in report["arms"]}
    assert list(arms) == ["terminal-scratch", "terminal-slot", "tail-replay@5%",
                          "tail-replay@16", "tail-replay@100%"]
    for name in ("tail-replay@5%", "tail-replay@16", "tail-replay@100%"):
        a = arms[name]
        assert a["policy"] == "tail-replay" and a["reference"] == "terminal-scratch"
        assert not a["exact_expected"] and a["expectation"] == "approximate"
        assert a["success_vs_reference"]["n"] == 2 and a["drift"]["kl_mean"] >= 0
        assert a["cost"]["checkpoint_bytes_peak"] == 0  # tail-replay holds no checkpoint
        assert a["cost"]["steps"] == a["steps"] > 0
    assert arms["terminal-slot"]["cost"]["checkpoint_bytes_peak"] > 0
    assert arms["terminal-slot"]["cost"]["approximate_steps"] == 0
    short = arms["tail-replay@16"]
    assert short["cost"]["approximate_steps"] > 0 and short["cost"]["replay_tokens_per_step"] > 0
    whole = arms["tail-replay@100%"]
    assert whole["cost"]["approximate_steps"] == 0 and whole["drift"]["kl_max"] == 0.0
    assert whole["agreement"]["identical_episodes"] == 2
    assert "vs terminal-scratch: approximate" in printed and "replayed tok/step" in printed
    assert "0 won / 0 lost" in printed


@pytest.mark.parametrize("args, message", [
    (("--arms", "nope"), "unknown arm"), (("--arms", "terminal-slot@5%"), "is exact"),
    (("--arms", "tail-replay@lots"), "replay budget"),
    (("--replay-budget", "-3"), "--replay-budget"), (("--instances", "0"), "--instances"),
    (("--seeds", "classic"), "sampled"), (("--task", "click-ok@3"), "takes a kind"),
    (("--screen", "10x10"), "--screen"), (("--clock-step", "-1"), "--clock-step")])
def test_bad_arguments(args: tuple[str, ...], message: str,
                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-eval", *args]) == 2
    assert message in capsys.readouterr().err


def _episode(task: str, actions: list[str | None], reward: float = 0.0,
             status: str = "max_steps") -> EpisodeResult:
    steps = tuple(StepMetrics("ep", i, "ok", action=a, parsed=a is not None,
                              output_tokens=(hash(a) % 100,)) for i, a in enumerate(actions))
    return EpisodeResult("ep", task, status, reward, steps)


def test_agreement_stops_at_the_first_difference_and_exactness_can_fail() -> None:
    ref = _episode("click-ok@1", ["click(1, 2)", "click(3, 4)", "type(\"a\")"])
    same = _episode("click-ok@1", ["click(1, 2)", "click(3, 4)", "type(\"a\")"])
    off = _episode("click-ok@1", ["click(1, 2)", "click(9, 9)", "click(3, 4)"])
    assert step_agreement(same, ref) == [True, True, True]
    assert step_agreement(off, ref) == [True, False]  # then the screens differ
    won = _episode("save-note@9", ["click(5, 5)"], reward=1.0, status="done")
    lost = _episode("save-note@9", ["click(6, 6)"])
    runs = [ArmRun("terminal-scratch", None, (ref, won)),
            ArmRun("terminal-slot", None, (off, lost)),
            ArmRun("terminal-slot+overlap", None, (same, won))]
    arms = {a["arm"]: a for a in judge(runs, ["click-ok@1", "save-note@9"], window=3)}
    bad, good = arms["terminal-slot"]["agreement"], arms["terminal-slot+overlap"]["agreement"]
    assert (bad["agreed_steps"], bad["compared_steps"], bad["exact_holds"]) == (1, 3, False)
    assert (good["agreed_steps"], good["compared_steps"], good["exact_holds"]) == (4, 4, True)
    assert arms["terminal-slot"]["success"]["successes"] == 0
    assert arms["terminal-slot+overlap"]["success_by_kind"]["save-note"]["successes"] == 1
    assert "NOT EXACT" in success_table(list(arms.values()))
    assert "save-note" in kind_table(list(arms.values()))


def test_references() -> None:
    assert reference_of("terminal-slot+overlap") == ("terminal-scratch", True)
    assert reference_of("noevict") == ("evict", False)
    assert reference_of("relocate") == ("terminal-scratch", False)
    # the chat API's exact default lays the window out otherwise: judged, not expected equal
    assert reference_of("chrono-slot+overlap") == ("terminal-scratch", False)
    assert with_references(["noevict", "terminal-slot"]) == (
        "evict", "terminal-scratch", "noevict", "terminal-slot")
    assert with_references(["terminal-slot", "terminal-scratch"]) == (
        "terminal-slot", "terminal-scratch")
    assert reference_of("tail-replay@5%+overlap") == ("terminal-scratch", False)
    assert reference_of("noevict-tail@64") == ("noevict", False)
    # a reference's own reference runs too, before it
    assert with_references(["noevict-tail@64"]) == ("evict", "noevict", "noevict-tail@64")
    assert with_references(["tail-replay@5%", "tail-replay@10%"]) == (
        "terminal-scratch", "tail-replay@5%", "tail-replay@10%")
