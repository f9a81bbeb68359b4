"""A dataset's statistics: per shard (``shard_stats``, from the shard's metadata arrays) and
the manifest's totals over its shards (``summarize``: sums of the per-shard entries, so a
resumed run's totals equal a fresh run's)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from runtime.train.shards import META, Shard


def _window_name(k: int) -> str:
    return "all" if k == 0 else str(k)


def shard_stats(shard: Shard, *, kinds: Sequence[str], layouts: Sequence[str],
                modes: Sequence[str]) -> dict[str, Any]:
    """Counts and row statistics of one shard (summable across shards: ``summarize``);
    ``kinds``, ``layouts`` and ``modes`` name the indices its metadata stores."""
    m = {k: shard.a[f"meta_{k}"] for k in META}
    groups: dict[str, dict[str, int]] = {}
    for layout, k, rows in zip(m["layout"], m["window"], m["rows"]):
        for key in (_window_name(int(k)), f"{layouts[int(layout)]}/{_window_name(int(k))}"):
            g = groups.setdefault(key, {"examples": 0, "rows_sum": 0, "rows_max": 0})
            g["examples"] += 1
            g["rows_sum"] += int(rows)
            g["rows_max"] = max(g["rows_max"], int(rows))
    return {
        "examples": len(shard), "images": shard.n_images,
        "by_kind": dict(Counter(kinds[int(k)] for k in m["kind"])),
        "by_layout": dict(Counter(layouts[int(x)] for x in m["layout"])),
        "rows_by_window": groups,
        "rows_sum": int(m["rows"].sum()), "rows_max": int(m["rows"].max(initial=0)),
        "target_tokens_sum": int(m["target_tokens"].sum()),
        "target_tokens_max": int(m["target_tokens"].max(initial=0)),
        "recovery_examples": int(m["recovery"].sum()),
        "by_mode": dict(Counter(modes[int(x)] for x in m["mode"])),
    }


def summarize(entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's totals from its shards' entries: counts per kind, layout and K; rows
    per example overall and per K (``"3"``) and per layout and K (``"evict/3"``; K
    ``"all"``: noevict); target tokens; generation speed; bytes."""
    def total(key: str) -> int:
        return sum(e["stats"][key] for e in entries)

    def counts(key: str) -> dict[str, int]:
        out: Counter[str] = Counter()
        for e in entries:
            out.update(e["stats"][key])
        return dict(sorted(out.items()))

    groups: dict[str, dict[str, int]] = {}
    for e in entries:
        for key, g in e["stats"]["rows_by_window"].items():
            d = groups.setdefault(key, {"examples": 0, "rows_sum": 0, "rows_max": 0})
            d["examples"] += g["examples"]
            d["rows_sum"] += g["rows_sum"]
            d["rows_max"] = max(d["rows_max"], g["rows_max"])
    n = total("examples")
    seconds = sum(e["seconds"] for e in entries)
    size = sum(e["bytes"] for e in entries)
    return {
        "episodes": sum(e["episodes"][1] - e["episodes"][0] for e in entries),
        "examples": n, "images": total("images"),
        "recovery_examples": total("recovery_examples"),
        "unanswerable_skipped": total("unanswerable_skipped"),
        "by_kind": counts("by_kind"), "by_layout": counts("by_layout"),
        "by_mode": counts("by_mode"),
        "rows": {"mean": total("rows_sum") / n if n else 0.0,
                 "max": max((e["stats"]["rows_max"] for e in entries), default=0),
                 "by_window": {key: {"examples": d["examples"],
                                     "mean": round(d["rows_sum"] / d["examples"], 1),
                                     "max": d["rows_max"]}
                               for key, d in sorted(groups.items())}},
        "target_tokens": {"mean": total("target_tokens_sum") / n if n else 0.0,
                          "max": max((e["stats"]["target_tokens_max"] for e in entries),
                                     default=0)},
        "seconds": seconds, "examples_per_s": n / seconds if seconds else None,
        "bytes": size, "bytes_per_1000_examples": 1000 * size / n if n else None,
    }
