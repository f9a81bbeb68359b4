"""The model host behind ``kvagent serve``: one engine, one scheduler, one memory ledger and
the episodes of every client — the serve domain's root, which HTTP (``runtime/serve/http``)
and a cluster's host actor sit on.

``ModelHost.running(config)`` loads the engine (off the event loop), runs an ``EpisodePool``
and the episodes' ``Leases`` in a task group it owns, and on the way out stops them
(prefetches cancelled, episodes closed, the ledger back to zero) and frees the engine.  It
wires the domain's collaborators, each given what it uses: ``episodes`` (the episode API),
``chat`` (chat completions) and the ``conversations`` both see, over the one ``pool``; the
one ``slots`` rule every open asks; ``leases`` (clients saying they are alive); ``status`` /
``gauges`` report on it.

Shutdown (``drain``): in-flight requests get the grace period to finish; then the scheduler
stops what still runs or waits (``Scheduler.shut_down``) — each such step rolls back and its
request is answered ``503 server_shutting_down`` (a stream: an error event, then ``[DONE]``)
— and ``running`` closes every episode, each exactly once, the ledger back to zero.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import structlog

from cachepolicy.engine import Engine
from cachepolicy.segments import SegmentFactory
from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.engine_setup import load_engine, resolve_model
from runtime.pool import EpisodePool, PoolClosedError
from runtime.serve.chat import ChatService
from runtime.serve.config import ServeConfig
from runtime.serve.conversations import Conversations
from runtime.serve.episodes import EpisodeService
from runtime.serve.ids import IdCounter
from runtime.serve.leases import Leases
from runtime.serve.prometheus import ServeMetrics
from runtime.serve.slots import SlotRule
from scheduler.ledger import MemoryLedger
from scheduler.slots import IMAGE_CACHE

log = structlog.get_logger("kvagent.serve")


class ModelHost:
    """One model's running parts and the domain services over them (see the module
    docstring); made by ``running``."""

    def __init__(self, config: ServeConfig, engine: Engine, model_name: str) -> None:
        self.config, self.engine, self.model_name = config, engine, model_name
        self.factory = SegmentFactory(engine)
        self.ledger = MemoryLedger(config.memory_budget)
        self.pool = EpisodePool(self.factory, self.ledger, max_episodes=config.max_episodes,
                                options=config.agent.step_options(config.screen),
                                wait_s=config.wait_s)
        self.metrics = ServeMetrics()
        # (the slot rule sees the conversations and leases; they ask it when opening)
        self.conversations = Conversations(self.pool, lambda p: self.slots.evictable(p))
        self.leases = Leases(grace_s=config.lease_grace_s,
                             end=lambda eid: self.episodes.expire(eid),
                             busy=lambda eid: self.episodes.busy(eid))
        self.slots = SlotRule(self.conversations, self.leases, idle_s=config.idle_s)
        self.episodes = EpisodeService(self.pool, self.conversations, self.leases, self.slots,
                                       screen=config.screen, numbers=IdCounter(),
                                       metrics=self.metrics)
        self.chat = ChatService(self.pool, self.factory, self.conversations, config,
                                metrics=self.metrics,
                                is_end_of_generation=engine.is_end_of_generation)

    @classmethod
    @asynccontextmanager
    async def running(cls, config: ServeConfig) -> AsyncIterator[ModelHost]:
        engine, name = await anyio.to_thread.run_sync(functools.partial(_load, config))
        try:
            host = cls(config, engine, name)
            host.check_episode_config(config.agent, config.screen)  # refuse what it cannot run
            async with anyio.create_task_group() as tg:
                await tg.start(host.pool.run)
                await tg.start(host.leases.run)
                log.info("serve_host_ready", model=name, kind=engine.kind.value,
                         max_episodes=config.max_episodes, mode=config.mode)
                try:
                    yield host
                finally:
                    host.leases.stop()
                    host.pool.stop()
        finally:
            engine.close()
            log.info("serve_host_closed")

    async def drain(self, grace_s: float) -> None:
        """The server is shutting down (it takes no new connections): give the requests
        in flight ``grace_s`` seconds, then stop every step still running or waiting — it
        rolls back and its request is answered with ``ShuttingDownError`` (503
        ``server_shutting_down``).  Returns after that; the episodes close when the host's
        ``running`` block ends.  The caller cancels it when the server is done first."""
        log.info("serve_draining", grace_s=grace_s, summary=self.pool.summary())
        await anyio.sleep(grace_s)
        try:
            scheduler = self.pool.scheduler
        except PoolClosedError:  # the host already stopped: nothing runs
            return
        log.warning("serve_grace_expired", grace_s=grace_s, summary=self.pool.summary())
        scheduler.shut_down(f"the server is shutting down (its grace period of {grace_s:g} s "
                            f"ended)")

    def check_episode_config(self, agent: AgentConfig, screen: Screen | None) -> None:
        """Refuse, when an episode is created, what its steps could not run: a policy the
        model cannot take (``PolicyRefusedError``), a profile's grammar or sampling that does
        not build (``ValueError``)."""
        screen = screen or self.config.screen
        self.pool.check_policy(agent.make_policy(self.factory, screen))
        agent.step_options(screen)

    def status(self) -> dict[str, Any]:
        snap = self.ledger.snapshot()
        return {"status": "ok", "model": self.model_name,
                "episodes": {"open": len(self.pool.episodes),
                             "max": self.config.max_episodes},
                "ledger": {"budget_bytes": snap.budget, "held_bytes": snap.held,
                           "reserved_bytes": snap.reserved, "peak_bytes": snap.peak},
                "summary": self.pool.scheduler.summary(), "leases": self.leases.summary()}

    def gauges(self) -> Iterator[tuple[str, str, dict[str, str], float]]:
        snap = self.ledger.snapshot()
        yield ("kvagent_episodes_open", "Open episodes (conversations included).", {},
               len(self.pool.episodes))
        yield ("kvagent_episodes_max", "Episode slots (--max-episodes).", {},
               self.config.max_episodes)
        for kind, value in (("budget", snap.budget), ("held", snap.held),
                            ("reserved", snap.reserved), ("peak", snap.peak)):
            yield ("kvagent_ledger_bytes", "The memory ledger.", {"kind": kind}, value)
        # the embedding cache, as three counts the idle integrity check compares: its
        # capacity (rung 1 shrinks it, releases give it back up to the target), what its
        # entries hold, and what the ledger holds for it
        scheduler = self.pool.scheduler
        cache = self.engine.image_cache_stats()
        for kind, value in (("capacity", cache.max_bytes), ("entries", cache.entry_bytes),
                            ("target", scheduler.pressure.image_cache_target),
                            ("ledger", self.ledger.held_by(IMAGE_CACHE))):
            yield ("kvagent_image_cache_bytes", "The image-embedding cache.", {"kind": kind},
                   value)
        # what the scheduler did: admissions, the fallback ladder's rungs (trims, evictions,
        # the cache's shrinks and regrows), integrity checks (KVAGENT_DEBUG=1: at every idle
        # moment)
        for event, n in sorted(scheduler.counters.items()):
            yield ("kvagent_scheduler_events", "What the scheduler did, by event (counts).",
                   {"event": event}, n)
        stats = self.engine.decode_stats()
        yield ("kvagent_decode_calls", "llama_decode calls of the decode lanes.", {},
               stats.calls)
        yield ("kvagent_decode_rows", "Generated tokens fed back through the lanes.", {},
               stats.rows)


def _load(config: ServeConfig) -> tuple[Engine, str]:
    """Load the engine (blocking): the given model, or the default one."""
    files = resolve_model(config.model_path, config.mmproj_path)
    if (note := files.note()) is not None:
        log.warning("serve_default_model", note=note)
    engine = load_engine(files, config.engine)
    # the id clients send: --model-name, else what results call the model (the file stem;
    # the default's own name, e.g. kvagent-agent-qwen35, which already says it is kvagent's)
    return engine, config.model_name or files.name
