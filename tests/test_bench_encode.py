"""``kvagent bench-encode`` end to end on the forged tiny qwen35: the report's shape and its
checks (no speed is asserted: speed claims come from the command's own side-by-side run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_encode_reports_both_kernels_and_encode_ahead(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    out = tmp_path / "encode.json"
    res = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "bench-encode", "--threads", "1",
         "--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
         "--sizes", "128x96,200x120", "--repeats", "2", "--steps", "5", "--vm-seconds", "0",
         "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "encode s flash off" in res.stdout and "critical path on/off" in res.stdout
    report = json.loads(out.read_text())
    assert report["deterministic"] is True
    sizes = report["sizes"]
    assert [(s["width"], s["height"]) for s in sizes] == [(128, 96), (200, 120)]
    for s in sizes:
        assert s["tokens"] > 0 and len(s["encode_s"]["flash_on"]) == 2
        assert s["deterministic"] == {"flash_off": True, "flash_on": True}
        assert s["max_abs_diff_off_on"] > 0  # two kernels really ran
        assert s["prefill_s_median"] > 0
    ahead = report["encode_ahead"]
    assert ahead["outputs_identical"] is True
    # with no VM time every screenshot arrives while the prefetch runs
    assert ahead["on"]["encode_ahead_s"] > 0 and ahead["off"]["encode_ahead_s"] == 0
