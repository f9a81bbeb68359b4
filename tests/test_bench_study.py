"""``kvagent bench --scenario study``'s path on a tiny model: every cell is a real bench run
at the cell's screen and window, and the grid is computed from the cells' JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.bench.study import parse_screen, run_study
from runtime.cli import build_parser
from runtime.engine_setup import ModelFiles
from runtime.commands import bench


def test_study_cells_run_the_bench_at_each_screen_and_window(forged, tmp_path: Path,
                                                             capsys) -> None:
    out = tmp_path / "study.json"
    args = build_parser().parse_args(["bench", "--scenario", "study", "--threads", "1",
                                      "--decode-tokens", "4", "--vm-seconds", "0.01",
                                      "--arms", "evict,terminal-slot,terminal-slot+overlap",
                                      "--json", str(out)])
    m = forged("qwen35")
    rc = run_study(args, bench.run, files=ModelFiles(m.model_path, m.mmproj_path),
                   screens=[(128, 96), (192, 96)], windows=[2])
    assert rc == 0
    grid = json.loads(out.read_text())
    cells = grid["cells"]
    assert [(c["screen"], c["window"], c["steps"]) for c in cells] == [
        ([128, 96], 2, 4), ([192, 96], 2, 4)]
    assert cells[1]["image_tokens"] > cells[0]["image_tokens"]  # the screen set the size
    for c in cells:
        assert set(c["arms"]) == {"evict", "terminal-slot", "terminal-slot+overlap"}
        assert c["arms"]["evict"]["latency_vs_evict"] == 1.0
        assert c["terminal_slot_arms_identical"] is True
        # with overlap the critical path prefills about the new content, evict the window
        over, evict = c["arms"]["terminal-slot+overlap"], c["arms"]["evict"]
        assert over["critical_over_new"] < evict["critical_over_new"]
        cell_json = out.with_name(f"study-{c['screen'][0]}x{c['screen'][1]}-k2.json")
        assert json.loads(cell_json.read_text())["config"]["window"] == 2
    assert "vs evict" in capsys.readouterr().out


def test_study_refuses_what_the_preset_fixes(tmp_path: Path) -> None:
    args = build_parser().parse_args(["bench", "--scenario", "study", "--screen", "640x360"])
    assert bench.run(args) == 2
    assert parse_screen("1280x720") == (1280, 720)
    for bad in ("12x720", "wide"):
        with pytest.raises(ValueError, match="--screen"):
            parse_screen(bad)
