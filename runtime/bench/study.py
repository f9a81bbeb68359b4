"""``kvagent bench --scenario study``: the bench in a setting like the study this project
starts from, where prefill dominates a step — the largest forged hybrid model (qwen35 L,
156 M parameters) quantized Q4_K_M, a Qwen3-VL projector, screenshots of 1280x720 (920
tokens) and 1920x1080 (2040 tokens), windows of K = 3 and K = 5.

Each of the four (screen, K) cells is one ordinary ``kvagent bench`` run (its own tables and
JSON, ``<json stem>-<W>x<H>-k<K>.json`` next to ``--json``) of ``K + 2`` steps, so two steps
run with a full window; then one grid of what the cells show side by side: the critical
path of every arm after the window filled, against evict's, and the critical-path prefill
against the new content.  ``--threads``, ``--vm-seconds`` (default here 1.5 s), ``--arms``
(default evict and terminal-slot+overlap), ``--n-batch`` apply to every cell; the model,
screens, windows and steps are the preset's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runtime.arg_parsers import parse_wxh
from runtime.engine_setup import DefaultModel, ModelFiles, resolve_model
from runtime.bench.text_grid import grid
from vmenv.trajectory_writer import write_durably

SCREENS = ((1280, 720), (1920, 1080))
WINDOWS = (3, 5)
#: the model every cell runs: the largest forged hybrid, quantized as the study's was
MODEL = DefaultModel("qwen35", "L", quant="q4_k_m")
#: evict (the study's baseline) against terminal-slot with overlap; --arms adds others
DEFAULT_ARMS = "evict,terminal-slot+overlap"
#: VM seconds per action when --vm-seconds is not given (the issue's default scenario's)
VM_SECONDS = 1.5
#: steps after the window filled, per cell
FULL_STEPS = 2


def parse_screen(text: str) -> tuple[int, int]:
    """A bench screenshot size: '1280x720' → (1280, 720), both sides 32..8192 (ValueError
    naming ``--screen`` otherwise)."""
    return parse_wxh(text, option="--screen", low=(32, 32), high=(8192, 8192))


def cell_args(args: argparse.Namespace, model: Path, mmproj: Path, screen: tuple[int, int],
              window: int, out: Path) -> argparse.Namespace:
    """The ``kvagent bench`` arguments of one cell."""
    cell = copy.copy(args)
    cell.scenario, cell.trajectory, cell.episodes = None, None, 1
    cell.model, cell.mmproj = model, mmproj
    cell.screen = f"{screen[0]}x{screen[1]}"
    cell.window, cell.steps = window, window + FULL_STEPS
    cell.arms = args.arms or DEFAULT_ARMS
    cell.json_out = out
    cell.vm_seconds = args.vm_seconds or VM_SECONDS
    # the study times critical paths: no approximate arm's from-scratch drift reference
    cell.replay_drift = False
    return cell


def run_study(args: argparse.Namespace, bench_run: Callable[[argparse.Namespace], int], *,
              files: ModelFiles | None = None,
              screens: Sequence[tuple[int, int]] = SCREENS,
              windows: Sequence[int] = WINDOWS) -> int:
    """Run every cell through ``bench_run`` (``kvagent bench``'s own ``run``), then print
    and write the grid.  ``files``, ``screens``, ``windows``: the preset's unless given
    (tests run the same path on a tiny model)."""
    fixed = [flag for flag, given in (("--model", args.model), ("--mmproj", args.mmproj),
                                      ("--trajectory", args.trajectory),
                                      ("--screen", args.screen),
                                      ("--episodes", args.episodes != 1)) if given]
    if fixed:
        print(f"kvagent bench: error: --scenario study fixes the model, screens and steps; "
              f"drop {', '.join(fixed)}", file=sys.stderr)
        return 2
    if files is None:
        files = resolve_model(None, None, default=MODEL)
    base = args.json_out or Path(tempfile.mkdtemp(prefix="kvagent-study-")) / "study.json"
    cells = []
    for screen in screens:
        for window in windows:
            out = base.with_name(f"{base.stem}-{screen[0]}x{screen[1]}-k{window}.json")
            print(f"== study cell {screen[0]}x{screen[1]}, K={window}: {out}", file=sys.stderr,
                  flush=True)
            assert files.mmproj is not None
            rc = bench_run(cell_args(args, files.model, files.mmproj, screen, window, out))
            if rc != 0:
                return rc
            cells.append(grid_cell(json.loads(out.read_text())))
    print(grid_table(cells))
    if args.json_out is not None:
        write_durably(args.json_out, json.dumps(
            {"scenario": "study", "model": str(files.model), "threads": args.threads,
             "vm_seconds": args.vm_seconds or VM_SECONDS, "cells": cells}, indent=1).encode())
        print(f"wrote {args.json_out}")
    return 0


def _after_window(steps: list[dict[str, Any]], window: int, key: str) -> float:
    full = steps[window:] or steps
    return sum(s[key] for s in full) / len(full)


def grid_cell(report: dict[str, Any]) -> dict[str, Any]:
    """One cell's numbers, from its ``kvagent bench`` JSON: per arm, the means over the
    steps after the window filled, and the ratios to evict's critical path."""
    c = report["config"]
    window = c["window"]
    arms = {}
    for a in report["arms"]:
        if a["refused"]:
            continue
        steps = a["steps"]
        arms[a["arm"]] = {
            "critical_path_s": _after_window(steps, window, "critical_path_s"),
            "critical_path_s_last": steps[-1]["critical_path_s"],
            "critical_path_prefill_tokens": _after_window(steps, window,
                                                          "critical_path_prefill_tokens"),
            "new_content_tokens": _after_window(steps, window, "new_content_tokens"),
            "prefetch_wait_s": _after_window(steps, window, "prefetch_wait_s"),
            "encode_s": _after_window(steps, window, "encode_s"),
            "wall_s": a["summary"]["wall_s"],
            "output_sha256": a["output_sha256"]}
    evict = arms.get("evict")
    for arm in arms.values():
        arm["critical_over_new"] = arm["critical_path_prefill_tokens"] / arm["new_content_tokens"]
        if evict is not None:
            arm["latency_vs_evict"] = arm["critical_path_s"] / evict["critical_path_s"]
            arm["last_latency_vs_evict"] = (arm["critical_path_s_last"]
                                            / evict["critical_path_s_last"])
    slot = {arms[a]["output_sha256"] for a in arms if a.startswith("terminal-slot")}
    return {"screen": c["screenshot_size"], "window": window, "image_tokens": c["image_tokens"],
            "steps": c["steps"], "arms": arms, "terminal_slot_arms_identical": len(slot) <= 1}


def grid_table(cells: list[dict[str, Any]]) -> str:
    head = ("screen", "K", "tokens/shot", "arm", "crit s (full window)", "vs evict",
            "last step vs evict", "crit prefill / new", "waited s", "encode s", "wall s")
    rows = [head]
    for c in cells:
        for name, a in c["arms"].items():
            rows.append((f"{c['screen'][0]}x{c['screen'][1]}", str(c["window"]),
                         str(c["image_tokens"]), name, f"{a['critical_path_s']:.2f}",
                         f"{a.get('latency_vs_evict', float('nan')):.2f}",
                         f"{a.get('last_latency_vs_evict', float('nan')):.2f}",
                         f"{a['critical_over_new']:.2f}", f"{a['prefetch_wait_s']:.2f}",
                         f"{a['encode_s']:.2f}", f"{a['wall_s']:.1f}"))
    lines = grid(rows).split("\n")
    same = all(c["terminal_slot_arms_identical"] for c in cells)
    lines.append(f"(means over the {FULL_STEPS} steps after the window filled; terminal-slot "
                 f"with and without overlap decoded identical tokens in every cell: "
                 f"{'yes' if same else 'NO'})")
    return "\n".join(lines)
