"""numpy's BLAS on one thread, for the linear algebra the engine does beside llama.cpp.

llama.cpp computes with an OpenMP team that spins between calls; numpy's OpenBLAS starts a
pthread team of its own per call.  On a small machine the two fight for the same cores and a
256-wide eigendecomposition took 10x longer than on one thread (measured: 0.56 s vs 0.046 s
for a 500x256 SVD, 2 cores).  ``one_thread()`` sets OpenBLAS's thread count for the calling
thread only (``openblas_set_num_threads_local``, OpenBLAS >= 0.3.27, which numpy's bundled
scipy-openblas exports) and restores it after; where that library is not found it does
nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np


@functools.cache
def _set_local() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    libs = Path(np.__file__).parent.parent / "numpy.libs"
    for path in sorted(libs.glob("libscipy_openblas*.so*")) + sorted(libs.glob("*openblas*")):
        try:
            fn = ctypes.CDLL(str(path)).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    fn = _set_local()
    if fn is None:
        yield
        return
    previous = fn(1)
    try:
        yield
    finally:
        fn(max(1, previous))
