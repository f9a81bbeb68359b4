"""``kvagent serve``'s episode API, health, models, metrics and errors — a real server process
on loopback, spoken to over HTTP with httpx."""

from __future__ import annotations

import base64
import io
import json
import threading
from pathlib import Path

import httpx
import pytest
from PIL import Image

from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _is_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    return body["error"]


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "2") as served:
        yield served


def test_an_episode_over_http_with_server_side_overlap(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.get("/health").json()["status"] == "ok"
        models = c.get("/v1/models").json()["data"]
        assert models and models[0]["object"] == "model"
        r = c.post("/v1/episodes", json={"instruction": "Open the terminal.",
                                         "options": {"temperature": 1.0, "seed": 4}})
        assert r.status_code == 201
        ep = r.json()["episode_id"]
        steps = []
        for i in range(3):
            r = c.post(f"/v1/episodes/{ep}/step", json={"screenshot": _b64(screenshot(i, 320, 240))})
            assert r.status_code == 200, r.text
            steps.append(r.json())
        for s in steps:
            assert s["parsed"] and isinstance(s["action"], str) and s["episode_id"] == ep
            assert s["info"]["critical_path_s"] > 0 and s["info"]["encode_s"] > 0
        # the prefetch ran on the server while the "VM" acted: later critical paths are the
        # new screenshot only
        for s in steps[1:]:
            assert s["info"]["prefetch_prefill_tokens"] > 0
            assert s["info"]["critical_path_prefill_tokens"] < s["info"]["prefill_tokens"]
        view = c.get(f"/v1/episodes/{ep}").json()
        assert (view["policy"], view["window"], view["pinned"]) == ("terminal-slot", 3, 0)
        assert len(view["steps"]) == 3
        metrics = c.get("/metrics").text
        assert 'kvagent_steps_total{api="episode",status="ok"} 3' in metrics
        assert 'kvagent_prefill_tokens_total{path="prefetch"}' in metrics
        assert c.delete(f"/v1/episodes/{ep}").status_code == 204
        err = _is_openai_error(c.post(f"/v1/episodes/{ep}/step",
                                      json={"screenshot": _b64(screenshot(4, 320, 240))}), 404)
        assert err["code"] == "episode_not_found"


def _bomb() -> bytes:
    out = io.BytesIO()
    Image.new("1", (14000, 14000)).save(out, "PNG")  # tiny file, 196 M pixels
    return out.getvalue()


def test_bad_input_gets_clear_errors_and_the_server_keeps_serving(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        err = _is_openai_error(c.post("/v1/episodes", content=b"{not json"), 400)
        assert "JSON" in err["message"]
        _is_openai_error(c.post("/v1/episodes", json={"instruction": ""}), 400)
        err = _is_openai_error(c.post("/v1/episodes", json={"instruction": "x",
                                                            "options": {"window": 0}}), 400)
        assert err["param"] == "options"
        _is_openai_error(c.post("/v1/episodes", json={"instruction": "x",
                                                      "options": {"flux": 1}}), 400)
        ep = c.post("/v1/episodes", json={"instruction": "Click OK."}).json()["episode_id"]
        for bad, code in (("%%%", None), (_b64(b"not an image"), "invalid_image"),
                          (_b64(_bomb()), "invalid_image")):
            err = _is_openai_error(c.post(f"/v1/episodes/{ep}/step",
                                          json={"screenshot": bad}), 400)
            assert code is None or err["code"] == code
        _is_openai_error(c.post(f"/v1/episodes/{ep}/step",
                                content=b"{" + b" " * (70 << 20) + b"}"), 413)
        _is_openai_error(c.get("/v1/nothing-here"), 404)
        # ... and a good step still works on the same episode
        r = c.post(f"/v1/episodes/{ep}/step", json={"screenshot": _b64(screenshot(0, 320, 240))})
        assert r.status_code == 200, r.text
        c.delete(f"/v1/episodes/{ep}")


def test_more_episodes_than_slots_get_429_and_a_slot_comes_back(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        ids = [c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
               for _ in range(2)]
        r = c.post("/v1/episodes", json={"instruction": "x"})
        err = _is_openai_error(r, 429)
        assert err["code"] == "too_many_episodes" and float(r.headers["retry-after"]) > 0
        c.delete(f"/v1/episodes/{ids[0]}")
        r = c.post("/v1/episodes", json={"instruction": "x"})
        assert r.status_code == 201
        for ep in (ids[1], r.json()["episode_id"]):
            c.delete(f"/v1/episodes/{ep}")
        assert c.get("/health").json()["episodes"]["open"] == 0


def test_a_second_step_of_one_episode_at_once_is_a_409(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        ep = c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
        codes: list[int] = []

        def go(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as cc:
                codes.append(cc.post(f"/v1/episodes/{ep}/step", json={
                    "screenshot": _b64(screenshot(i, 640, 480))}).status_code)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert 200 in codes and set(codes) <= {200, 409}
        c.delete(f"/v1/episodes/{ep}")


def test_sigterm_mid_episode_closes_everything(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path) as served:
        with httpx.Client(base_url=served.url, timeout=60) as c:
            ep = c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
            c.post(f"/v1/episodes/{ep}/step", json={"screenshot": _b64(screenshot(0, 320, 240))})
    # kvagent_serve checked: exit 0, serve_host_closed, no traceback; and the episode closed
    text = served.stderr()
    closes = [json.loads(x) for x in text.splitlines() if '"episode_close"' in x]
    assert any(e.get("episode_id") == ep for e in closes)


def test_metrics_print_byte_counts_exactly() -> None:
    from runtime.serve.prometheus import ServeMetrics

    text = ServeMetrics().exposition([("kvagent_ledger_bytes", "The ledger.", {"kind": "held"},
                                       2147483649), ("kvagent_x", "x", {}, 0.25)])
    assert 'kvagent_ledger_bytes{kind="held"} 2147483649\n' in text
    assert "kvagent_x 0.25\n" in text
