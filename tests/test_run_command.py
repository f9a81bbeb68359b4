"""``kvagent run`` end to end as a user runs it (subprocess, forged tiny model), and the
examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from runtime.actions import SPECIAL_ACTIONS

REPO = Path(__file__).resolve().parents[1]
FAST = ("--episodes", "2", "--max-steps", "3", "--screen", "320x240", "--threads", "1",
        "--vm-seconds", "0.01")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kvagent-cache")


def _env(cache_dir: Path) -> dict[str, str]:
    return {**os.environ, "KVAGENT_CACHE_DIR": str(cache_dir)}


def kvagent_run(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "run", *args],
                          capture_output=True, text=True, timeout=300, env=_env(cache_dir),
                          check=False)


def _episode_dirs(result_dir: Path, domain: str = "simdesk",
                  model: str = "kvagent-agent-qwen35") -> dict[str, Path]:
    domain_dir = result_dir / "pyautogui" / "screenshot" / model / domain
    return {d.name: d for d in sorted(domain_dir.iterdir()) if d.is_dir()}


def _traj(d: Path) -> list[dict]:
    return [json.loads(line) for line in (d / "traj.jsonl").read_text().splitlines()]


def test_run_writes_osworld_results_summary_and_plot(cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    res = kvagent_run(cache_dir, *FAST, "--result-dir", str(out))
    assert res.returncode == 0, res.stderr
    # says which model: the shipped trained hybrid, and what it is not
    assert "trained demo agent (hybrid qwen35" in res.stdout and "knows nothing else" in res.stdout
    assert "crit prefill" in res.stdout and "  prefill" in res.stdout  # the table
    assert f"plot: {out / 'kvagent_steps.png'}" in res.stdout
    assert "step 3/3" in res.stderr and "episodes: " in res.stderr  # plain progress lines
    dirs = _episode_dirs(out)
    # sampled instances on the held-out evaluation seeds, episode i of kind i mod 8
    assert list(dirs) == ["open-terminal@1-ep0", "type-in-field@9-ep1"]
    # success counted by OSWorld's rule, named beside the figure and in the manifest; a rerun
    # under the other rule is another run (refused before anything loads)
    assert "task success (OSWorld's rule: ends on done()/fail() or max steps): " in res.stdout
    assert "95% CI" in res.stdout and "ended by the agent's done(): " in res.stdout
    written = json.loads((out / "pyautogui" / "screenshot" / "kvagent-agent-qwen35" / "simdesk"
                          / "kvagent_run.json").read_text())
    assert {m["success_rule"] for m in written["tasks"].values()} == {"osworld"}
    other = kvagent_run(cache_dir, *FAST, "--stop-on-success", "--result-dir", str(out))
    assert other.returncode == 2 and "success_rule" in other.stderr, other.stderr
    for d in dirs.values():
        traj = _traj(d)
        assert 1 <= len(traj) <= 3
        for n, line in enumerate(traj, 1):
            assert set(line) == {"step_num", "action_timestamp", "action", "response", "reward",
                                 "done", "info", "screenshot_file"}
            assert line["step_num"] == n
            assert line["action"] in SPECIAL_ACTIONS or line["action"].startswith("pyautogui.")
            assert line["screenshot_file"] == f"step_{n}_{line['action_timestamp']}.png"
            with Image.open(d / line["screenshot_file"]) as img:
                assert img.size == (320, 240)
        float((d / "result.txt").read_text())
        metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == len(traj)
        for m in metrics:
            assert {"prefill_tokens", "reused_tokens", "critical_path_prefill_tokens",
                    "critical_path_s", "vm_s", "encode_s", "prefetch_s", "status"} <= set(m)
            # the unchanged-screenshot guess's prefill counts too (a trained agent that clicks
            # the same spot again sees the same pixels: the guess hits)
            assert m["prefill_tokens"] == (m["critical_path_prefill_tokens"]
                                           + m["prefetch_prefill_tokens"]
                                           + m["guess_prefill_tokens"])
    with Image.open(out / "kvagent_steps.png") as plot:
        assert plot.format == "PNG" and plot.size[0] > 300


@pytest.mark.parametrize("args, message", [
    (("--episodes", "0"), "--episodes must be 1..64"),
    (("--max-steps", "1000000000"), "--max-steps must be 1..1000"),
    (("--threads", "100000"), "--threads must be 1..256"),
    (("--temperature", "inf"), "--temperature"),
    (("--vm-seconds", "inf"), "--vm-seconds"),
    (("--window", "0"), "--window"),
    (("--screen", "100x50"), "--screen"),
    (("--memory-budget", "lots"), "--memory-budget"),
    (("--model", "m.gguf"), "--mmproj"),
    (("--env", "replay"), "--trajectory"),
    (("--temperature", "-1"), "--temperature"),
    (("--task", "make-coffee"), "unknown task 'make-coffee'"),
    (("--task", "menu-launch", "--seeds", "classic"), "has no fixed layout"),
    (("--task", "menu-launch@3", "--seeds", "train"), "no --seeds with it"),
    (("--seeds", "9-2"), "--seeds '9-2'"),
    (("--env", "replay", "--trajectory", ".", "--seeds", "eval"), "only for --env simdesk"),
    (("--profile", "gpt-4o"), "invalid choice"),
    (("--episodes", "two"), "invalid int"),
    (("--policy", "relocate", "--threads", "1"), "does not support hybrid"),
])
def test_bad_arguments_exit_2_and_write_nothing(cache_dir: Path, tmp_path: Path,
                                                args: tuple[str, ...], message: str) -> None:
    out = tmp_path / "results"
    res = kvagent_run(cache_dir, *args, "--result-dir", str(out))
    assert res.returncode == 2
    assert message in res.stderr
    assert not out.exists()


def test_choices_come_from_the_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """--task from simdesk's kinds (or an instance), --policy from the policy registry (user
    policies too; this test's is registered into a copy of the registry's items, taken out
    again after it, so no later test sees it)."""
    from cachepolicy.policies import POLICIES, names, register
    from cachepolicy.policies.terminal_scratch import TerminalScratchPolicy
    from runtime.cli import build_parser
    from runtime.profiles import names as profile_names
    from vmenv.simdesk import task_kinds

    monkeypatch.setattr(POLICIES, "_items", dict(POLICIES._items))  # noqa: SLF001

    @register
    class Mine(TerminalScratchPolicy):
        name = "mine-for-the-cli-test"

    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]  # noqa: SLF001
    by_dest = {a.dest: a for a in run._actions}  # noqa: SLF001
    for kind in task_kinds():
        assert by_dest["task"].type(kind) == kind and kind in by_dest["task"].help
        assert by_dest["task"].type(f"{kind}@17") == f"{kind}@17"
    for name in names():  # each, and with a budget where it takes one
        assert by_dest["policy"].type(name) == name and name in by_dest["policy"].help
    assert by_dest["policy"].type("tail-replay@10%") == "tail-replay@10%"
    assert "mine-for-the-cli-test" in by_dest["policy"].help
    assert tuple(by_dest["profile"].choices) == profile_names()


def test_run_with_a_profile_speaks_its_format(cache_dir: Path, tmp_path: Path) -> None:
    """--profile qwen3vl: the agent answers in Qwen3-VL tool calls (the grammar's), with the
    profile's window, and every step's metrics say what the parser changed."""
    out = tmp_path / "results"
    res = kvagent_run(cache_dir, "--profile", "qwen3vl", "--episodes", "1", "--max-steps", "3",
                      "--screen", "320x240", "--threads", "1", "--vm-seconds", "0.01",
                      "--temperature", "1", "--result-dir", str(out))
    assert res.returncode == 0, res.stderr
    assert "profile qwen3vl, window 5" in res.stdout
    assert "profile qwen3vl: unlike its training" in res.stdout  # the layout's differences
    (d,) = _episode_dirs(out).values()
    traj = _traj(d)
    metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert traj and all('"name": "computer_use"' in line["response"] for line in traj)
    assert all(isinstance(m["notes"], list) for m in metrics)


def test_a_model_that_does_not_load_exits_2(cache_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    res = kvagent_run(cache_dir, "--model", str(bad), "--mmproj", str(bad), "--threads", "1",
                      "--result-dir", str(tmp_path / "results"))
    assert res.returncode == 2 and "error" in res.stderr
    assert not (tmp_path / "results").exists()


def test_overlap_does_not_change_what_the_agents_say(cache_dir: Path, tmp_path: Path) -> None:
    runs = {}
    for flag in ("--overlap", "--no-overlap"):
        out = tmp_path / flag
        res = kvagent_run(cache_dir, *FAST, "--seed", "7", flag, "--result-dir", str(out))
        assert res.returncode == 0, res.stderr
        runs[flag] = {name: [line["response"] for line in _traj(d)]
                      for name, d in _episode_dirs(out).items()}
    assert runs["--overlap"] == runs["--no-overlap"]
    assert all(runs["--overlap"].values())


def test_replay_env(cache_dir: Path, tmp_path: Path) -> None:
    import anyio

    from vmenv.replay import record_trajectory
    from vmenv.simdesk.env import SimDesk, SimDeskConfig

    async def record() -> None:
        env = SimDesk(SimDeskConfig(width=320, height=240, done_on_success=False))
        await env.reset("save-note")
        await record_trajectory(env, env.solution(), tmp_path / "traj", task="save-note")

    anyio.run(record)
    out = tmp_path / "results"
    res = kvagent_run(cache_dir, "--env", "replay", "--trajectory", str(tmp_path / "traj"),
                      "--episodes", "1", "--threads", "1", "--vm-seconds", "0",
                      "--result-dir", str(out))
    assert res.returncode == 0, res.stderr
    (d,) = _episode_dirs(out, "replay").values()
    assert d.name == "traj-ep0" and 1 <= len(_traj(d)) <= 4


@pytest.mark.parametrize("example", ["run_simdesk.py", "custom_policy.py"])
def test_examples_run(cache_dir: Path, tmp_path: Path, example: str) -> None:
    res = subprocess.run([sys.executable, str(REPO / "examples" / example)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=_env(cache_dir),
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    if example == "custom_policy.py":
        assert "outputs identical token for token: yes" in res.stdout
    else:
        assert "crit prefill" in res.stdout and (tmp_path / "results-example").is_dir()


def _events():
    from runtime.metrics import StepMetrics
    from runtime.run.agents import EpisodeEvent
    from runtime.run.agents import EpisodeSpec

    spec = EpisodeSpec(0, "ep0", "click-ok", "click-ok-ep0", "Click OK.")
    line = "episodes: 1 running, 0 waiting | budget: 120.0 MiB of 2.0 GiB, peak 120.0 MiB | checkpoints: 1"
    metrics = StepMetrics("ep0", 0, "ok", action="click(3, 4)", parsed=True,
                          prefill_tokens=10, reused_tokens=90, critical_path_s=0.25)
    return [EpisodeEvent("start", spec, 8, summary=line),
            EpisodeEvent("step", spec, 8, step=1, metrics=metrics, summary=line),
            EpisodeEvent("end", spec, 8, step=1, status="done", reward=1.0, summary=line)]


def test_progress_plain_lines_without_a_tty() -> None:
    import io

    from runtime.run.progress import ProgressDisplay

    out = io.StringIO()
    show = ProgressDisplay(out, tty=False)
    for e in _events():
        show(e)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\x1b" not in out.getvalue()
    assert lines[1].startswith("ep0 click-ok  step 1/8  click(3, 4)  hit 90%  crit 0.25 s | "
                               "episodes: 1 running")
    assert "click(3, 4)  done reward 1" in lines[2]  # the end line keeps the last action


def test_progress_redraws_in_place_on_a_tty() -> None:
    import io

    from runtime.run.progress import ProgressDisplay

    out = io.StringIO()
    show = ProgressDisplay(out, tty=True)
    for e in _events():
        show(e)
    text = out.getvalue()
    assert text.count("\x1b[2A") == 2  # each redraw moves up over the episode + summary lines
    assert text.count("\x1b[2K") == 6


def test_osworld_runner_example_runs_against_the_fake(cache_dir: Path, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, str(REPO / "examples" / "osworld_runner.py"), "--fake",
                          "--threads", "1", "--max-steps", "3", "--result-dir",
                          str(tmp_path / "res")], cwd=tmp_path, capture_output=True, text=True,
                         timeout=180, env=_env(cache_dir), check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    trajs = list((tmp_path / "res").rglob("traj.jsonl"))
    assert len(trajs) == 2 and all(t.read_text().strip() for t in trajs)
    assert all((t.parent / "result.txt").exists() for t in trajs)


def test_replayed_run_and_the_bench_overlap_arm_are_one_loop(cache_dir: Path,
                                                             tmp_path: Path) -> None:
    """``kvagent run --env replay`` and ``kvagent bench --trajectory`` on one recorded
    trajectory, with the same agent options: token-for-token the same outputs (one code
    path), and every bench arm's critical path holds decoding + encoding the screenshot."""
    import hashlib

    import anyio

    from cachepolicy.forge import forge_cached
    from vmenv.replay import record_trajectory
    from vmenv.simdesk.env import SimDesk, SimDeskConfig

    async def record() -> None:
        env = SimDesk(SimDeskConfig(width=320, height=240, done_on_success=False))
        await env.reset("save-note")
        await record_trajectory(env, env.solution(), tmp_path / "traj", task="save-note")

    anyio.run(record)
    agent = ("--policy", "terminal-slot", "--overlap", "--no-grammar", "--decode-tokens", "4",
             "--no-stop-at-eog", "--temperature", "0", "--window", "2")
    out = tmp_path / "results"
    m = forge_cached("qwen35", "tiny", vision=True, cache_dir=cache_dir)
    res = kvagent_run(cache_dir, "--env", "replay", "--trajectory", str(tmp_path / "traj"),
                      "--episodes", "1", "--threads", "1", "--vm-seconds", "0", *agent,
                      "--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
                      "--result-dir", str(out))
    assert res.returncode == 0, res.stderr
    (d,) = _episode_dirs(out, "replay", model=m.model_path.stem).values()
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    h = hashlib.sha256()
    for row in rows:
        for tok in row["output_tokens"]:
            h.update(int(tok).to_bytes(4, "little"))

    report = tmp_path / "bench.json"
    bench = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "bench", "--model", str(m.model_path),
         "--mmproj", str(m.mmproj_path), "--trajectory", str(tmp_path / "traj"),
         "--threads", "1", "--arms", "terminal-slot+overlap,terminal-scratch",
         "--decode-tokens", "4", "--window", "2", "--json", str(report)],
        capture_output=True, text=True, timeout=300, env=_env(cache_dir), check=False)
    assert bench.returncode == 0, bench.stderr
    arms = {a["arm"]: a for a in json.loads(report.read_text())["arms"]}
    over = arms["terminal-slot+overlap"]
    assert len(over["steps"]) == len(rows) > 1
    assert over["output_sha256"] == h.hexdigest() == arms["terminal-scratch"]["output_sha256"]
    for arm in arms.values():
        for step in arm["steps"]:  # the screenshot is decoded and encoded on the critical path
            assert step["encode_s"] > 0
            assert step["critical_path_s"] >= step["encode_s"] + step["decode_s"]
    for step in arms["terminal-scratch"]["steps"]:  # no prefetch: all prefill is critical
        assert step["critical_path_s"] >= step["encode_s"] + step["prefill_s"] + step["decode_s"]
