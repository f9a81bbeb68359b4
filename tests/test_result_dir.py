"""Result directories across reruns (``runtime.run.result_dir``): resume like OSWorld's runner,
refuse to mix two runs, start fresh on request — unit tests of the decision, then
``kvagent run`` killed with SIGKILL between steps and rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.run.recording import RESULT_FILE, EpisodeRecorder, ResultLayout
from runtime.run.result_dir import (
    MANIFEST_FILE, ResultDirError, check_writable, manifest, plan_resume,
)
from test_run_command import _env, _episode_dirs, _traj, cache_dir, kvagent_run  # noqa: F401

RUN = manifest(model={"name": "m.gguf", "identity": "abc"}, agent={"policy": "terminal-slot"},
               max_steps=4)
TASKS = ["a-ep0", "b-ep1", "c-ep2"]


def _layout(tmp_path: Path) -> ResultLayout:
    return ResultLayout(tmp_path / "results", "model", "simdesk")


def _finish(layout: ResultLayout, task: str, *, done: bool) -> Path:
    with EpisodeRecorder.create(layout, task) as rec:
        rec.record_step(step_num=1, action="WAIT", response="wait()", reward=0.0, done=False,
                        info={}, screenshot=b"\x89PNG fake", metrics={})
        if done:
            rec.finish(1.0)
    return rec.directory


def test_a_fresh_run_writes_its_manifest_and_runs_everything(tmp_path) -> None:
    layout = _layout(tmp_path)
    plan = plan_resume(layout, RUN, TASKS)
    assert plan.run == tuple(TASKS) and not plan.resuming
    assert not layout.result_dir.exists()  # deciding writes nothing
    plan.apply()
    written = json.loads((layout.domain_dir / MANIFEST_FILE).read_text())
    assert written == {"kvagent_manifest": 2, "tasks": {t: RUN for t in TASKS}}


def test_a_rerun_keeps_finished_episodes_and_restarts_the_others(tmp_path) -> None:
    layout = _layout(tmp_path)
    plan_resume(layout, RUN, TASKS).apply()
    finished = _finish(layout, "a-ep0", done=True)
    _finish(layout, "b-ep1", done=False)  # killed (or ended in an error): no result.txt
    before = {p.name: p.read_bytes() for p in finished.iterdir()}
    plan = plan_resume(layout, RUN, TASKS)
    assert plan.finished == ("a-ep0",) and plan.run == ("b-ep1", "c-ep2")
    assert plan.restarted == ("b-ep1",) and "1 finished" in plan.describe()
    plan.apply()
    restarted = EpisodeRecorder.create(layout, "b-ep1")  # what the run does for it
    restarted.close()
    assert not any(restarted.directory.iterdir()) or all(
        p.stat().st_size == 0 for p in restarted.directory.iterdir())  # fresh, empty files
    assert {p.name: p.read_bytes() for p in finished.iterdir()} == before  # untouched


def test_another_configuration_is_refused_and_nothing_is_deleted(tmp_path) -> None:
    layout = _layout(tmp_path)
    plan_resume(layout, RUN, TASKS).apply()
    kept = _finish(layout, "a-ep0", done=True)
    other = {**RUN, "max_steps": 8}
    with pytest.raises(ResultDirError, match=r"a-ep0 \(differs in: max_steps\).*--overwrite"):
        plan_resume(layout, other, TASKS)
    assert (kept / RESULT_FILE).exists()
    plan = plan_resume(layout, other, TASKS, overwrite=True)
    assert plan.run == tuple(TASKS) and (kept / RESULT_FILE).exists()  # not yet applied
    plan.apply()
    assert not kept.exists()
    assert json.loads((layout.domain_dir / MANIFEST_FILE).read_text())["tasks"] == {
        t: other for t in TASKS}


def test_overwrite_redoes_exactly_this_invocations_tasks(tmp_path) -> None:
    """Two invocations on one domain: a rerun of one task with --overwrite keeps every other
    finished episode byte for byte, and their manifest entries."""
    layout = _layout(tmp_path)
    plan_resume(layout, RUN, TASKS).apply()
    dirs = {t: _finish(layout, t, done=True) for t in TASKS}
    before = {t: {p.name: p.read_bytes() for p in d.iterdir()} for t, d in dirs.items()}
    other = {**RUN, "agent": {"policy": "evict"}}
    plan = plan_resume(layout, other, ["b-ep1"], overwrite=True)
    assert "1 episode(s)" in plan.describe() and "2 other episode(s) kept" in plan.describe()
    plan.apply()
    assert not dirs["b-ep1"].exists()
    for t in ("a-ep0", "c-ep2"):
        assert {p.name: p.read_bytes() for p in dirs[t].iterdir()} == before[t]
    entries = json.loads((layout.domain_dir / MANIFEST_FILE).read_text())["tasks"]
    assert entries == {"a-ep0": RUN, "b-ep1": other, "c-ep2": RUN}
    # the kept episodes still resume under their own configuration, the redone one under its
    assert plan_resume(layout, RUN, ["a-ep0", "c-ep2"]).finished == ("a-ep0", "c-ep2")
    with pytest.raises(ResultDirError, match="b-ep1"):
        plan_resume(layout, RUN, TASKS)


def test_a_version_1_manifest_stands_for_every_episode_present(tmp_path) -> None:
    layout = _layout(tmp_path)
    _finish(layout, "a-ep0", done=True)
    (layout.domain_dir / MANIFEST_FILE).write_text(json.dumps({"kvagent_manifest": 1, **RUN}))
    assert plan_resume(layout, RUN, TASKS).finished == ("a-ep0",)
    with pytest.raises(ResultDirError, match="differs in: max_steps"):
        plan_resume(layout, {**RUN, "max_steps": 9}, TASKS)


def test_results_without_a_manifest_are_refused(tmp_path) -> None:
    layout = _layout(tmp_path)
    _finish(layout, "foreign-task", done=True)  # e.g. written by OSWorld's own runner
    with pytest.raises(ResultDirError, match="without a kvagent manifest"):
        plan_resume(layout, RUN, TASKS)
    (layout.domain_dir / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ResultDirError, match="unreadable"):
        plan_resume(layout, RUN, TASKS)


def test_check_writable_creates_nothing(tmp_path) -> None:
    target = tmp_path / "new" / "deeper"
    check_writable(target)
    assert not (tmp_path / "new").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ResultDirError, match="not a directory"):
        check_writable(tmp_path / "file" / "results")
    with pytest.raises(ResultDirError, match="not writable"):
        check_writable(Path("/proc/kvagent-results"))


# ----------------------------------------------------------------------------- the CLI

ARGS = ("--episodes", "2", "--max-steps", "4", "--screen", "320x240", "--threads", "1",
        "--seed", "3", "--temperature", "1")


def _responses(out: Path) -> dict[str, list[str]]:
    return {name: [line["response"] for line in _traj(d)]
            for name, d in _episode_dirs(out).items()}


def test_killed_between_steps_then_resumed(cache_dir: Path, tmp_path: Path) -> None:
    """SIGKILL while the episodes are between steps; the rerun (same options) restarts the
    unfinished episodes from clean directories and ends with exactly what an uninterrupted
    run records."""
    out = tmp_path / "results"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "run", *ARGS, "--vm-seconds", "0.5",
         "--result-dir", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=_env(cache_dir))
    try:
        deadline = time.monotonic() + 120
        assert proc.stderr is not None
        for line in proc.stderr:  # plain progress lines: one per event
            if " step 1/4 " in line or time.monotonic() > deadline:
                break
        os.kill(proc.pid, signal.SIGKILL)  # during the next 0.5 s VM wait: between steps
    finally:
        proc.wait(30)
    dirs = _episode_dirs(out)
    assert dirs and any(_traj(d) for d in dirs.values())
    assert not any((d / RESULT_FILE).exists() for d in dirs.values())

    res = kvagent_run(cache_dir, *ARGS, "--vm-seconds", "0.01", "--result-dir", str(out))
    assert res.returncode == 0, res.stderr
    assert "resuming the run" in res.stdout and "0 finished episode(s) kept, 2 to run" in res.stdout
    fresh = tmp_path / "fresh"
    ref = kvagent_run(cache_dir, *ARGS, "--vm-seconds", "0.01", "--result-dir", str(fresh))
    assert ref.returncode == 0, ref.stderr
    assert _responses(out) == _responses(fresh)  # nothing left over from the killed run
    for d in _episode_dirs(out).values():
        traj = _traj(d)
        assert [x["step_num"] for x in traj] == list(range(1, len(traj) + 1))
        assert sorted(p.name for p in d.glob("step_*.png")) == sorted(
            x["screenshot_file"] for x in traj)
        assert len((d / "metrics.jsonl").read_text().splitlines()) == len(traj)
        float((d / RESULT_FILE).read_text())


def test_rerun_keeps_finished_refuses_other_options_and_overwrites(cache_dir: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "results"
    one = ("--max-steps", "2", "--screen", "320x240", "--threads", "1", "--vm-seconds", "0")
    assert kvagent_run(cache_dir, *one, "--episodes", "1", "--result-dir", str(out)).returncode == 0
    (first,) = _episode_dirs(out).values()
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.iterdir()}
    res = kvagent_run(cache_dir, *one, "--episodes", "2", "--result-dir", str(out))
    assert res.returncode == 0 and "1 finished episode(s) kept, 1 to run" in res.stdout
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in first.iterdir()} == before
    assert len(_episode_dirs(out)) == 2
    res = kvagent_run(cache_dir, *one, "--episodes", "2", "--window", "2", "--result-dir",
                      str(out))
    assert res.returncode == 2 and "differs in: agent.window)" in res.stderr
    assert "params)" not in res.stdout  # refused before the model loaded
    assert {p.name: p.read_bytes() for p in first.iterdir()} == {
        k: v[0] for k, v in before.items()}
    second = _episode_dirs(out)["type-in-field@9-ep1"]  # the 2nd eval instance
    kept = {p.name: p.read_bytes() for p in second.iterdir()}
    res = kvagent_run(cache_dir, *one, "--episodes", "1", "--window", "2", "--overwrite",
                      "--result-dir", str(out))
    assert res.returncode == 0 and "--overwrite: redoing 1 episode(s)" in res.stdout
    assert len(_episode_dirs(out)) == 2  # the other episode stays, byte for byte
    assert {p.name: p.read_bytes() for p in second.iterdir()} == kept


def test_a_disk_that_fills_mid_run_then_resumes(cache_dir: Path, tmp_path: Path) -> None:
    """Writes start failing mid-run (RLIMIT_FSIZE: a file may not grow past 3000 bytes, so
    metrics.jsonl fails after a few steps — EFBIG, as a full disk gives ENOSPC): the
    episodes end in errors with the cause, the run says what to do, no traceback; the same
    command without the limit resumes and finishes."""
    resource = pytest.importorskip("resource")
    out = tmp_path / "results"
    argv = [sys.executable, "-m", "runtime.cli", "run", "--episodes", "2", "--max-steps", "4",
            "--screen", "320x240", "--threads", "1", "--vm-seconds", "0", "--result-dir",
            str(out)]

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    full = subprocess.run(argv, capture_output=True, text=True, env=_env(cache_dir),
                          preexec_fn=limited, timeout=300)
    assert full.returncode == 1, full.stderr
    assert "File too large" in full.stdout and "rerunning the same command" in full.stderr
    assert "Traceback" not in full.stderr
    assert not any((d / RESULT_FILE).exists() for d in _episode_dirs(out).values())
    again = subprocess.run(argv, capture_output=True, text=True, env=_env(cache_dir),
                           timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resuming the run" in again.stdout
    assert all((d / RESULT_FILE).is_file() for d in _episode_dirs(out).values())
