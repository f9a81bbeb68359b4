"""``kvagent serve``'s exit status says how its shutdown went: a real server process (the
forged tiny model, loopback) whose shutdown fails — a fault injected into the scheduler's
close, after every episode closed, where the final integrity check runs — exits 1 and names
the cause last on stderr (uvicorn alone logs "Application shutdown failed" and exits 0)."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx

from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

#: Runs kvagent's command line with the scheduler's close failing once it has closed
#: every episode (as the final integrity check does when the ledger drifted).
FAULTY_CLOSE = """
import sys
import scheduler.scheduler as s
from scheduler.errors import IntegrityError

close = s.Scheduler.aclose

async def aclose(self):
    await close(self)
    raise IntegrityError("injected: the ledger holds 4096 bytes that no sequence has")

s.Scheduler.aclose = aclose
from runtime.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_failed_shutdown_exits_non_zero_and_says_why(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    png = base64.b64encode(screenshot(0, 320, 240)).decode()
    with kvagent_serve(m.model_path.parent, tmp_path, expect_clean_exit=False,
                       launcher=("-c", FAULTY_CLOSE)) as served:
        with httpx.Client(base_url=served.url, timeout=60) as c:
            ep = c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
            assert c.post(f"/v1/episodes/{ep}/step", json={"screenshot": png}).status_code == 200
    text = served.stderr()
    assert served.exit_code == 1, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last == ("kvagent serve: error: the shutdown failed: IntegrityError: injected: "
                    "the ledger holds 4096 bytes that no sequence has"), text[-3000:]
    assert '"serve_shutdown_failed"' in text


def test_a_clean_shutdown_exits_zero(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path) as served:  # checks exit 0 on its way out
        assert httpx.get(f"{served.url}/health", timeout=30).json()["status"] == "ok"
    assert "shutdown failed" not in served.stderr()
