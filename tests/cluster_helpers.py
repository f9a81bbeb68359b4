"""Test helper: a multi-node Ray cluster on this machine, all on loopback — a head that
offers no model host and ``nodes`` worker nodes offering one ``kvagent_host`` unit each
(Ray's own ``cluster_utils.Cluster``: separate raylets, as separate machines would run)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from runtime.cluster.spawn import LOOPBACK_ENV, RESOURCE

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="the [ray] extra is not installed")


@contextmanager
def ray_nodes(nodes: int = 2) -> Iterator[str]:
    """Start the cluster; yield its address (for ``kvagent serve --ray --address``)."""
    os.environ[LOOPBACK_ENV] = "0"  # before ray is imported; inherited by every raylet
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    try:
        for _ in range(nodes):
            cluster.add_node(node_ip_address="127.0.0.1", num_cpus=1, resources={RESOURCE: 1})
        yield cluster.address
    finally:
        cluster.shutdown()
