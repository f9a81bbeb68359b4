"""The HTTP front of a shared ``kvagent serve`` (issue 45), against a real server on loopback:
connections held open without a request do not lock other clients out; a keyless server
takes no requests from web pages of other origins or for rebound host names, and no
non-JSON bodies on its JSON routes; a request head is capped however it arrives; request
bodies being read stay within a server-wide budget; an API key no client could send is
refused at startup."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from runtime.serve.config import Limits
from runtime.serve.http.auth import ApiKeyError, ApiKeys
from runtime.serve.http.connection_cap import Waiting, closing_for, peer_of
from serve_helpers import kvagent_serve

ROOT = Path(__file__).resolve().parents[1]
CAP = 32  # --max-connections
BUDGET = 40 << 20  # --body-budget
BIG = 16 << 20  # a body: two fit the budget, three do not


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-front")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "2",
                       "--max-connections", str(CAP), "--header-timeout", "3",
                       "--body-budget", f"{BUDGET >> 20}MiB",
                       "--allow-origin", "http://app.example:3000",
                       "--allow-host", "kvagent.test") as served:
        yield served


def _addr(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _episodes(server) -> int:
    return len(httpx.get(f"{server.url}/v1/episodes", timeout=30).json()["data"])


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


# --- 3: the connection cap --------------------------------------------------------------

def _closed(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_connections_held_without_a_head_do_not_lock_others_out(server) -> None:
    addr = _addr(server)
    hostile: list[socket.socket] = []

    def hold(n: int) -> None:
        """Keep ``n`` half-sent connections open (re-open the ones the server closed)."""
        for s in [s for s in hostile if _closed(s)]:
            s.close()
            hostile.remove(s)
        while len(hostile) < n:
            s = socket.create_connection(addr, timeout=5)
            s.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
            hostile.append(s)

    answered = 0
    tries = 40
    try:
        hold(2 * CAP)  # more than the cap, held before and between legitimate requests
        for _ in range(tries):
            try:
                r = httpx.get(f"{server.url}/v1/models", timeout=10)
                answered += r.status_code == 200
            except httpx.TransportError:
                pass
            hold(2 * CAP)
        print(f"{answered}/{tries} answered beside {2 * CAP} held connections (cap {CAP})")
        assert answered >= 0.95 * tries
        # the server still holds at most the cap (the held ones were closed to make room)
        fds = len(os.listdir(f"/proc/{server.process.pid}/fd"))
        assert fds < 200
    finally:
        for s in hostile:
            s.close()


def test_the_cap_closes_the_longest_waiting_and_a_peers_own_first() -> None:
    w = [Waiting("a1", "10.0.0.1", 1.0), Waiting("b1", "10.0.0.2", 0.5),
         Waiting("a2", "10.0.0.1", 2.0)]
    # under both caps: nothing closed
    assert closing_for("10.0.0.3", 4, w, max_connections=4, max_waiting_per_peer=8).evict == ()
    # over the cap: the longest-waiting connection of anyone
    c = closing_for("10.0.0.3", 4, w, max_connections=3, max_waiting_per_peer=8)
    assert c.evict == ("b1",) and not c.refuse_new
    # a peer over its own cap closes its own longest-waiting first (that also makes room)
    c = closing_for("10.0.0.1", 4, w, max_connections=3, max_waiting_per_peer=2)
    assert c.evict == ("a1",) and not c.refuse_new
    # nothing waits (every connection serves a request): the newcomer is refused
    c = closing_for("10.0.0.3", 4, [], max_connections=3, max_waiting_per_peer=8)
    assert c.evict == () and c.refuse_new
    assert peer_of(("2001:db8::1", 5, 0, 0)) == peer_of(("2001:db8::ffff", 6, 0, 0))
    assert peer_of(("::ffff:10.0.0.1", 1, 0, 0)) == peer_of(("10.0.0.1", 2)) == "10.0.0.1"


# --- 4: web pages and rebound names -----------------------------------------------------

def test_a_keyless_server_refuses_foreign_origins_hosts_and_simple_requests(server) -> None:
    before = _episodes(server)
    url, port = server.url, _addr(server)[1]
    create = json.dumps({"instruction": "x"}).encode()
    with httpx.Client(base_url=url, timeout=30) as c:
        # a web page's simple cross-site POST (text/plain, no preflight)
        err = _error(c.post("/v1/episodes", content=create, headers={
            "origin": "http://evil.example", "content-type": "text/plain"}), 403)
        assert err["code"] == "forbidden_origin"
        for origin in ("null", f"http://evil.example:{port}", "http://127.0.0.1:1"):
            _error(c.post("/v1/episodes", json={"instruction": "x"},
                          headers={"origin": origin}), 403)
        # DNS rebinding: the page's own name, pointed at 127.0.0.1 (same origin as the page)
        for host in (f"evil.example:{port}", "evil.example"):
            _error(c.post("/v1/episodes", json={"instruction": "x"},
                          headers={"host": host, "origin": f"http://{host}"}), 403)
            _error(c.get("/v1/episodes", headers={"host": host}), 403)
        # a non-JSON body on a JSON route, without Origin (a form, text/plain): 415
        for ctype in ("text/plain", "application/x-www-form-urlencoded",
                      "multipart/form-data; boundary=x"):
            err = _error(c.post("/v1/episodes", content=create,
                                headers={"content-type": ctype}), 415)
            assert "application/json" in err["message"]
        assert _episodes(server) == before  # none of them reached the app
        # the server's own origin, the allowed ones, and programs (no Origin) still work
        made = []
        for headers in ({"origin": f"http://127.0.0.1:{port}"},
                        {"origin": f"http://localhost:{port}", "host": f"localhost:{port}"},
                        {"origin": "http://app.example:3000"},
                        {"host": "kvagent.test"}, {},
                        {"content-type": "application/json; charset=utf-8"}):
            r = c.post("/v1/episodes", content=create,
                       headers={"content-type": "application/json", **headers})
            assert r.status_code == 201, (headers, r.text)
            made.append(r.json()["episode_id"])
            assert c.delete(f"/v1/episodes/{made[-1]}").status_code == 204


# --- 8: the head cap --------------------------------------------------------------------

def _reply(s: socket.socket) -> bytes:
    out = b""
    s.settimeout(10)
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def test_a_head_over_the_cap_in_one_write_is_a_431(server) -> None:
    before = _episodes(server)
    body = json.dumps({"instruction": "x"}).encode()
    head = (b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nX-Pad: " + b"a" * 100_000 + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    assert len(head) > Limits().max_head_bytes
    small = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    for first in (b"", small):  # alone, and pipelined behind a request that is answered
        with socket.create_connection(_addr(server), timeout=10) as s:
            s.sendall(first + head + body)  # ONE write: the whole head is complete at once
            reply = _reply(s)
        if first:
            assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
            reply = reply[reply.index(b"HTTP/1.1 ", 10):]
        assert reply.startswith(b"HTTP/1.1 431"), reply[:300]
        assert b"request_header_too_large" in reply
    assert _episodes(server) == before  # never handled by the app
    # a head just under the cap is served
    ok = head.replace(b"a" * 100_000, b"a" * 10_000 + b"\r\nConnection: close")
    with socket.create_connection(_addr(server), timeout=10) as s:
        s.sendall(ok + body)
        reply = _reply(s)
    assert reply.startswith(b"HTTP/1.1 201"), reply[:300]
    episode = json.loads(reply.partition(b"\r\n\r\n")[2])["episode_id"]
    assert httpx.delete(f"{server.url}/v1/episodes/{episode}", timeout=30).status_code == 204


# --- 7: the body budget -----------------------------------------------------------------

def _gauges(server) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith(("kvagent_request_body_bytes", "kvagent_request_bodies_refused")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _head(length: int) -> bytes:
    return (b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            b"application/json\r\nContent-Length: " + str(length).encode() + b"\r\n\r\n")


def test_request_bodies_being_read_stay_within_the_budget(server) -> None:
    addr = _addr(server)
    reserved = 'kvagent_request_body_bytes{kind="reserved"}'
    peak = 'kvagent_request_body_bytes{kind="peak"}'
    refused = "kvagent_request_bodies_refused"
    g = _gauges(server)
    assert g['kvagent_request_body_bytes{kind="budget"}'] == BUDGET and g[reserved] == 0
    refused_before = g[refused]
    # two bodies being sent slowly hold 2 x 16 MiB of the 40 MiB budget ...
    slow = [socket.create_connection(addr, timeout=10) for _ in range(2)]
    try:
        for s in slow:
            s.sendall(_head(BIG) + b'{"instruction": ')
        deadline = time.monotonic() + 30
        while _gauges(server)[reserved] < 2 * BIG and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gauges(server)[reserved] == 2 * BIG
        # ... so a third does not fit: it waits (nothing of it is read), then 503
        with socket.create_connection(addr, timeout=30) as s:
            s.sendall(_head(BIG))
            reply = _reply(s)
        assert reply.startswith(b"HTTP/1.1 503"), reply[:300]
        assert b"retry-after:" in reply.lower()
        # one larger than the whole budget could never fit: 413 at once
        with socket.create_connection(addr, timeout=30) as s:
            s.sendall(_head(BUDGET + 1))
            assert _reply(s).startswith(b"HTTP/1.1 413")
    finally:
        for s in slow:
            s.close()  # (the server's read ends: the reservations come back)
    deadline = time.monotonic() + 30
    while _gauges(server)[reserved] and time.monotonic() < deadline:
        time.sleep(0.05)
    g = _gauges(server)
    assert g[reserved] == 0 and g[refused] == refused_before + 1 and g[peak] <= BUDGET

    # many large bodies at once: the budget's count never passes it (and /metrics checks
    # it against the sum of the live reservations, an independent count); every 503 the
    # clients saw is one the server counted
    n = 8
    payload = b'{"instruction": "' + b"a" * (BIG - 40) + b'", "x": 1}'
    statuses: list[int] = []

    def post() -> None:
        r = httpx.post(f"{server.url}/v1/episodes", content=payload, timeout=60,
                       headers={"content-type": "application/json"})
        statuses.append(r.status_code)

    clients = [threading.Thread(target=post) for _ in range(n)]
    for t in clients:
        t.start()
    for t in clients:
        t.join(90)
    g = _gauges(server)
    print(f"{n} x {BIG >> 20} MiB bodies: statuses {sorted(statuses)}, budget peak "
          f"{g[peak] / 2**20:.0f} MiB of {BUDGET >> 20}")
    assert len(statuses) == n and all(400 <= s < 500 or s == 503 for s in statuses)
    assert g[peak] <= BUDGET and g[reserved] == 0
    assert g[refused] - refused_before - 1 == statuses.count(503)


# --- 11: keys no client can send --------------------------------------------------------

def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "KVAGENT_API_KEY"}
    return subprocess.run([sys.executable, "-m", "runtime.cli", "serve", "--port", "0", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**base, **(env or {})})


def test_a_key_no_client_can_send_is_refused_at_startup(tmp_path) -> None:
    bad = "clé-secrète-0123456789"  # printable, but not ASCII: no header carries it as is
    out = _serve("--api-key", bad)
    assert out.returncode == 2, out.stderr
    assert "ASCII" in out.stderr and "--api-key" in out.stderr
    assert bad not in out.stderr and "secr" not in out.stderr and "Traceback" not in out.stderr
    keyfile = tmp_path / "keys"
    keyfile.write_text("good-key-0123456789\nkey\u00a0with-nbsp-012345\n")
    out = _serve("--api-key-file", str(keyfile))
    assert out.returncode == 2 and "ASCII" in out.stderr and "nbsp" not in out.stderr
    out = _serve(env={"KVAGENT_API_KEY": "good-key-0123456789,tab\tkey-0123456789"})
    assert out.returncode == 2 and "KVAGENT_API_KEY" in out.stderr
    for key in ("ключ-0123456789", "emoji-key-\U0001F511-0123", "ctl-key-\x7f-0123456"):
        with pytest.raises(ApiKeyError, match="ASCII"):
            ApiKeys.gather([key])
    assert ApiKeys.gather(["good-key-!#$%&'*+-.^_`|~0123"]).required
