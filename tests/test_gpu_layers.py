"""The GPU path on a CPU build (issue 49 item 4): ``--gpu-layers`` / ``n_gpu_layers`` reach
the engine through the one engine home; on this build nothing is offloaded, the engine says
so plainly and computes bitwise what an engine without the option computes; device memory is
counted apart from host memory; the row-class cache key names the backend; check-exact names
the backend it checked.  (CI has no GPU: a GPU build's own exactness is what check-exact
reports there, docs/gpu.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from structlog.testing import capture_logs

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine import devices
from cachepolicy.engine.gguf_meta import metadata, tensor_bytes
from cachepolicy.engine.row_probe import cache_key
from cachepolicy.engine.sampling import SamplingParams
from cachepolicy.engine.sizing import context_cost, device_weight_bytes
from runtime.cli import build_parser
from runtime.commands.options import engine_fields, gpu_layers
from runtime.engine_setup import check_memory

GPU_BUILD = bool(llama_cpp.llama_supports_gpu_offload())
cpu_build_only = pytest.mark.skipif(GPU_BUILD, reason="this llama-cpp-python offloads to a GPU")


# ---------------------------------------------------------------------- the option

@pytest.mark.parametrize("command", [["run"], ["serve"], ["bench"]])
@pytest.mark.parametrize("given, layers", [(None, 0), ("99", 99), ("all", -1), ("-1", -1),
                                           ("0", 0), ("ALL", -1)])
def test_gpu_layers_parses_into_the_engine_fields(command, given, layers) -> None:
    argv = [*command, *(["--gpu-layers", given] if given is not None else [])]
    args = build_parser().parse_args(argv)
    fields = engine_fields(args)
    assert fields["n_gpu_layers"] == layers
    assert EngineConfig(**fields).n_gpu_layers == layers


@pytest.mark.parametrize("given", ["-2", "many", "1.5", str(1 << 17)])
def test_a_bad_gpu_layers_names_the_option(given) -> None:
    args = build_parser().parse_args(["run", "--gpu-layers", given])
    with pytest.raises(ValueError, match="--gpu-layers must be a layer count"):
        gpu_layers(args)
    with pytest.raises(ValueError, match="n_gpu_layers must be an integer in -1..65536"):
        EngineConfig(n_gpu_layers=-2)


def test_check_exact_and_kvagent_take_gpu_layers() -> None:
    args = build_parser().parse_args(["check-exact", "--gpu-layers", "all"])
    assert gpu_layers(args) == -1
    from runtime.osworld.agent import KvAgent

    agent = KvAgent(n_gpu_layers=99)  # plans, loads nothing before its first use
    try:
        assert agent.config.engine.n_gpu_layers == 99
    finally:
        agent.close()
    assert KvAgent().config.engine.n_gpu_layers == 0
    with pytest.raises(ValueError, match="n_gpu_layers: with server="):
        KvAgent(server="http://127.0.0.1:9", n_gpu_layers=99)


def test_kvagent_run_reaches_the_engine_config_with_gpu_layers() -> None:
    """``kvagent run``'s own checks fill the engine fields the load uses."""
    from runtime.commands import run

    args = build_parser().parse_args(["run", "--gpu-layers", "7", "--episodes", "1"])
    assert run._check(args) is None
    assert args.engine_fields["n_gpu_layers"] == 7


# ---------------------------------------------------------------------- where layers go

@pytest.mark.parametrize("requested, n_layer, has_device, layers", [
    (0, 32, True, 0), (-1, 32, True, 33), (99, 32, True, 33), (33, 32, True, 33),
    (10, 32, True, 10), (1, 32, True, 1), (99, 32, False, 0), (-1, 32, False, 0),
])
def test_layers_offloaded_is_llama_cpps_arithmetic(requested, n_layer, has_device,
                                                   layers) -> None:
    assert devices.layers_offloaded(requested, n_layer, has_device=has_device) == layers


def test_the_devices_this_build_registers() -> None:
    found = devices.devices()
    assert any(d.kind == "CPU" for d in found)  # the CPU backend is always there
    assert all(d.total_bytes >= d.free_bytes >= 0 for d in found)
    assert bool(devices.model_devices(found)) <= GPU_BUILD


@cpu_build_only
def test_a_cpu_build_offloads_nothing_and_says_so() -> None:
    for requested in (1, 99, -1):
        plan = devices.plan(requested, 4)
        assert (plan.layers, plan.backend, plan.devices) == (0, "CPU", ())
        assert plan.note == devices.NO_GPU_BACKEND
        assert plan.note == ("no layer was offloaded: this llama-cpp-python build has no "
                             "GPU backend")
    assert devices.plan(0, 4).note == ""  # nothing asked, nothing to say


def test_backend_names_and_cache_keys() -> None:
    gpu = devices.Device("CUDA0", "NVIDIA GeForce RTX 4090", "GPU", 20 << 30, 24 << 30)
    full = devices.Offload(requested=-1, layers=33, total_layers=33, devices=(gpu,))
    part = devices.Offload(requested=10, layers=10, total_layers=33, devices=(gpu,))
    cpu = devices.Offload(requested=0, layers=0, total_layers=33)
    assert (cpu.backend, full.backend) == ("CPU", "CUDA0")
    assert part.backend == "CUDA0 (10/33 layers, the rest on CPU)"
    assert len({cpu.cache_key, full.cache_key, part.cache_key}) == 3
    assert "RTX 4090" in full.cache_key
    assert full.describe() == "CUDA0 (33/33 layers on NVIDIA GeForce RTX 4090)"
    # the row classes measured on one backend are never read back on another
    keys = {cache_key("model", fast_kernels=False, lanes=4, backend=o.cache_key)
            for o in (cpu, full, part)}
    assert len(keys) == 3
    assert cache_key("model", fast_kernels=False, lanes=4) == cache_key(
        "model", fast_kernels=False, lanes=4, backend="CPU")


# ---------------------------------------------------------------------- sizing

def test_device_memory_is_counted_apart_from_host_memory(forged) -> None:
    m = forged("llama", vision=False)
    meta = metadata(m.model_path)
    n_layer = int(meta["llama.block_count"])
    config = EngineConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=32, n_threads=1)
    host = context_cost(m.model_path, config)
    assert host is not None and host.device_bytes == 0 and host.host_bytes == host.total_bytes
    every = context_cost(m.model_path, config, offloaded=n_layer + 1)
    assert every is not None and every.total_bytes == host.total_bytes  # moved, not added
    assert every.device_kv_bytes == every.kv_bytes and every.host_bytes == 0
    # the output layer goes first: 1 layer offloaded holds no block's cells
    output_only = context_cost(m.model_path, config, offloaded=1)
    assert output_only is not None and output_only.device_kv_bytes == 0
    two = context_cost(m.model_path, config, offloaded=3)  # output + the last 2 blocks
    assert two is not None and two.device_kv_bytes == 2 * host.kv_bytes // n_layer
    # weights: an independent count from the tensor table — all but the input embedding
    sizes = tensor_bytes(m.model_path)
    assert device_weight_bytes(m.model_path, n_layer + 1) == sum(
        b for name, b in sizes.items() if not name.startswith("token_embd"))
    assert device_weight_bytes(m.model_path, 0) == 0
    last = sum(b for name, b in sizes.items() if name.startswith(f"blk.{n_layer - 1}."))
    assert (device_weight_bytes(m.model_path, 2) - device_weight_bytes(m.model_path, 1)
            == last)


@cpu_build_only
def test_check_memory_on_a_cpu_build_is_the_host_check(forged) -> None:
    """Nothing can be offloaded here: --gpu-layers changes neither the estimate nor the
    message."""
    m = forged("llama", vision=False)
    messages = []
    for layers in (0, 99):
        config = EngineConfig(n_ctx_per_seq=4096, n_seq_max=2, n_batch=32, n_threads=1,
                              n_gpu_layers=layers)
        with pytest.raises(ValueError) as exc:
            check_memory(m.model_path, config, what="--ctx", available=1024)
        messages.append(str(exc.value))
    assert messages[0] == messages[1] and "in host memory" not in messages[0]


# ---------------------------------------------------------------------- the engine

def _run(engine: Engine, prompt: tuple[int, ...]) -> tuple[np.ndarray, list[int]]:
    logits = engine.prefill_tokens(0, prompt)
    assert logits is not None
    try:
        tokens = engine.generate(0, logits, 24, SamplingParams(temperature=1.0, seed=0),
                                 stop_at_eog=False)
    finally:
        engine.clear(0)
    return logits.copy(), tokens


@cpu_build_only
@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_gpu_layers_on_a_cpu_build_loads_says_so_and_is_bitwise_the_cpu_engine(
        forged, arch) -> None:
    m = forged(arch, vision=True)
    base = dict(n_ctx_per_seq=512, n_seq_max=1, n_batch=32, n_threads=1)
    with Engine(m.model_path, m.mmproj_path, EngineConfig(**base)) as plain:
        prompt = plain.tokenize("The agent clicks the terminal icon and types ls -la")
        want = _run(plain, prompt)
        assert plain.offload.requested == 0 and plain.offload.note == ""
    with capture_logs() as logs:
        gpu = Engine(m.model_path, m.mmproj_path, EngineConfig(**base, n_gpu_layers=99))
    with gpu:
        got = _run(gpu, prompt)
        assert gpu.offload.layers == 0 and gpu.offload.backend == "CPU"
        assert gpu.offload.total_layers == llama_cpp.llama_model_n_layer(
            gpu._native.model) + 1
        assert gpu.memory().device_bytes == 0
        assert gpu.has_vision  # the projector loads beside it (its use_gpu off: no layer)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    assert len(set(want[1])) > 1  # sampled: a repeated token would compare nothing
    warned = [e for e in logs if e["event"] == "engine_gpu_unavailable"]
    assert warned == [{"event": "engine_gpu_unavailable", "log_level": "warning",
                       "requested": 99, "message": devices.NO_GPU_BACKEND}]


# ---------------------------------------------------------------------- check-exact

@cpu_build_only
def test_check_exact_names_the_backend_it_checked(forged, tmp_path: Path) -> None:
    m = forged("llama", vision=False)
    env = {**os.environ, "KVAGENT_CACHE_DIR": str(tmp_path)}
    base = [sys.executable, "-m", "runtime.cli", "check-exact", "--model", str(m.model_path),
            "--threads", "1", "--n-batch", "32"]
    js = subprocess.run([*base, "--gpu-layers", "99", "--json"], capture_output=True,
                        text=True, timeout=300, env=env, check=False)
    assert js.returncode == 0, js.stdout + js.stderr
    report = json.loads(js.stdout)
    assert report["bitwise"] is True
    assert report["backend"] == {"backend": "CPU", "requested_layers": 99,
                                 "offloaded_layers": 0,
                                 "total_layers": report["backend"]["total_layers"],
                                 "devices": [], "note": devices.NO_GPU_BACKEND,
                                 "device_bytes": 0}
    assert report["backend"]["total_layers"] == int(
        metadata(m.model_path)["llama.block_count"]) + 1
    # the plain message also reaches the user's terminal (the engine's warning on stderr)
    assert devices.NO_GPU_BACKEND in js.stderr
    text = subprocess.run([*base, "--gpu-layers", "all"], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].endswith("backend CPU") and f"note: {devices.NO_GPU_BACKEND}" in lines
    assert lines[-1] == "bitwise: true"
    assert any(ln.startswith("note: row classes on this model and CPU:") for ln in lines)


def test_the_command_lines_in_docs_gpu_parse() -> None:
    """docs/gpu.md's kvagent lines (synopses with [optional] parts stripped of them)."""
    import re
    import shlex

    text = (Path(__file__).resolve().parent.parent / "docs" / "gpu.md").read_text()
    lines = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("kvagent "):
                lines.append(re.sub(r"\[[^\]]*\]", "", line.split(" #")[0]).strip())
    assert any("--gpu-layers all" in ln for ln in lines)
    assert any(ln.startswith("kvagent check-model") for ln in lines)
    for line in lines:
        build_parser().parse_args(shlex.split(line)[1:])
