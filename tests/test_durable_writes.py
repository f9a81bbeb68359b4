"""Atomic writes and appends in a shared result directory never follow a planted link, and
an interrupted write leaves nothing behind a run does not tidy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.run.recording import EpisodeRecorder, ResultLayout
from runtime.run.result_dir import remove_stale_temporaries
from vmenv.trajectory_writer import open_append, write_durably


def test_write_durably_never_writes_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    results = tmp_path / "results"
    results.mkdir()
    # the temporary name the old code used, and the final name, both planted as links
    (results / ".kvagent_run.json.tmp").symlink_to(victim)
    (results / "kvagent_run.json").symlink_to(victim)
    write_durably(results / "kvagent_run.json", b"{}")
    assert victim.read_text() == "precious"
    assert not (results / "kvagent_run.json").is_symlink()
    assert (results / "kvagent_run.json").read_bytes() == b"{}"


def test_a_failed_write_removes_its_temporary_file(tmp_path: Path, monkeypatch) -> None:
    def broken(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        write_durably(tmp_path / "result.txt", b"1.0\n")
    assert list(tmp_path.iterdir()) == []


def test_appends_refuse_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "traj.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        open_append(tmp_path / "traj.jsonl")
    dangling = tmp_path / "metrics.jsonl"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(OSError):
        open_append(dangling)
    assert victim.read_text() == "precious" and not (tmp_path / "would-be-created").exists()


def test_a_recorder_removes_links_under_its_names_and_writes_real_files(tmp_path: Path) -> None:
    layout = ResultLayout(tmp_path / "results", "m", "simdesk")
    task = layout.task_dir("t-ep0")
    task.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("traj.jsonl", "metrics.jsonl", "result.txt", ".result.txt.tmp"):
        (task / name).symlink_to(victim)
    (task / "step_1_x.png").symlink_to(tmp_path / "dangling")
    with EpisodeRecorder.create(layout, "t-ep0") as rec:
        rec.record_step(step_num=1, action="WAIT", response="wait()", reward=0.0, done=False,
                        info={}, screenshot=b"\x89PNG fake", metrics={})
        rec.finish(0.0)
    assert victim.read_text() == "precious"
    assert not any(p.is_symlink() for p in task.iterdir())


def test_stale_temporaries_are_removed_at_the_end_of_a_run(tmp_path: Path) -> None:
    layout = ResultLayout(tmp_path / "results", "m", "simdesk")
    task = layout.task_dir("t-ep0")
    task.mkdir(parents=True)
    (task / ".step_3_x.png.abc123.tmp").write_bytes(b"")
    (layout.domain_dir / ".kvagent_run.json.q1w2e3.tmp").write_bytes(b"")
    (task / "keep.tmp").write_bytes(b"mine")  # not one of ours: no leading dot
    assert remove_stale_temporaries(layout, ["t-ep0"]) == 2
    assert sorted(p.name for p in task.iterdir()) == ["keep.tmp"]
