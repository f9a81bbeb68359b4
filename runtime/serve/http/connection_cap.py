"""Which connections a server closes when a new one arrives — a pure decision over plain
records (``server.py`` gathers them and does the closing).

A connection *waits* while it has not sent a complete request head: just opened, half-sent
(a slowloris), or an idle keep-alive between requests.  A waiting connection costs the
server a file descriptor and nothing else, and closing it loses no work — so when the
server is full, a newcomer closes the connection that has waited longest instead of being
refused.  Refusing newcomers (the old rule) let one client that holds the cap's worth of
idle sockets lock every other client out; now it must open connections faster than
legitimate clients send their heads (microseconds after connecting) to keep even one of
them out.  One peer (an IPv4 address, an IPv6 /64: what one host usually has) may hold at
most ``max_waiting_per_peer`` waiting connections: its next one closes its own
longest-waiting, so a single attacking host cannot fill the cap from one address at all.

Invariants: a connection whose request is being served (its head arrived) is never chosen;
the newcomer is never chosen to make room for itself unless nothing else can be closed
(``refuse_new``); after the closings, open connections are at most ``max_connections``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable, Sequence

import attrs


@attrs.frozen
class Waiting:
    """A connection without a complete request head (not the newcomer)."""

    key: Hashable
    peer: str  # ``peer_of`` its address
    since: float  # monotonic seconds: when it began to wait for this head


@attrs.frozen
class Closing:
    """What to do about a newcomer: close ``evict`` (keys of waiting connections) and, if
    ``refuse_new``, the newcomer itself."""

    evict: tuple[Hashable, ...] = ()
    refuse_new: bool = False


def peer_of(address: object) -> str:
    """The peer a socket address counts against: the IPv4 address, or the /64 of an IPv6
    one (a host is given a whole /64); anything else (a Unix socket) as text."""
    host = address[0] if isinstance(address, tuple) and address else address
    try:
        ip = ipaddress.ip_address(str(host))
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def closing_for(new_peer: str, num_open: int, waiting: Sequence[Waiting], *,
                max_connections: int, max_waiting_per_peer: int) -> Closing:
    """What a newcomer from ``new_peer`` closes.  ``num_open``: open connections counting
    the newcomer; ``waiting``: the other connections that wait for a head (the newcomer
    waits too)."""
    evict: list[Hashable] = []
    by_age = sorted(waiting, key=lambda w: w.since)
    own = [w for w in by_age if w.peer == new_peer]
    if len(own) + 1 > max_waiting_per_peer:  # (+1: the newcomer)
        evict += [w.key for w in own[:len(own) + 1 - max_waiting_per_peer]]
    over = num_open - len(evict) - max_connections
    if over > 0:
        chosen = set(evict)
        more = [w.key for w in by_age if w.key not in chosen][:over]
        evict += more
        if len(more) < over:
            return Closing(tuple(evict), refuse_new=True)
    return Closing(tuple(evict))
