"""Scale out on Ray: one model host per node behind one front door (``kvagent serve --ray``).

- ``host_actor.py``: a Ray actor running the same app and ``ModelHost`` as ``kvagent serve``;
- ``resume.py``: open an episode on a host, or rebuild one whose host was lost;
- ``placement.py``: where a new episode goes (most free ledger bytes, a free sequence);
- ``router.py``: the episode → host map, placement, rebuilding a lost host's episodes;
- ``hosts.py``: the hosts alive or lost, watched through Ray, replaced;
- ``forward.py``: HTTP to a host (a transport failure marks it lost);
- ``frontdoor.py``: the HTTP routes of ``kvagent serve``, forwarded;
- ``metrics.py``: ``GET /metrics`` summed over hosts;
- ``spawn.py``: Ray itself (connecting, starting host actors);
- ``osworld_run.py``: parallel OSWorld, env workers as Ray actors (run_multienv's role).

Ray is imported only where it is used (``spawn.py``, ``osworld_run.run_parallel``, the
command): the package imports without the ``[ray]`` extra.
"""

from runtime.cluster.placement import HostLoad, placement_order

__all__ = ["HostLoad", "placement_order"]
