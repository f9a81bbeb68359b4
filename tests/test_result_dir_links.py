"""A result directory with links planted in it: an episode directory that is a symbolic link
(to ``.``, to a sibling, out of the result dir) is never followed — not for deletion
(``--overwrite``), not for writing, not for "finished" — and an episode counts as finished
only if its ``result.txt`` is a regular file holding a finite number."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runtime.run.recording import RESULT_FILE, EpisodeRecorder, ResultLayout, UnsafePathError
from runtime.run.result_dir import manifest, plan_resume, remove_stale_temporaries
from test_run_command import _env, kvagent_run, cache_dir  # noqa: F401

RUN = manifest(model={"name": "m.gguf", "identity": "abc"}, max_steps=2)
# what `kvagent run --episodes 4` names its episodes (the default eval instances)
CLI_TASKS = ["open-terminal@1-ep0", "type-in-field@9-ep1", "click-ok@24-ep2", "save-note@38-ep3"]
CLI_MODEL = "kvagent-agent-qwen35"


def _finish(layout: ResultLayout, task: str, reward: float = 1.0) -> Path:
    with EpisodeRecorder.create(layout, task) as rec:
        rec.record_step(step_num=1, action="WAIT", response="wait()", reward=0.0, done=False,
                        info={}, screenshot=b"\x89PNG fake", metrics={})
        rec.finish(reward)
    return rec.directory


def _tree(root: Path) -> dict[str, object]:
    """Everything under ``root`` as it is on disk, links as links (never followed)."""
    out: dict[str, object] = {}
    for base, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            p = Path(base) / name
            key = str(p.relative_to(root))
            if p.is_symlink():
                out[key] = ("link", os.readlink(p))
            elif p.is_dir():
                out[key] = "dir"
            else:
                out[key] = p.read_bytes()
    return out


def _domain_with_finished(tmp_path: Path, tasks: list[str], model: str = "m") -> ResultLayout:
    layout = ResultLayout(tmp_path / "results", model, "simdesk")
    plan_resume(layout, RUN, tasks).apply()
    for t in tasks:
        _finish(layout, t)
    return layout


# ------------------------------------------------------------------- episode directory links

@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("target", ["self", "sibling", "outside"])
def test_a_linked_episode_directory_is_refused_and_nothing_changes(
        tmp_path: Path, target: str, overwrite: bool) -> None:
    tasks = ["a-ep0", "b-ep1", "c-ep2"]
    layout = _domain_with_finished(tmp_path, tasks)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "precious").write_text("mine")
    link = layout.domain_dir / "a-ep0"
    for p in link.iterdir():
        p.unlink()
    link.rmdir()
    link.symlink_to({"self": Path("."), "sibling": Path("b-ep1"), "outside": outside}[target])
    before = _tree(tmp_path)
    with pytest.raises(UnsafePathError, match=r"a-ep0.*symbolic link"):
        plan_resume(layout, RUN, ["a-ep0"], overwrite=overwrite).apply()
    with pytest.raises(UnsafePathError, match="symbolic link"):
        EpisodeRecorder.create(layout, "a-ep0")
    assert _tree(tmp_path) == before  # every other episode byte for byte, the link too


def test_a_link_planted_after_the_plan_is_refused_before_anything_is_deleted(
        tmp_path: Path) -> None:
    """The model loads between ``plan_resume`` and ``apply``: the directories are checked
    again, all of them before the first is removed."""
    tasks = ["a-ep0", "b-ep1", "c-ep2"]
    layout = _domain_with_finished(tmp_path, tasks)
    plan = plan_resume(layout, {**RUN, "max_steps": 9}, ["a-ep0", "b-ep1"], overwrite=True)
    victim = layout.domain_dir / "b-ep1"
    for p in victim.iterdir():
        p.unlink()
    victim.rmdir()
    victim.symlink_to(".")
    before = _tree(tmp_path)
    with pytest.raises(UnsafePathError, match="b-ep1.*symbolic link"):
        plan.apply()
    assert _tree(tmp_path) == before  # a-ep0 was not removed either


def test_a_linked_domain_directory_is_refused(tmp_path: Path) -> None:
    layout = _domain_with_finished(tmp_path, ["a-ep0"])
    other = ResultLayout(tmp_path / "results", "m", "linked")
    other.domain_dir.symlink_to("simdesk")  # inside the result dir, but a link
    before = _tree(tmp_path)
    with pytest.raises(UnsafePathError, match="linked.*symbolic link"):
        plan_resume(other, RUN, ["a-ep0"], overwrite=True).apply()
    assert _tree(tmp_path) == before
    assert (layout.domain_dir / "a-ep0" / RESULT_FILE).is_file()


def test_overwrite_still_redoes_real_directories(tmp_path: Path) -> None:
    layout = _domain_with_finished(tmp_path, ["a-ep0", "b-ep1"])
    kept = _tree(layout.domain_dir / "b-ep1")
    plan_resume(layout, {**RUN, "max_steps": 9}, ["a-ep0"], overwrite=True).apply()
    assert not (layout.domain_dir / "a-ep0").exists()
    assert _tree(layout.domain_dir / "b-ep1") == kept


def test_tidying_skips_a_linked_episode_directory(tmp_path: Path) -> None:
    layout = _domain_with_finished(tmp_path, ["b-ep1"])
    (layout.domain_dir / "b-ep1" / ".traj.jsonl.x1.tmp").write_bytes(b"")
    (layout.domain_dir / "a-ep0").symlink_to("b-ep1")
    assert remove_stale_temporaries(layout, ["a-ep0"]) == 0
    assert (layout.domain_dir / "b-ep1" / ".traj.jsonl.x1.tmp").exists()


# -------------------------------------------------------------------------- result.txt

def _plant(directory: Path, kind: str, tmp_path: Path) -> None:
    result = directory / RESULT_FILE
    result.unlink()
    good = tmp_path / "good-result"
    good.write_text("1.0\n")
    if kind == "link":
        result.symlink_to(good)
    elif kind == "dangling":
        result.symlink_to(tmp_path / "nowhere")
    elif kind == "dir":
        result.mkdir()
    elif kind == "fifo":
        os.mkfifo(result)
    elif kind == "huge":
        result.write_bytes(b"1" * 100_000)
    else:
        result.write_bytes(kind.encode())


BAD = ["link", "dangling", "dir", "fifo", "huge", "", "\n", "one", "nan\n", "inf\n", "-inf",
       "1.0\x00", "\xff"]


@pytest.mark.parametrize("kind", BAD)
def test_an_unusable_result_file_leaves_the_episode_unfinished(tmp_path: Path, kind: str,
                                                                capsys) -> None:
    from runtime.run.recording import UnusableResultError, read_result

    layout = _domain_with_finished(tmp_path, ["a-ep0", "b-ep1"])
    _plant(layout.domain_dir / "a-ep0", kind, tmp_path)
    with pytest.raises(UnusableResultError):
        read_result(layout.domain_dir / "a-ep0")
    plan = plan_resume(layout, RUN, ["a-ep0", "b-ep1"])
    assert plan.finished == ("b-ep1",) and plan.run == ("a-ep0",)
    assert plan.restarted == ("a-ep0",)
    assert f"a-ep0: {RESULT_FILE}" in plan.describe() and "unfinished" in plan.describe()
    with EpisodeRecorder.create(layout, "a-ep0") as rec:  # what the rerun does with it
        # a link, FIFO or bad file under our name is removed (as itself), never written through
        assert kind == "dir" or not os.path.lexists(rec.directory / RESULT_FILE)
    assert (tmp_path / "good-result").read_text() == "1.0\n"


@pytest.mark.parametrize(("text", "reward"), [("1.0\n", 1.0), ("0", 0.0), (" 0.25 \n", 0.25),
                                              ("0.6666666666666666\n", 0.6666666666666666)])
def test_a_numeric_result_file_is_finished(tmp_path: Path, text: str, reward: float) -> None:
    from runtime.run.recording import read_result

    layout = _domain_with_finished(tmp_path, ["a-ep0"])
    (layout.domain_dir / "a-ep0" / RESULT_FILE).write_text(text)
    assert read_result(layout.domain_dir / "a-ep0") == reward
    assert plan_resume(layout, RUN, ["a-ep0"]).finished == ("a-ep0",)
    assert read_result(layout.domain_dir / "nothing-here") is None


# -------------------------------------------------------------------------- OSWorld runner

def test_osworld_run_paths_stay_inside_and_skip_only_real_results(tmp_path: Path) -> None:
    from runtime.cluster.osworld_run import OsworldTask, pending, result_dir

    for bad in ("../x", "/abs", "a/b", ".."):
        with pytest.raises(UnsafePathError):
            result_dir(tmp_path, "m", "chrome", bad)
        with pytest.raises(UnsafePathError):
            result_dir(tmp_path, "m", bad, "t1")
    tasks = [OsworldTask("chrome", {"id": t}) for t in ("t1", "t2", "t3")]
    for t in ("t1", "t2"):
        d = result_dir(tmp_path, "m", "chrome", t)
        d.mkdir(parents=True)
        (d / RESULT_FILE).write_text("1.0\n")
    (result_dir(tmp_path, "m", "chrome", "t2") / RESULT_FILE).write_text("oops")
    assert [t.task_id for t in pending(tasks, tmp_path, "m")] == ["t2", "t3"]
    (result_dir(tmp_path, "m", "chrome", "t3")).symlink_to("t1")
    with pytest.raises(UnsafePathError, match="t3.*symbolic link"):
        pending(tasks, tmp_path, "m")


# ----------------------------------------------------------------------------- the CLI

CLI = ("--max-steps", "2", "--screen", "320x240", "--threads", "1", "--vm-seconds", "0")


@pytest.mark.parametrize("target", [".", "type-in-field@9-ep1"])
def test_cli_overwrite_through_a_linked_episode_directory_deletes_nothing(
        cache_dir: Path, tmp_path: Path, target: str) -> None:
    """The reported attack: ``ln -s . DOMAIN/<ep0>`` (or a link to a finished sibling), then
    ``kvagent run --episodes 1 --overwrite``: refused with exit 2 naming the link, before the
    model loads; the domain stays byte for byte."""
    layout = _domain_with_finished(tmp_path, CLI_TASKS, model=CLI_MODEL)
    link = layout.task_dir(CLI_TASKS[0])
    for p in link.iterdir():
        p.unlink()
    link.rmdir()
    link.symlink_to(target)
    before = _tree(tmp_path / "results")
    res = kvagent_run(cache_dir, *CLI, "--episodes", "1", "--overwrite", "--result-dir",
                      str(tmp_path / "results"))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"{link} is a symbolic link" in res.stderr
    assert "params)" not in res.stdout and "--overwrite: redoing" not in res.stdout
    assert _tree(tmp_path / "results") == before


def test_cli_rerun_restarts_an_episode_whose_result_is_a_link_or_not_a_number(
        cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    first = kvagent_run(cache_dir, *CLI, "--episodes", "2", "--result-dir", str(out))
    assert first.returncode in (0, 1), first.stderr  # the manifest and the directories exist
    layout = ResultLayout(out, CLI_MODEL, "simdesk")
    good = tmp_path / "good-result"
    good.write_text("1.0\n")
    a, b = (layout.task_dir(t) for t in CLI_TASKS[:2])
    (a / RESULT_FILE).unlink(missing_ok=True)
    (a / RESULT_FILE).symlink_to(good)
    (b / RESULT_FILE).write_text("garbage\n")
    res = kvagent_run(cache_dir, *CLI, "--episodes", "2", "--result-dir", str(out))
    assert "0 finished episode(s) kept, 2 to run (2 restarted" in res.stdout, res.stdout
    assert f"{CLI_TASKS[0]}: {RESULT_FILE} is a symbolic link" in res.stdout
    assert f"{CLI_TASKS[1]}: {RESULT_FILE} does not hold a number" in res.stdout
    assert good.read_text() == "1.0\n"  # the link's target is never written
    assert not (a / RESULT_FILE).is_symlink()
    assert json.loads((layout.domain_dir / "kvagent_run.json").read_text())["tasks"]
