"""Bounded inputs: every size that reaches llama.cpp or memory is checked before a model
loads, with a message naming what to change; inputs that would load silently wrong (a
projector of another model family) or explode in memory (a decompression bomb) are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bad_images import bomb_png
from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.sizing import context_cost
from cachepolicy.errors import ModelLoadError
from runtime.engine_setup import check_memory
from test_run_command import cache_dir, kvagent_run  # noqa: F401


@pytest.mark.parametrize("fields, message", [
    ({"n_ctx_per_seq": 32_529_920}, "n_ctx_per_seq must be an integer in 2..1048576"),
    ({"n_ctx_per_seq": 0}, "n_ctx_per_seq"),
    ({"n_seq_max": 65_536}, "n_seq_max must be an integer in 1..256"),
    ({"n_batch": 1}, "n_batch must be an integer in 2..8192"),
    ({"n_batch": 100_000}, "n_batch"),
    ({"n_threads": 100_000}, "n_threads must be an integer in 1..256"),
    ({"n_threads": 0}, "n_threads"),
    ({"n_ctx_per_seq": 256, "n_batch": 512}, "must be at least n_batch"),
    ({"n_ctx_per_seq": 1.5e6}, "n_ctx_per_seq"),
])
def test_engine_config_bounds(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**fields)


def test_the_largest_context_stays_inside_32_bits() -> None:
    from cachepolicy.engine.records import MAX_N_CTX_PER_SEQ, MAX_N_SEQ

    largest = EngineConfig(n_ctx_per_seq=MAX_N_CTX_PER_SEQ, n_seq_max=MAX_N_SEQ - 16,
                           decode_rows=16)
    assert largest.n_seq_total == MAX_N_SEQ and largest.n_ctx < 2**31
    with pytest.raises(ValueError, match="n_seq_max \\+ decode_rows"):
        EngineConfig(n_ctx_per_seq=MAX_N_CTX_PER_SEQ, n_seq_max=MAX_N_SEQ)  # + 4 lanes


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_context_cost_matches_what_the_engine_measures(forged, arch) -> None:
    """The estimate (GGUF metadata) against llama.cpp's own state size per token: two
    independent counts.  The engine's figure adds a few bytes of cell metadata."""
    m = forged(arch, vision=False)
    config = EngineConfig(n_ctx_per_seq=1024, n_seq_max=2, n_batch=32, n_threads=1)
    cost = context_cost(m.model_path, config)
    # llama.cpp allocates every sequence's cells, the decode lanes' included
    assert config.n_ctx == 1024 * (2 + 4)
    assert cost is not None and cost.kv_bytes == cost.kv_bytes_per_cell * config.n_ctx
    with Engine(m.model_path, None, config) as engine:
        measured = engine.kv_bytes_per_token
    assert cost.kv_bytes_per_cell <= measured <= cost.kv_bytes_per_cell + 64


def test_a_context_that_cannot_fit_in_memory_is_refused(forged) -> None:
    m = forged("qwen35", vision=False)
    config = EngineConfig(n_ctx_per_seq=1 << 20, n_seq_max=65, n_threads=1)
    with pytest.raises(ValueError, match=r"--max-steps size the context to 65 sequence\(s\) "
                                         r"x 1048576 tokens: llama.cpp would allocate about "
                                         r"[\d.]+ GiB .* more than the 1.0 GiB available"):
        check_memory(m.model_path, config, what="--max-steps", available=1 << 30)
    check_memory(m.model_path, EngineConfig(n_ctx_per_seq=4096, n_seq_max=2),
                 what="--max-steps", available=1 << 30)
    assert context_cost(Path("/nonexistent.gguf"), config) is None  # llama.cpp's to refuse


@pytest.mark.parametrize("field, value", [("n_threads", 100_000), ("n_ctx", 1 << 30),
                                          ("n_batch", 1), ("n_batch", 65_536)])
def test_kvagent_config_bounds(field, value) -> None:
    from runtime.osworld import KvAgent

    with pytest.raises(ValueError, match=field):  # before anything is resolved or loaded
        KvAgent(None, None, **{field: value})


def test_a_projector_of_another_family_is_refused(forged) -> None:
    """Same width, so mtmd would load either pairing; the projectors place image tokens
    differently (qwen3vl_merger with M-RoPE, LLaVA's mlp on a line)."""
    qwen, llama = forged("qwen35"), forged("llama")
    config = EngineConfig(n_ctx_per_seq=512, n_seq_max=1, n_batch=32, n_threads=1)
    for model, mmproj, kind in ((qwen.model_path, llama.mmproj_path, "'mlp'"),
                                (llama.model_path, qwen.mmproj_path, "'qwen3vl_merger'")):
        with pytest.raises(ModelLoadError, match=rf"projector type {kind}\) is for another "
                                                 r"model family"):
            Engine(model, mmproj, config)
    Engine(qwen.model_path, qwen.mmproj_path, config).close()  # the right pairs load


@pytest.mark.parametrize("args, message", [
    (("--env-timeout", "0"), "--env-timeout must be in (0, 3600]"),
    (("--vm-seconds", "200"), "would time out every step"),
    (("--max-steps", "1000", "--policy", "noevict", "--screen", "7680x4320"),
     "n_ctx_per_seq must be an integer in 2..1048576"),
])
def test_run_refuses_sizes_before_the_model_loads(cache_dir: Path, tmp_path: Path,
                                                  args, message) -> None:
    out = tmp_path / "results"
    res = kvagent_run(cache_dir, *args, "--threads", "1", "--result-dir", str(out))
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert "params)" not in res.stdout and "Traceback" not in res.stderr
    assert not out.exists()


def test_unwritable_result_dir_is_found_up_front(cache_dir: Path) -> None:
    res = kvagent_run(cache_dir, "--threads", "1", "--result-dir", "/proc/kvagent-results")
    assert res.returncode == 2 and "not writable" in res.stderr
    assert "params)" not in res.stdout and "Traceback" not in res.stderr


def test_a_bomb_in_a_replayed_trajectory_is_an_error_not_a_traceback(cache_dir: Path,
                                                                     tmp_path: Path) -> None:
    traj = tmp_path / "traj"
    traj.mkdir()
    (traj / "step_0.png").write_bytes(bomb_png())
    (traj / "step_1.png").write_bytes(bomb_png())
    (traj / "traj.jsonl").write_text("".join(
        json.dumps({"step_num": i, "action": "WAIT" if i else None,
                    "screenshot_file": f"step_{i}.png"}) + "\n" for i in range(2)))
    res = kvagent_run(cache_dir, "--env", "replay", "--trajectory", str(traj), "--threads",
                      "1", "--result-dir", str(tmp_path / "results"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "14000x14000 pixels is over Pillow's limit" in res.stderr


@pytest.mark.parametrize("command, args, message", [
    ("bench", ("--steps", "1000", "--image-tokens", "16384"), "n_ctx_per_seq must be"),
    ("bench-decode", ("--context", "2000000"), "n_ctx_per_seq must be"),
    ("check-exact", ("--n-batch", "100000"), "--n-batch"),
])
def test_other_commands_refuse_sizes_before_loading(cache_dir: Path, command, args,
                                                    message) -> None:
    import subprocess
    import sys

    from cachepolicy.forge import forge_cached
    from test_run_command import _env

    m = forge_cached("qwen35", "tiny", vision=True, cache_dir=cache_dir)
    files = ("--model", str(m.model_path)) + (
        ("--mmproj", str(m.mmproj_path)) if command == "bench" else ())
    res = subprocess.run([sys.executable, "-m", "runtime.cli", command, *files, *args,
                          "--threads", "1"], capture_output=True, text=True, timeout=120,
                         env=_env(cache_dir), check=False)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr


def test_kvagent_answers_wait_to_a_bomb(forged) -> None:
    """OSWorld's loop hands the agent whatever the VM sent: a decompression bomb is a WAIT
    with the reason, not a DecompressionBombError escaping ``predict``."""
    from runtime.osworld import KvAgent

    m = forged("qwen35")
    agent = KvAgent(m.model_path, m.mmproj_path, n_threads=1, n_ctx=4096, n_batch=64,
                    screen_size=(320, 240))
    try:
        response, actions = agent.predict("open the terminal", {"screenshot": bomb_png()})
        assert actions == ["WAIT"] and "decompression bomb" in response
    finally:
        agent.close()
