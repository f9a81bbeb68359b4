"""``kvagent serve`` without ``--model``: the shipped trained agent, served under its own name
(``kvagent-agent-qwen35``, once prefixed), as its help and docs/serving.md say."""

from __future__ import annotations

import httpx

from runtime.bench.serve_process import serve_process
from runtime.engine_setup import DEMO_MODEL

MODEL_ID = "kvagent-agent-qwen35"


def test_the_default_model_is_served_as_kvagent_agent_qwen35(tmp_path) -> None:
    assert DEMO_MODEL.name == MODEL_ID and DEMO_MODEL.trained
    with serve_process(["--threads", "1", "--ctx", "4096", "--max-episodes", "1"],
                       tmp_path / "serve.err", start_timeout=120) as served, \
            httpx.Client(base_url=served.url, timeout=60) as c:
        assert served.model == MODEL_ID  # the ready line
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [MODEL_ID]
        assert c.get("/health").json()["model"] == MODEL_ID
    assert "kvagent's trained demo agent" in served.stderr()  # said once, at start


def test_what_a_newcomer_reads_names_the_default_model() -> None:
    """docs/serving.md's flags table and examples/osworld_runner.py say what ``kvagent serve``
    / ``KvAgent`` use without a model: the shipped agent, not the forged random one."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rows = {line.split("|")[1].strip(): line.split("|")[2]
            for line in (root / "docs" / "serving.md").read_text().splitlines()
            if line.startswith("| `--model")}
    assert "trained demo agent" in rows["`--model F --mmproj F`"]
    assert MODEL_ID in rows["`--model-name NAME`"]
    runner = subprocess.run([sys.executable, str(root / "examples" / "osworld_runner.py"),
                             "--help"], capture_output=True, text=True, timeout=60, check=True,
                            cwd=root)
    assert "trained demo" in runner.stdout and "forged" not in runner.stdout
    assert "forged" not in (root / "examples" / "osworld_runner.py").read_text()
