"""Whether llama.cpp's repacked ("fast") kernels run on this host, asked before they load.

``EngineConfig.fast_kernels`` lets llama.cpp move quantized weights into its extra buffer
types.  On a CPU that advertises AMX the first of those is the AMX buffer, and on some
virtual machines its tile instructions fault (SIGILL inside ``ggml_backend_amx_mul_mat``:
seen on a 2-core Xeon VM where short probes of the same instructions pass, so the only
reliable test is the real thing).  A SIGILL kills the process, so the question is put to a
child process first: it loads the model with the extra buffers on and runs one prefill.
Hosts without AMX skip the probe (the other repacked kernels use ordinary vector
instructions the CPU reports); the verdict is kept for the life of the process per model
file.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

#: How long the child may take to load the model and prefill a few rows.
PROBE_TIMEOUT_S = 300.0

_CHILD = r"""
import sys
import llama_cpp
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.n_gpu_layers = 0
mp.use_extra_bufts = True
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), mp)
if not model:
    sys.exit(3)
cp = llama_cpp.llama_context_default_params()
cp.n_ctx = 64
cp.n_batch = cp.n_ubatch = 32
cp.n_threads = cp.n_threads_batch = 2
cp.no_perf = True
ctx = llama_cpp.llama_init_from_model(model, cp)
if not ctx:
    sys.exit(3)
vocab = llama_cpp.llama_model_get_vocab(model)
n = 32
tokens = (llama_cpp.llama_token * n)(*[i % llama_cpp.llama_vocab_n_tokens(vocab)
                                      for i in range(n)])
batch = llama_cpp.llama_batch_get_one(tokens, n)
sys.exit(0 if llama_cpp.llama_decode(ctx, batch) == 0 else 4)
"""


def cpu_advertises_amx() -> bool:
    """True if /proc/cpuinfo lists an AMX feature (the only extra buffer that needs a probe)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_" in line for line in f)
    except OSError:
        return False


@functools.cache
def fast_kernels_problem(model_path: Path) -> str | None:
    """None if ``model_path`` runs with llama.cpp's extra buffer types on this host, else why
    not (a sentence for an error message)."""
    if not cpu_advertises_amx():
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(model_path)],
                              capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return (f"a probe of the repacked kernels did not finish in {PROBE_TIMEOUT_S:g} s "
                "on this host")
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return (f"llama.cpp's repacked (AMX) kernels crash on this host (signal "
                f"{-done.returncode} in a probe: the CPU advertises AMX but its tile "
                "instructions fault here, as on some virtual machines)")
    return f"a probe of the repacked kernels failed (exit status {done.returncode})"
