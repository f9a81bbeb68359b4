"""Parse human byte sizes for the CLI: ``2GiB``, ``512MiB``, ``1.5G``, ``1000000``."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 2**10, "m": 1000**2, "mb": 1000**2,
          "mib": 2**20, "g": 1000**3, "gb": 1000**3, "gib": 2**30, "t": 1000**4,
          "tb": 1000**4, "tib": 2**40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes from a size string; raises ValueError with the accepted forms."""
    m = _PATTERN.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 2GiB, 512MiB, 1.5G or 1000000)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"byte size must be positive: {text!r}")
    return value


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
