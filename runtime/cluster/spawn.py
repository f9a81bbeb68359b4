"""Ray's side of the cluster: starting host actors, one per ``kvagent_host`` resource unit.

A node offers model hosts by declaring the custom resource ``kvagent_host`` (``ray start
--resources='{"kvagent_host": 1}'``): each host actor asks for one unit (and no CPU: the
engine's threads are its own), so Ray puts one host on each such node and none on the
others (a head that only routes, say).  ``connect`` joins an existing cluster or, without an
address, starts a one-machine Ray on loopback offering ``hosts`` units.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import attrs
import structlog

from runtime.cluster.host_actor import HostActor, HostInfo
from runtime.serve.config import ServeConfig
from runtime.serve.http.auth import ApiKeys

log = structlog.get_logger("kvagent.cluster")

RESOURCE = "kvagent_host"
#: Without this, Ray replaces 127.0.0.1 by the machine's address; a one-machine cluster
#: stays on loopback (Ray's own single-machine mode, as on macOS).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def connect(address: str | None, *, hosts: int) -> int:
    """``ray.init``: join ``address`` ("auto" = the cluster this node belongs to) or start a
    local loopback Ray offering ``hosts`` units.  Returns the units the cluster offers."""
    if address is None:
        os.environ[LOOPBACK_ENV] = "0"  # read when ray is imported (and by its workers)
    import ray

    if address is None:
        ray.init(address="local", _node_ip_address="127.0.0.1", resources={RESOURCE: hosts},
                 include_dashboard=False, log_to_driver=True)
    else:
        ray.init(address=address, log_to_driver=True)
    return int(ray.cluster_resources().get(RESOURCE, 0))


def host_bind() -> str | None:
    """Where host actors listen: loopback when every node of the cluster is this machine
    (the hosts are then reachable from nowhere else), else None — each host on its node's
    IP, reachable by whoever reaches that IP but refusing requests without the cluster's
    internal key."""
    import ray

    here = ray.util.get_node_ip_address()
    nodes = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return "127.0.0.1" if nodes <= {here} else None


def ray_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


@attrs.define(eq=False)
class HostHandle:
    """A started host: its address, its actor and the ref of its ``serve`` call (resolves
    when the host ends; raises when it dies)."""

    info: HostInfo
    actor: Any
    done: Any
    alive: bool = True
    inflight: set[anyio.CancelScope] = attrs.Factory(set)

    @property
    def name(self) -> str:
        return self.info.name


@attrs.frozen
class Spawner:
    """Starts hosts with one configuration.  ``auto_budget`` / ``auto_threads``: each host
    sizes itself on its node (``host_actor.node_share``) instead of using the config's."""

    config: ServeConfig
    log_level: str = "warning"
    auto_budget: bool = True
    auto_threads: bool = True
    ready_timeout_s: float = 600.0
    #: the hosts' HTTP keys (the cluster's internal key) and where they listen
    #: (``host_bind``; None: their node's IP)
    keys: ApiKeys = ApiKeys()
    bind: str | None = None

    async def start(self, name: str) -> HostHandle:
        """Start host ``name`` and wait until its model is loaded (raises if it fails)."""
        import ray

        remote = ray.remote(HostActor).options(
            name=f"kvagent-{name}-{os.getpid()}", num_cpus=0, resources={RESOURCE: 1},
            max_restarts=0, max_concurrency=1000)
        actor = remote.remote(name, self.config, log_level=self.log_level,
                              auto_budget=self.auto_budget, auto_threads=self.auto_threads,
                              keys=self.keys, bind=self.bind)
        done = actor.serve.remote()
        try:
            with anyio.fail_after(self.ready_timeout_s):
                info = await actor.ready.remote()
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        log.info("cluster_host_started", host=name, url=info.url, pid=info.pid,
                 node_id=info.node_id)
        return HostHandle(info, actor, done)

    @staticmethod
    def kill(handle: HostHandle) -> None:
        """End a host's actor at once (a lost host must not keep episodes it cannot serve)."""
        import ray

        try:
            ray.kill(handle.actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001  already gone is fine
            log.info("cluster_host_kill_failed", host=handle.name, error=repr(exc))
