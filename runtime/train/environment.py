"""What a trained file's bytes depend on besides the seed, and how ``kvagent train`` holds it.

JAX's CPU backend (XLA) splits a reduction over its intra-op threads, and the split changes
the float sums: the recogniser trained with two XLA threads on this 2-core machine gives a
projector other than the one-thread run (the loss differs by update 250; the held-out lookup
ends 0.825 against 0.833), while one core and one XLA thread give the same bytes as each
other.  So ``kvagent train`` runs XLA on one intra-op thread unless the user set
``XLA_FLAGS`` (the models train one example per update: small matrices, little to gain
from more threads), and ``recipe.json`` records the rest the bytes depend on — the JAX
build, the flags, the CPU and the cores available.  The pin does not make the core count
irrelevant (measured: one core and two give different bytes under the same flags, the cause
is not found yet); across JAX builds, CPU kinds or core counts the files are not expected to
be byte-identical (docs/training.md states the tolerance measured).

XLA reads ``XLA_FLAGS`` when its CPU client starts (the first computation), not at
``import jax``: ``pin_xla_threads`` must run before any JAX computation in the process; after
one it changes only the environment variable (and so what ``environment`` records), not XLA.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from cachepolicy.engine.row_probe import cpu_signature

__all__ = ["ONE_THREAD_XLA_FLAGS", "environment", "pin_xla_threads"]

ONE_THREAD_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def pin_xla_threads() -> bool:
    """Set one-thread XLA flags unless ``XLA_FLAGS`` is set; True if they were set here."""
    if "XLA_FLAGS" in os.environ:
        return False
    os.environ["XLA_FLAGS"] = ONE_THREAD_XLA_FLAGS
    return True


def environment() -> dict[str, Any]:
    """The JAX build, XLA flags and CPU a training run used (for ``recipe.json``); the CPU
    as the engine's row-class cache names it (model name and feature flags:
    ``row_probe.cpu_signature``), since SIMD widths change float sums here too."""
    import jax
    import jaxlib

    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "machine": platform.machine(),
            "cpu": cpu_signature(), "cpus": cpus}
