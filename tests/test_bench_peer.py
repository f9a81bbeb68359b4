"""``kvagent bench-peer``: argument handling, the layouts it sends, and kvagent's side of the
workload (llama-server's side needs the user's binary: not run here)."""

from __future__ import annotations

import argparse
import json
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
    args = argparse.Namespace(steps=4, screenshots=2, max_tokens=4, vm_seconds=0.2, ctx=4096,
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
    # once the window is full, the prefetch (during the pause) does part of the steps: not
    # necessarily of each — on a loaded machine a pause can end before its prefetch ran
    # (seen twice in ~35 runs beside other work), and then the step does it all
    late = [s for s in steps if s["step"] >= 2]
    assert all(s["critical_prefilled"] <= s["prefilled"] for s in late)
    assert sum(s["critical_prefilled"] for s in late) < sum(s["prefilled"] for s in late)
    assert all(s["completion_tokens"] <= 4 for s in steps)


# ------------------------------------------------- any policy, and an attention model (issue 48)

#: A stand-in for llama-server where the user's binary cannot run here: it answers /health
#: and every chat request with a fixed answer and llama-server's ``timings`` fields, and
#: writes its arguments to ``started`` beside itself (so a test sees whether it ran).
STAND_IN = '''#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

(Path(__file__).parent / "started").write_text(" ".join(sys.argv[1:]))
port = int(sys.argv[sys.argv.index("--port") + 1])

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply({{"status": "ok"}})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply({{"choices": [{{"message": {{"content": "wait()"}}}}],
                    "usage": {{"completion_tokens": 2}},
                    "timings": {{"prompt_n": 100, "cache_n": 10}}}})

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def stand_in(tmp_path: Path) -> Path:
    path = tmp_path / "stand-in" / "llama-server"
    path.parent.mkdir()
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_a_policy_is_checked_before_anything_starts(forged, tmp_path: Path, capsys) -> None:
    """A bad spelling is argparse's refusal (serve --policy's reason); a policy the model
    cannot run (relocate on a hybrid) is refused with the model's reason before either
    server starts; --workload is for the forged models only."""
    binary = stand_in(tmp_path)
    for policy, reason in (("lru", "unknown policy"), ("terminal-slot@5%", "is exact"),
                           ("tail-replay@150%", "0..1")):
        res = kvagent(capsys, "--llama-server", str(binary), "--kvagent-policy", policy)
        assert res.returncode == 2 and "--kvagent-policy" in res.stderr, res.stderr
        assert reason in res.stderr, res.stderr
    res = kvagent(capsys, "--llama-server", str(binary), "--workload", "gpt-m")
    assert res.returncode == 2 and "--workload" in res.stderr
    m = forged("qwen35")
    files = ["--model", str(m.model_path), "--mmproj", str(m.mmproj_path)]
    res = kvagent(capsys, "--llama-server", str(binary), *files, "--workload", "llama-m")
    assert res.returncode == 2 and "--workload" in res.stderr and "--model" in res.stderr
    res = kvagent(capsys, "--llama-server", str(binary), *files, "--kvagent-policy",
                  "relocate", "--json", str(tmp_path / "out.json"))
    assert res.returncode == 2, res.stderr
    assert "--kvagent-policy relocate: not on hybrid models" in res.stderr, res.stderr
    assert not (binary.parent / "started").exists() and not (tmp_path / "out.json").exists()
    # the same model runs an approximate policy it supports (checked the same way)
    assert run_peer.policy_problem("tail-replay@10%", m.model_path, m.mmproj_path) is None


def test_the_llama_workload_forges_the_attention_model_with_its_mlp_projector(
        tmp_path: Path, monkeypatch) -> None:
    from cachepolicy.engine.model_facts import read_facts
    from runtime.commands import bench_peer

    assert tuple(run_peer.WORKLOADS) == bench_peer.WORKLOADS  # the choices are the models
    monkeypatch.setenv("KVAGENT_CACHE_DIR", str(tmp_path / "models"))  # forged here, ~3 s
    args = argparse.Namespace(model=None, mmproj=None, workload="llama-m")
    workload, files = run_peer.model_files(args)
    facts = read_facts(files.model, files.mmproj)
    assert workload == "llama-m" and files.model.parent.name.startswith("llama-M-v")
    assert (facts.arch, facts.kind.value, facts.projector) == ("llama", "attention", "mlp")
    assert facts.pairing_problem is None
    # relocate runs there (an attention model), while the hybrid workload refuses it
    assert run_peer.policy_problem("relocate", files.model, files.mmproj) is None
    assert run_peer.model_files(argparse.Namespace(model=None, mmproj=None, workload=None)
                                )[0] == "qwen35-m"  # the default (its files: qwen35 M)
    assert run_peer.workload_model(None) == run_peer.WORKLOADS["qwen35-m"]
    assert run_peer.model_files(argparse.Namespace(
        model=files.model, mmproj=files.mmproj, workload=None))[0] is None  # the user's


def _report(arm: dict) -> dict:
    return {"config": {"kvagent_policy": "relocate", "clients": 2}, "arms": {"k": arm}}


def test_an_approximate_arm_counts_its_steps_twice(forged, tmp_path: Path, capsys) -> None:
    """``kvagent bench-peer --kvagent-policy relocate`` on the forged llama (the stand-in
    for llama-server beside it): the policy reaches kvagent serve (every answer names it),
    the steps its answers mark approximate equal the server's own /metrics count, and the
    config, the JSON and the table say so."""
    m = forged("llama")
    out = tmp_path / "peer.json"
    res = kvagent(capsys, "--llama-server", str(stand_in(tmp_path)), "--model",
                  str(m.model_path), "--mmproj", str(m.mmproj_path), "--parts", "concurrent",
                  "--clients", "2", "--steps", "4", "--screenshots", "2", "--rounds", "1",
                  "--vm-seconds", "0.05", "--screen", "96x64", "--max-tokens", "4",
                  "--ctx", "4096", "--kvagent-policy", "relocate", "--json", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    assert report["config"]["kvagent_policy"] == "relocate"
    assert report["config"]["workload"] is None  # the user's files
    [kv] = report["runs"]["kvagent/evict x2"]
    steps = kv["per_step"]
    assert {s["policy"] for s in steps} == {"relocate"} and kv["policy"] == "relocate"
    # exact while the window fills, approximate from the first slide on; counted twice
    assert [(s["client"], s["approximate"]) for s in steps] == [
        (c, a) for c in (0, 1) for a in (False, False, True, True)]  # K = 2: slides at step 2
    marked = [s for s in steps if s["approximate"]]
    assert kv["approximate_steps"] == len(marked) == kv["approximate_steps_metrics"]
    assert kv["approximate_counts_agree"]
    arm = report["arms"]["kvagent/evict x2"]
    assert (arm["approximate_steps"], arm["steps_all_rounds"]) == (len(marked), 8)
    # llama-server's answers say nothing of it
    [peer] = report["runs"]["llama-server/evict x2"]
    assert peer["approximate_steps"] is None
    assert {s["approximate"] for s in peer["per_step"]} == {None}
    rows = run_peer.table(report).splitlines()
    assert any(r.startswith(f"| kvagent --policy relocate, approximate: {len(marked)} of 8 "
                            f"steps |") for r in rows), rows
    assert any(r.startswith("| llama-server |") for r in rows)
    # a disagreement between the two counts is said in the row, not hidden
    bad = {**arm, "approximate_steps_metrics": len(marked) + 1,
           "approximate_counts_agree": False}
    assert "the counts disagree" in run_peer.table(_report(bad))
