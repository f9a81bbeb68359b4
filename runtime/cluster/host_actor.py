"""One model host as a Ray actor: the SAME app and ``ModelHost`` as ``kvagent serve``.

``HostActor.serve`` (a long-running actor call; its ObjectRef is how the front door learns
the host ended or died) runs ``runtime.serve.http.app.create_app`` under uvicorn on the actor's
event loop, on a free port — of loopback when the whole cluster is one machine, else of the
node's IP — taking only the cluster's internal key (``keys``), which the front door alone
holds: the front door forwards the HTTP APIs (steps, chat completions, deletes, leases) to
it unchanged, naming the client's key id.  The rest are actor methods on the same loop (the
host is single-threaded: everything touching it runs there):

- ``ready``: the host's address once the model is loaded;
- ``open_episode``: create (or rebuild after a lost host, ``resume.py``) an episode under the
  front door's number — numbers and replays are not part of the public API;
- ``status`` / ``metrics``: the ledger, open episodes and counters, for placement and
  ``GET /metrics``;
- ``stop``: a graceful shutdown (every episode closed, the ledger back to zero).

This module does not import Ray: ``runtime.cluster.spawn`` wraps the class with
``ray.remote``, so the package imports without the ``[ray]`` extra.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import attrs
import structlog

from runtime.cluster.resume import RecordedStep, open_episode
from runtime.engine_setup import available_memory, default_threads
from runtime.logs import configure_logging
from runtime.serve.config import ServeConfig
from runtime.serve.host import ModelHost
from runtime.serve.http.app import create_app
from runtime.serve.http.auth import ApiKeys
from runtime.serve.http.errors import api_error
from runtime.serve.http.server import uvicorn_server
from runtime.serve.owners import Owner
from runtime.serve.prometheus import ServeMetrics
from scheduler.sizes import UNLIMITED_BYTES

log = structlog.get_logger("kvagent.cluster")

#: How long ``ready`` waits for the model to load.
READY_TIMEOUT_S = 600.0


@attrs.frozen
class HostInfo:
    """Where a host listens and what it is (``ready``'s answer)."""

    name: str
    url: str
    pid: int
    node_id: str
    model: str


@attrs.frozen
class Reply:
    """An actor method's HTTP-shaped answer: status, JSON body, Retry-After seconds."""

    status: int
    body: dict[str, Any]
    retry_after: float | None = None


class HostActor:
    """See the module docstring.  ``auto_budget`` / ``auto_threads``: size the host on its
    node (``node_share``) rather than by ``config``; ``bind``: the address to listen on
    (default: the node's IP as Ray knows it); ``keys``: the keys its HTTP side takes (the
    cluster's internal key)."""

    def __init__(self, name: str, config: ServeConfig, *, log_level: str = "warning",
                 auto_budget: bool = False, auto_threads: bool = False,
                 bind: str | None = None, keys: ApiKeys = ApiKeys()) -> None:
        configure_logging(log_level)
        if auto_budget or auto_threads:
            budget, threads = node_share()
            if auto_budget:
                config = attrs.evolve(config, memory_budget=budget)
            if auto_threads:
                config = attrs.evolve(config, engine=attrs.evolve(config.engine,
                                                                  n_threads=threads))
        self.name, self.config, self.keys = name, config, keys
        self.bind = bind or _node_ip()
        self._host: ModelHost | None = None
        self._info: HostInfo | None = None
        self._server: Any = None
        self._ready_event: anyio.Event | None = None  # made on the actor's event loop
        self._failed: str | None = None

    async def serve(self) -> str:
        """Run the host until ``stop`` (returns "stopped") or the model fails to load
        (raises).  The front door holds this call's ref for as long as the host lives."""
        sock = socket.create_server((self.bind, 0))
        port = sock.getsockname()[1]

        def on_ready(host: ModelHost) -> None:
            self._host = host
            self._info = HostInfo(self.name, f"http://{self.bind}:{port}", os.getpid(),
                                  _node_id(), host.model_name)
            log.info("cluster_host_ready", host=self.name, url=self._info.url)
            self._ready.set()

        server = uvicorn_server(create_app(self.config, keys=self.keys, on_ready=on_ready),
                                self.config.limits, grace_s=30, lifespan="on")
        self._server = server
        try:  # the socket listens already: ready once the model is loaded (on_ready)
            await server.serve(sockets=[sock])
        finally:
            sock.close()
            self._host = None
            if not server.started:
                self._failed = "the model host did not start (see the host's log)"
            self._ready.set()
        if self._failed is not None:
            raise RuntimeError(self._failed)
        return "stopped"

    @property
    def _ready(self) -> anyio.Event:
        if self._ready_event is None:
            self._ready_event = anyio.Event()
        return self._ready_event

    async def ready(self) -> HostInfo:
        with anyio.fail_after(READY_TIMEOUT_S):
            await self._ready.wait()
        if self._info is None:
            raise RuntimeError(self._failed or "the model host stopped before it was ready")
        return self._info

    def _running(self) -> ModelHost:
        if self._host is None:
            raise RuntimeError(f"host {self.name} is not running")
        return self._host

    async def open_episode(self, body: Mapping[str, Any], number: int,
                           replay: Sequence[RecordedStep] = (), *, episode_id: str,
                           owner: Owner) -> Reply:
        host = self._running()
        try:
            created = await open_episode(host, body, number, replay, episode_id=episode_id,
                                         owner=owner)
        except Exception as exc:  # noqa: BLE001  answered like the HTTP route would
            error = api_error(exc)
            if error.status >= 500:
                log.error("cluster_open_failed", host=self.name, error=repr(exc))
            host.metrics.response("episode_create", error.status)
            return Reply(error.status, error.body(), error.retry_after)
        host.metrics.response("episode_create", 201)
        return Reply(201, created)

    async def status(self) -> dict[str, Any]:
        return self._running().status()

    async def metrics(self) -> tuple[ServeMetrics, list[tuple[str, str, dict[str, str], float]]]:
        host = self._running()
        return host.metrics, [(n, h, dict(labels), v) for n, h, labels, v in host.gauges()]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True


def _node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001  outside Ray (tests of the class itself)
        return "local"


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001  outside Ray
        return "127.0.0.1"


def node_share() -> tuple[int, int]:
    """(memory budget, threads) of one host on this node: the memory available now and the
    CPUs, split evenly between the ``kvagent_host`` units the node offers."""

    units = 1
    try:
        import ray

        me = ray.get_runtime_context().get_node_id()
        for node in ray.nodes():
            if node["NodeID"] == me:
                units = max(1, int(node["Resources"].get("kvagent_host", 1)))
    except Exception:  # noqa: BLE001  outside Ray: the whole machine
        pass
    budget = available_memory()
    budget = budget if budget >= UNLIMITED_BYTES else max(1, budget // units)
    return budget, max(1, default_threads() // units)
