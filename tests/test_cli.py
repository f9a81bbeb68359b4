"""The CLI as a user runs it: forge, check-exact (text and --json), demo, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cachepolicy.engine.fast_kernels import fast_kernels_problem


def kvagent(*args: str, env_cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = None
    if env_cache is not None:
        import os
        env = {**os.environ, "KVAGENT_CACHE_DIR": str(env_cache)}
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.parametrize("arch", ["llama", "qwen35", "qwen35moe"])
def test_forge_then_check_exact(tmp_path: Path, arch: str) -> None:
    out = tmp_path / arch
    forged = kvagent("forge", "--arch", arch, "--size", "tiny", "--out", str(out), "--vision")
    assert forged.returncode == 0, forged.stderr
    assert f"wrote {out / 'model.gguf'}" in forged.stdout
    assert f"wrote {out / 'mmproj.gguf'}" in forged.stdout
    text = kvagent("check-exact", "--model", str(out / "model.gguf"),
                   "--mmproj", str(out / "mmproj.gguf"), "--threads", "1", "--n-batch", "64")
    assert text.returncode == 0, text.stdout + text.stderr
    lines = [ln for ln in text.stdout.strip().splitlines() if not ln.startswith("note:")]
    assert lines[-1] == "bitwise: true"
    assert sum("bitwise: true" in line for line in lines[1:-1]) == len(lines) - 2 >= 6
    js = kvagent("check-exact", "--model", str(out / "model.gguf"), "--json", "--threads", "1",
                 "--n-batch", "64")
    assert js.returncode == 0
    report = json.loads(js.stdout)
    assert report["bitwise"] is True
    assert all(set(c) == {"name", "bitwise", "max_abs_diff"} for c in report["checks"])


def test_forge_quantized_then_check_exact_with_and_without_fast_kernels(tmp_path: Path) -> None:
    out = tmp_path / "q"
    forged = kvagent("forge", "--arch", "qwen35", "--size", "XS", "--quant", "q4_k_m",
                     "--out", str(out))
    assert forged.returncode == 0, forged.stderr
    assert "q4_k_m" in forged.stdout
    args = ["check-exact", "--model", str(out / "model.gguf"), "--threads", "1", "--n-batch", "32"]
    exact = kvagent(*args)
    assert exact.returncode == 0 and exact.stdout.strip().endswith("bitwise: true"), exact.stdout
    assert "exact kernels" in exact.stdout
    unavailable = fast_kernels_problem((out / "model.gguf").resolve())
    ran = kvagent(*args, "--fast-kernels", "--json")
    if unavailable is None:
        fast = json.loads(ran.stdout)
        assert fast["bitwise"] is False and fast["fast_kernels"] is True
        assert {c["name"] for c in fast["checks"] if not c["bitwise"]} >= {"split_points"}
    else:  # refused before loading, with the reason, instead of a crash
        assert ran.returncode == 2 and "fast_kernels:" in ran.stdout, ran.stdout + ran.stderr
    refused = kvagent("forge", "--arch", "qwen35", "--size", "tiny", "--quant", "q4_k_m",
                      "--out", str(tmp_path / "t"))
    assert refused.returncode == 2 and "blocks of 256" in refused.stdout


def test_bad_arguments_get_clear_messages(tmp_path: Path) -> None:
    bad_arch = kvagent("forge", "--arch", "gpt5", "--size", "tiny", "--out", str(tmp_path))
    assert bad_arch.returncode == 2 and "invalid choice: 'gpt5'" in bad_arch.stderr
    a_file = tmp_path / "file"
    a_file.write_text("x")
    on_file = kvagent("forge", "--arch", "llama", "--size", "tiny", "--out", str(a_file))
    assert on_file.returncode == 2 and "error" in on_file.stdout
    missing = kvagent("check-exact", "--model", str(tmp_path / "nope.gguf"))
    assert missing.returncode == 2 and "not found" in missing.stdout
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + b"\0" * 64)
    broken = kvagent("check-exact", "--model", str(garbage))
    assert broken.returncode == 2 and "could not load" in broken.stdout


def test_help_lists_every_command() -> None:
    from runtime.cli import COMMANDS
    from runtime.commands.bench import FAMILY

    res = kvagent("--help")
    assert res.returncode == 0, res.stderr
    assert all(name in res.stdout for name in [*COMMANDS, "bench"])
    benches = kvagent("bench", "--help")
    assert benches.returncode == 0, benches.stderr
    assert all(f"    {name}" in benches.stdout for name in FAMILY.names())
    assert "95% CI" in benches.stdout  # a HELP's percent sign is text, not a format


def test_demo_runs_on_the_embedded_tiny_model(tmp_path: Path) -> None:
    result = kvagent("demo", "--threads", "1", env_cache=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "outputs identical token for token: yes" in result.stdout
    assert "partial_only checkpoint" in result.stdout
