"""forge(): write one random-weight model (and optionally its vision projector) to a directory."""

from __future__ import annotations

import operator
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from .errors import ForgeError
from .mmproj import mmproj_plans, write_mmproj
from .quant import check_quant
from .specs import check_arch_size, text_spec, vision_spec
from .text_model import text_plans, write_text_model
from .writer import count_params

MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"
_MAX_SEED = 2**63 - 1


@attrs.frozen
class ForgedModel:
    """What forge() wrote. `n_params` counts the text model only (llama_model_n_params);
    `quant` names the text model's quantization (the mmproj is always f16)."""

    model_path: Path
    mmproj_path: Path | None
    arch: str
    size: str
    seed: int
    n_params: int
    model_bytes: int
    mmproj_bytes: int = 0
    mmproj_params: int = 0
    quant: str = "f16"


def check_request(arch: object, size: object, seed: object, quant: object = "f16") -> None:
    """Raise ForgeError unless (arch, size, seed, quant) is a valid forge request."""
    check_arch_size(arch, size)
    check_quant(arch, size, quant)  # type: ignore[arg-type]
    if isinstance(seed, bool):
        raise ForgeError(f"seed must be an int, got bool {seed!r}")
    try:
        value = operator.index(seed)  # accepts int and numpy ints, rejects floats / str
    except TypeError:
        raise ForgeError(f"seed must be an int, got {type(seed).__name__} {seed!r}") from None
    if not 0 <= value <= _MAX_SEED:
        raise ForgeError(f"seed must be in [0, 2**63), got {value}")


def describe(arch: str, size: str, out_dir: Path, *, vision: bool, seed: int,
             quant: str = "f16") -> ForgedModel:
    """The record for files already forged into out_dir (sizes read from disk)."""
    model_path = out_dir / MODEL_FILE
    mmproj_path = out_dir / MMPROJ_FILE if vision else None
    return ForgedModel(
        model_path=model_path,
        mmproj_path=mmproj_path,
        arch=arch,
        size=size,
        seed=seed,
        n_params=count_params(text_plans(text_spec(arch, size))),
        model_bytes=model_path.stat().st_size,
        mmproj_bytes=mmproj_path.stat().st_size if mmproj_path else 0,
        mmproj_params=count_params(mmproj_plans(vision_spec(arch, size))) if vision else 0,
        quant=quant,
    )


def _write_quantized(arch: str, size: str, path: Path, seed: int, quant: str) -> None:
    """Write the f16 text model next to ``path``, quantize it into ``path`` (atomically)."""
    write_quantized(path, quant, lambda f16: write_text_model(text_spec(arch, size), f16, seed))


def write_quantized(path: Path, quant: str, write_f16: Callable[[Path], object]) -> None:
    """``write_f16(tmp)`` writes an f16 model next to ``path``; llama.cpp's quantizer turns it
    into ``path`` (atomically: a reader never sees a half-written file)."""
    # here, not at the top: forging an f16 model needs no libllama (the engine owns it)
    from cachepolicy.engine.quantize import quantize_gguf

    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    f16, quantized = Path(tmp_name), Path(tmp_name + ".q")
    try:
        write_f16(f16)
        quantize_gguf(f16, quantized, quant)
        os.chmod(quantized, 0o644)
        os.replace(quantized, path)
    finally:
        f16.unlink(missing_ok=True)
        quantized.unlink(missing_ok=True)


def forge(arch: str, size: str, out_dir: Path, *, vision: bool = False, seed: int = 0,
          quant: str = "f16") -> ForgedModel:
    """Write `out_dir/model.gguf` (and `out_dir/mmproj.gguf` if vision) and describe them.

    ``quant`` other than "f16" quantizes the text model with llama.cpp's own quantizer
    (``llama_model_quantize``, the rules of ``llama-quantize``); the mmproj stays f16.
    Deterministic: the same (arch, size, vision, seed, quant) always gives byte-identical files.
    Each file is written to a temporary name and renamed into place, so a reader never sees
    a half-written file. Raises ForgeError for an unknown arch/size/quant, a quant whose blocks
    do not fit the size's rows, a seed outside [0, 2**63), or an out_dir that exists and is
    not a directory.
    """
    check_request(arch, size, seed, quant)
    seed = operator.index(seed)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ForgeError(f"out_dir {out_dir} exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    if quant == "f16":
        write_text_model(text_spec(arch, size), out_dir / MODEL_FILE, seed)
    else:
        _write_quantized(arch, size, out_dir / MODEL_FILE, seed, quant)
    if vision:
        write_mmproj(vision_spec(arch, size), out_dir / MMPROJ_FILE, seed)
    return describe(arch, size, out_dir, vision=vision, seed=seed, quant=quant)
