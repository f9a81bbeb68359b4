"""A GGUF file's metadata and tensor table, read before llama.cpp loads it.

Some questions must be answered before a load: what a context will cost (``sizing``), which
projector family an mmproj is for (``vision``), how many tokens a screenshot will take
(``runtime.context_budget``), which types a MoE model's expert matrices have (``core``).
llama.cpp answers them only once the model is loaded, so they are read from the file with the
``gguf`` package — here, in one place.

Invariant: ``GgufUnreadable`` (a ``ValueError`` naming the file) is the only exception a
damaged or non-GGUF file raises; ``gguf`` itself raises many types (``ValueError``,
``struct.error``, ``IndexError``, ``OSError``...) depending on where the bytes go wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["GgufUnreadable", "metadata", "tensor_bytes", "tensor_types"]


class GgufUnreadable(ValueError):
    """The file cannot be read as GGUF (missing, truncated, another format)."""


def _reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001  gguf raises many types for a damaged file
        raise GgufUnreadable(f"{path}: cannot read it as GGUF ({type(exc).__name__}: "
                             f"{exc})") from exc


def metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata key except the tokenizer's (large arrays nobody here needs), as Python
    values (strings, numbers, lists)."""
    reader = _reader(Path(path))
    try:
        return {k: f.contents() for k, f in reader.fields.items()
                if not k.startswith("tokenizer.")}
    except Exception as exc:  # noqa: BLE001  a field whose bytes are damaged
        raise GgufUnreadable(f"{path}: damaged GGUF metadata ({type(exc).__name__}: "
                             f"{exc})") from exc


def tensor_types(path: str | Path) -> dict[str, str]:
    """Each tensor's GGUF type name (``F16``, ``Q8_0``...), by tensor name."""
    return {t.name: t.tensor_type.name for t in _reader(Path(path)).tensors}


def tensor_bytes(path: str | Path) -> dict[str, int]:
    """Each tensor's size in the file, by tensor name (what a device copy of it takes)."""
    return {t.name: int(t.n_bytes) for t in _reader(Path(path)).tensors}
