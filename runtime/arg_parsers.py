"""Values of the command line, parsed and bounded in one place: screen sizes (WxH: the one
parser lives with ``Screen`` in ``vmenv.actions.coords``, below every layer), memory
budgets, thread counts, decode lanes, comma-separated names from a fixed set.

Each parser takes the option's text (or number) and returns the value, or raises
``ValueError`` with a message that names the option and what it accepts — every command
gives the same answer to the same mistake.  No argparse in here: the commands
(``runtime/commands/options.py``) attach these to their flags, and the benches that parse
values of their own (``runtime/bench/study.py``'s grid) call them directly.
"""

from __future__ import annotations

from collections.abc import Collection

from cachepolicy.engine.records import MAX_DECODE_ROWS, MAX_THREADS, default_threads
from scheduler.sizes import Budget, parse_budget
from vmenv.actions.coords import parse_wxh

__all__ = ["check_decode_rows", "check_range", "check_threads", "parse_memory_budget",
           "parse_names", "parse_wxh"]


def parse_memory_budget(text: str | None, *, option: str = "--memory-budget",
                        relative: bool = False) -> Budget:
    """A ledger budget: bytes (``2GiB``, ``512MiB``, ``123456``), or with ``relative`` a
    multiple of one episode's measured peak (``3.2x``); None: unlimited."""
    try:
        return parse_budget(text, relative=relative)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def check_threads(threads: int, *, option: str = "--threads") -> int:
    """An engine's thread count, 1..``MAX_THREADS``."""
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"{option} must be 1..{MAX_THREADS} (the default here is "
                         f"{default_threads()})")
    return threads


def check_decode_rows(rows: int | None, *, option: str = "--decode-rows") -> int | None:
    """The engine's decode lanes, 1..``MAX_DECODE_ROWS`` (None: the engine's default)."""
    if rows is not None and not 1 <= rows <= MAX_DECODE_ROWS:
        raise ValueError(f"{option} must be 1..{MAX_DECODE_ROWS}, got {rows}")
    return rows


def check_range(value: float, *, option: str, low: float, high: float,
                low_open: bool = False) -> float:
    """``value`` within [low, high] (``low_open``: (low, high])."""
    if (value > low if low_open else value >= low) and value <= high:
        return value
    bracket = "(" if low_open else "["
    raise ValueError(f"{option} must be in {bracket}{low:g}, {high:g}], got {value:g}")


def parse_names(text: str, allowed: Collection[str], *, option: str, what: str,
                ) -> tuple[str, ...]:
    """``"a,b"`` -> ``("a", "b")``, each one of ``allowed`` (named ``what`` in the error, e.g.
    ``arch(es)``); ValueError for an unknown name or none at all."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise ValueError(f"{option}: unknown {what} {unknown or text!r}; choose from "
                         f"{', '.join(allowed)}")
    return names
