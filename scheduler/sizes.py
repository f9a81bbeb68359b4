"""Byte sizes and memory budgets: the one parser, the one formatter, the one "unlimited".

A budget is given either in bytes (``2GiB``, ``512MiB``, ``1.5G``, ``1000000``) or as a
multiple of one episode's measured peak (``3.2x``, resolved once that peak is known).
Everything that reaches the ledger is finite, positive and at most ``UNLIMITED_BYTES``.
"""

from __future__ import annotations

import math
import re

import attrs

#: The ledger budget meaning "no limit": far beyond any machine, small enough for any sum.
UNLIMITED_BYTES = 1 << 50
#: A budget factor outside this range is a typo, not a configuration.
MIN_FACTOR, MAX_FACTOR = 0.01, 1000.0

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 2**10, "m": 1000**2, "mb": 1000**2,
          "mib": 2**20, "g": 1000**3, "gb": 1000**3, "gib": 2**30, "t": 1000**4,
          "tb": 1000**4, "tib": 2**40}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_FORMS = "use e.g. 2GiB, 512MiB, 1.5G or 1000000"


def parse_bytes(text: str) -> int:
    """Bytes from a size string; raises ValueError naming the accepted forms."""
    m = _PATTERN.match(text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a byte size: {text!r} ({_FORMS})")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"byte size must be positive: {text!r}")
    if value > UNLIMITED_BYTES:
        raise ValueError(f"byte size {text!r} is over the {format_bytes(UNLIMITED_BYTES)} limit")
    return value


@attrs.frozen
class Budget:
    """A memory budget as given: absolute bytes, a factor of one episode's peak, or none."""

    nbytes: int | None = None
    factor: float | None = None

    @property
    def unlimited(self) -> bool:
        return self.nbytes is None and self.factor is None

    @property
    def relative(self) -> bool:
        return self.factor is not None

    def resolve(self, one_episode_peak: int | None = None) -> int:
        """The budget in bytes (a relative one needs the measured peak of one episode)."""
        if self.nbytes is not None:
            return self.nbytes
        if self.factor is None:
            return UNLIMITED_BYTES
        if one_episode_peak is None or one_episode_peak <= 0:
            raise ValueError("a relative budget needs one episode's measured peak")
        return max(1, min(UNLIMITED_BYTES, int(self.factor * one_episode_peak)))

    def __str__(self) -> str:
        if self.nbytes is not None:
            return format_bytes(self.nbytes)
        return f"{self.factor:g}x one episode's peak" if self.factor is not None else "unlimited"


def parse_budget(value: str | int | None, *, relative: bool = True) -> Budget:
    """``None`` → unlimited; an int → bytes; ``"3.2x"`` → a factor (if ``relative``);
    anything else through ``parse_bytes``.  Raises ValueError with the accepted forms."""
    if value is None:
        return Budget()
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not a memory budget: {value!r}")
    if isinstance(value, int):
        if not 0 < value <= UNLIMITED_BYTES:
            raise ValueError(f"memory budget must be 1..{UNLIMITED_BYTES} bytes, got {value}")
        return Budget(nbytes=value)
    text = value.strip().lower()
    if text.endswith("x"):
        if not relative:
            raise ValueError(f"memory budget {value!r}: a multiple of one episode's peak is "
                             f"only for benchmarks; {_FORMS}")
        try:
            factor = float(text[:-1])
        except ValueError:
            factor = math.nan
        if not (math.isfinite(factor) and MIN_FACTOR <= factor <= MAX_FACTOR):
            raise ValueError(f"memory budget {value!r}: a factor must be a number from "
                             f"{MIN_FACTOR:g} to {MAX_FACTOR:g} (e.g. 3.2x)")
        return Budget(factor=factor)
    return Budget(nbytes=parse_bytes(text))


def format_bytes(n: int) -> str:
    """``1.5 GiB``, ``12.0 MiB``, ``3.2 KiB``, ``512 B``; ``unlimited`` at the limit."""
    if n >= UNLIMITED_BYTES:
        return "unlimited"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
