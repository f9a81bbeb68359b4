"""``kvagent bench-peer``: argument handling, the layouts it sends, and kvagent's side of the
workload (llama-server's side needs the user's binary: not run here)."""

from __future__ import annotations

import argparse
import stat
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from runtime.bench.chat_layout import bounded_messages, history_line, sliding_window_messages
from runtime.bench.peer import PeerStep, parse_answer, percentile, summary
from runtime.cli import main
from runtime.bench import run_peer


@attrs.frozen
class Ran:
    returncode: int
    stderr: str


def kvagent(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """``kvagent bench-peer ARGS`` in this process (argparse's refusals exit with 2)."""
    capsys.readouterr()
    try:
        code = main(["bench-peer", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return Ran(code, capsys.readouterr().err)


def test_arguments_are_checked_before_anything_starts(tmp_path: Path, capsys) -> None:
    missing = kvagent(capsys, "--llama-server", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    plain = tmp_path / "llama-server"
    plain.write_text("#!/bin/sh\n")
    not_exec = kvagent(capsys, "--llama-server", str(plain))
    assert not_exec.returncode == 2 and "not executable" in not_exec.stderr
    plain.chmod(plain.stat().st_mode | stat.S_IXUSR)
    for extra, culprit in ((["--parts", "both"], "--parts"), (["--steps", "1"], "--steps"),
                           (["--clients", "0"], "--clients"), (["--screen", "big"], "--screen"),
                           (["--model", str(plain)], "--mmproj"),
                           (["--vm-seconds", "-1"], "--vm-seconds"),
                           (["--decode-rows", "0"], "--decode-rows")):
        res = kvagent(capsys, "--llama-server", str(plain), *extra)
        assert res.returncode == 2 and culprit in res.stderr, (extra, res.stderr)
    # the command line itself, once: no binary named
    no_binary = subprocess.run([sys.executable, "-m", "runtime.cli", "bench-peer"],
                               capture_output=True, text=True, timeout=120, check=False)
    assert no_binary.returncode == 2 and "--llama-server" in no_binary.stderr


def test_the_bounded_layout_appends_history_lines_and_moves_the_window() -> None:
    shots = [bytes([i]) * 8 for i in range(5)]
    answers = ["click(1, 2)", "wait()", "type('x')", "press('enter')"]
    m = bounded_messages("sys", "task", shots, answers, window=3)
    assert [x["role"] for x in m] == ["system", "user"] + ["user"] * 4 + ["user"]
    assert [x["content"] for x in m[2:6]] == [history_line(i, a) for i, a in enumerate(answers)]
    assert len(m[-1]["content"]) == 3  # the last three screenshots
    # the next request extends this one up to the window: a prefix cache reuses the history
    nxt = bounded_messages("sys", "task", shots + [b"z"], answers + ["wait()"], window=3)
    assert nxt[:6] == m[:6]
    # OSWorld's layout moves the window through the whole prompt instead
    ev = sliding_window_messages("sys", "task", shots, answers, kept_answers=2)
    ev_next = sliding_window_messages("sys", "task", shots + [b"z"], answers + ["wait()"],
                                      kept_answers=2)
    assert ev[1] != ev_next[1]
    with pytest.raises(ValueError):
        bounded_messages("sys", "task", shots, answers[:2], window=3)


def test_either_servers_counts_are_read() -> None:
    llama = {"choices": [{"message": {"content": "a"}}], "usage": {"completion_tokens": 3},
             "timings": {"prompt_n": 700, "cache_n": 80}}
    kv = {"choices": [{"message": {"content": "b"}}], "usage": {"completion_tokens": 4},
          "kvagent": {"prefill_tokens": 1900, "reused_tokens": 90,
                      "critical_path_prefill_tokens": 640}}
    assert parse_answer(llama, 0, 1, 0.5) == ("a", PeerStep(0, 1, 0.5, 700, 80, 3))
    assert parse_answer(kv, 1, 2, 0.3) == ("b", PeerStep(1, 2, 0.3, 1900, 90, 4, 640))
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert percentile([1.0, 2.0], 0.95) == pytest.approx(1.95)
    s = summary([PeerStep(0, t, 1.0 + t, 10, 5, 2) for t in range(4)], 8.0)
    assert s["steps_per_s"] == 0.5 and s["latency_p50_s"] == 3.0  # step 0 left out


def test_kvagent_side_of_the_workload(forged, tmp_path: Path) -> None:
    """kvagent serve in terminal mode answers OSWorld-layout requests from two clients at
    once; every step is recorded with the server's own counts."""
    m = forged("qwen35")
    args = argparse.Namespace(steps=4, screenshots=2, max_tokens=4, vm_seconds=0.05, ctx=4096,
                              threads=1, llama_server=None, decode_rows=1)
    out = run_peer.run_arm(args, "kvagent", "evict", 2, (96, 64), m.model_path,
                           m.mmproj_path, tmp_path)
    # --decode-rows reached the server: one lane, the generations take turns
    shape = next(line for line in (tmp_path / "kvagent-serve.log").read_text().splitlines()
                 if "engine_decode_shape" in line)
    assert "up to 1 generations" in shape, shape
    assert out["server"] == "kvagent" and out["clients"] == 2 and out["steps"] == 8
    assert out["peak_rss_bytes"] > 0 and out["steps_per_s"] > 0
    steps = out["per_step"]
    assert {s["client"] for s in steps} == {0, 1}
    # once the window is full, the prefetch (during the pause) does part of each step
    late = [s for s in steps if s["step"] >= 2]
    assert all(s["critical_prefilled"] < s["prefilled"] for s in late)
    assert all(s["completion_tokens"] <= 4 for s in steps)
