"""GGUF writing helpers: tensor plans, deterministic initialisation, atomic file output."""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

import attrs
import gguf
import numpy as np

Init = Literal["normal", "const", "uniform", "given"]


@attrs.frozen
class TensorPlan:
    """One tensor to write.

    `dims` is in llama.cpp order (ne0 = fastest varying first), as printed in llama.cpp's
    create_tensor calls; numpy wants the reverse, which `materialize` takes care of.
    """

    name: str
    dims: tuple[int, ...]
    init: Init = "normal"
    a: float = 0.02  # normal: std; const: value; uniform: low
    b: float = 0.0  # uniform: high
    force_f32: bool = False  # some kernels (ssm_conv1d) abort on f16
    #: init "given": the values themselves (numpy order, i.e. reversed ``dims``), e.g. trained
    #: weights being exported; excluded from equality so plans stay cheap to compare
    values: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))

    @property
    def is_f32(self) -> bool:
        # llama.cpp keeps norms/biases (1-D) in f32; matrices are f16 like a real f16 export.
        return self.force_f32 or len(self.dims) == 1


def normal(name: str, *dims: int, std: float = 0.02, f32: bool = False) -> TensorPlan:
    """A tensor of N(0, std²) values."""
    return TensorPlan(name, tuple(dims), "normal", std, 0.0, f32)


def const(name: str, *dims: int, value: float = 1.0, f32: bool = False) -> TensorPlan:
    """A tensor filled with `value` (norm scales 1.0, biases 0.0)."""
    return TensorPlan(name, tuple(dims), "const", value, 0.0, f32)


def uniform(name: str, *dims: int, low: float, high: float) -> TensorPlan:
    """A tensor of U(low, high) values."""
    return TensorPlan(name, tuple(dims), "uniform", low, high)


def given(plan: TensorPlan, values: np.ndarray) -> TensorPlan:
    """``plan`` with its values supplied instead of drawn (a trained model's export).

    The values must have the plan's shape (numpy order: ``dims`` reversed); they are written
    as the plan's type (f16 matrices, f32 vectors and forced-f32 tensors), so a plan list
    made of given plans writes the same tensor table as a forged model of that spec.
    """
    shape = tuple(reversed(plan.dims))
    arr = np.asarray(values)
    if arr.shape != shape:
        raise ValueError(f"{plan.name}: values of shape {arr.shape}, the plan needs {shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{plan.name}: values must be floating point, got {arr.dtype}")
    return attrs.evolve(plan, init="given", a=0.0, b=0.0, values=arr)


def count_params(plans: Iterable[TensorPlan]) -> int:
    """Total number of elements over all planned tensors."""
    return sum(p.n_elements for p in plans)


def materialize(plan: TensorPlan, seed: int) -> np.ndarray:
    """The tensor's values: a pure function of (seed, tensor name, plan).

    Each tensor gets its own generator keyed by a CRC of its name, so adding or reordering
    tensors never changes the values of the others, and no global state is involved.
    """
    shape = tuple(reversed(plan.dims))
    dtype = np.float32 if plan.is_f32 else np.float16
    if plan.init == "const":
        return np.full(shape, plan.a, dtype=dtype)
    if plan.init == "given":
        assert plan.values is not None and plan.values.shape == shape, plan.name
        # round-to-nearest-even, as llama.cpp's own f32 -> f16 conversion
        return np.ascontiguousarray(plan.values.astype(dtype))
    rng = np.random.default_rng([seed, zlib.crc32(plan.name.encode())])
    if plan.init == "normal":
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(plan.a)
    else:
        values = rng.uniform(plan.a, plan.b, size=shape).astype(np.float32)
    return values.astype(dtype, copy=False)


MetadataFn = Callable[[gguf.GGUFWriter], None]


def write_gguf(
    path: Path, arch: str, metadata: MetadataFn, plans: Sequence[TensorPlan], seed: int
) -> int:
    """Write a GGUF file atomically (temp file + rename) and return its size in bytes.

    `metadata` adds the key/value pairs; tensors are materialized in plan order. The
    output is byte-for-byte reproducible: gguf writes no timestamps and we add none.
    """
    # unique temp name in the target dir, so concurrent writers never share a file and the
    # final rename stays on one filesystem (atomic)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(str(tmp), arch)
        metadata(writer)
        for plan in plans:
            # the numpy dtype (f16 / f32) selects the GGML type
            writer.add_tensor(plan.name, materialize(plan, seed))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a model file is meant to be shared
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path.stat().st_size
