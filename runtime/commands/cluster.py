"""``kvagent serve --ray``: model hosts on a Ray cluster behind one front door.

Every ``kvagent serve`` flag applies to each host (model, slots, context, agent options;
``--threads`` is per host; without ``--memory-budget`` each host takes its node's available
memory, split between the hosts of that node).  ``--address`` joins a running cluster (one
host per ``kvagent_host`` resource unit, see docs/scaling.md); without it a one-machine Ray
on loopback is started with ``--hosts`` hosts.  The front door takes ``kvagent serve``'s API
keys; the hosts take only an internal key generated here, per cluster, and listen on
loopback when the cluster is this one machine.  The ready line is ``kvagent serve``'s, with
the hosts and the Ray address added.  SIGINT / SIGTERM: the front door stops, every host
closes its episodes, Ray is left (or, when started here, shut down).
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import socket
import sys
from typing import Any

import anyio


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (Ray)")
    g.add_argument("--ray", action="store_true",
                   help="run model hosts on a Ray cluster behind this front door "
                        "(needs the [ray] extra)")
    g.add_argument("--address", default=None,
                   help="Ray cluster to join (host:port, or 'auto'); default: start a "
                        "one-machine Ray on loopback")
    g.add_argument("--hosts", type=int, default=None,
                   help="model hosts to start (default: one per kvagent_host unit the "
                        "cluster offers; 1 for a local Ray)")


def run_cluster(args: argparse.Namespace, config: Any, keys: Any) -> int:
    """``keys``: the clients' API keys (``ApiKeys``), taken by the front door."""
    from runtime.cluster.spawn import connect, ray_address

    if args.hosts is not None and not 1 <= args.hosts <= 256:
        print("kvagent serve --ray: error: --hosts must be 1..256", file=sys.stderr)
        return 2
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # not imported here: connect sets its env
        print("kvagent serve --ray: error: Ray is not installed (pip install "
              "'kvagent[ray]')", file=sys.stderr)
        return 2
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as exc:
        print(f"kvagent serve --ray: error: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2
    try:
        units = connect(args.address, hosts=args.hosts or 1)
        wanted = args.hosts or units
        if wanted < 1 or units < wanted:
            print(f"kvagent serve --ray: error: the cluster offers {units} kvagent_host "
                  f"units, {wanted or 1} wanted; start nodes with ray start "
                  "--resources='{\"kvagent_host\": 1}'", file=sys.stderr)
            return 2
        return anyio.run(_main, args, config, keys, wanted, sock, ray_address())
    finally:
        sock.close()
        import ray

        ray.shutdown()


async def _main(args: argparse.Namespace, config: Any, keys: Any, wanted: int,
                sock: socket.socket, address: str) -> int:
    from runtime.cluster.frontdoor import create_front_door
    from runtime.cluster.router import Router
    from runtime.cluster.spawn import HostHandle, Spawner, host_bind
    from runtime.serve.http.auth import ApiKeys
    from runtime.serve.http.server import uvicorn_server

    internal = secrets.token_urlsafe(32)  # this cluster's front door → host key
    spawner = Spawner(config, log_level=args.log_level,
                      auto_budget=args.memory_budget is None, auto_threads=False,
                      keys=ApiKeys(internal=internal), bind=host_bind())
    hosts: list[HostHandle] = []
    try:
        async with anyio.create_task_group() as tg:
            async def start(name: str) -> None:
                hosts.append(await spawner.start(name))

            for i in range(wanted):
                tg.start_soon(start, f"host-{i}")
    except Exception as exc:  # noqa: BLE001  a host that does not start ends the command
        print(f"kvagent serve --ray: error: a model host did not start: {exc!r}"[:2000],
              file=sys.stderr)
        for host in hosts:
            spawner.kill(host)
        return 2
    hosts.sort(key=lambda h: h.name)
    router = Router(hosts, start_host=spawner.start, kill_host=spawner.kill,
                    idle_s=config.idle_s, lease_grace_s=config.lease_grace_s,
                    internal_key=internal)
    server = uvicorn_server(create_front_door(router, config.limits, keys,
                                              allow_hosts=config.allow_hosts,
                                              allow_origins=config.allow_origins), config.limits,
                            grace_s=args.grace_seconds, lifespan="off")
    port = sock.getsockname()[1]
    async with anyio.create_task_group() as tg:
        await tg.start(router.run)

        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for sig in signals:
                    print(f"kvagent serve --ray: {signal.Signals(sig).name}: shutting down",
                          file=sys.stderr, flush=True)
                    if server.should_exit:
                        server.force_exit = True
                    server.should_exit = True

        async def announce() -> None:
            with anyio.fail_after(60):
                while not server.started:
                    await anyio.sleep(0.02)
            print(json.dumps({"event": "serve_ready", "url": f"http://{args.host}:{port}",
                              "port": port, "model": hosts[0].info.model,
                              "ray_address": address,
                              "hosts": {h.name: h.info.url for h in hosts}}), flush=True)

        tg.start_soon(on_signals)
        tg.start_soon(announce)
        await server.serve(sockets=[sock])
        await _stop_hosts(router)
        tg.cancel_scope.cancel()
    print(json.dumps({"event": "cluster_closed", "hosts": len(router.hosts)}),
          file=sys.stderr, flush=True)
    return 0


async def _stop_hosts(router: Any) -> None:
    """Ask every live host to stop (episodes closed, ledger back to zero) and wait."""
    async def stop(host: Any) -> None:
        try:
            with anyio.fail_after(90):
                await host.actor.stop.remote()
                await host.done
        except Exception as exc:  # noqa: BLE001  a host that does not stop is killed
            print(f"kvagent serve --ray: host {host.name} did not stop: {exc!r}"[:500],
                  file=sys.stderr)
            router.pool.host_lost(host, "did not stop")

    router.closing()
    with anyio.CancelScope(shield=True):
        async with anyio.create_task_group() as tg:
            for host in router.alive():
                tg.start_soon(stop, host)
