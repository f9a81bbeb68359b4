"""The benches' plain-text tables: columns padded to their widest cell, a rule under the
header row (the first row)."""

from __future__ import annotations

from collections.abc import Sequence


def grid(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the header first, every row as wide) as aligned text lines."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
