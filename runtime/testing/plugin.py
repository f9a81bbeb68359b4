"""kvagent's pytest plugin (entry point ``pytest11``: loaded by every pytest run where kvagent is
installed): fixtures for tests of agents and cache policies built on kvagent.

===========================  =========  =========================================================
fixture                      scope      gives
===========================  =========  =========================================================
``kvagent_forged``           session    ``(arch, vision=True, size="tiny")`` → a ``ForgedModel``
``kvagent_engine``           session    ``(arch, vision=True)`` → a shared ``Engine`` on it
``kvagent_shipped_engine``   session    ``(arch="qwen35")`` → a shared ``Engine`` on the trained agent
``kvagent_simdesk``          function   ``(width=320, height=240, **config)`` → a ``SimDesk`` env
``kvagent_scheduler``        function   ``(engine_or_arch, budget=..., agent=..., screen=...)`` →
                                        ``async with``: a ``Scheduler``; its ledger checked at 0
``kvagent_agent``            function   ``(**options)`` → a ``KvAgent`` (forged tiny qwen35)
``kvagent_server``           session    a ``kvagent serve`` on loopback: ``url``, ``api_key``,
                                        ``model``, ``headers``
``kvagent_assert_exact``     function   ``await (policy, reference, engine=...)``: same tokens
===========================  =========  =========================================================

Nothing here needs an event loop of its own: the async parts (``kvagent_scheduler``,
``kvagent_assert_exact``) are awaited inside the test, so they run under pytest-asyncio and
anyio alike.  Engines compute with ``kvagent_threads`` threads (an ini option, default 1).
docs/testing.md shows them at work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# This module is imported by every pytest run in an environment with kvagent installed, so it
# imports nothing of kvagent at module level (that loads numpy, Pillow and libllama): each
# fixture imports what it uses, when a test asks for it.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("kvagent_threads", "threads each kvagent test engine computes with",
                  default="1")


@pytest.fixture(scope="session")
def _kvagent_shelf(tmp_path_factory: pytest.TempPathFactory,
                   pytestconfig: pytest.Config) -> Iterator[Any]:
    """The session's forged models (in a temporary directory) and engines, closed at the
    end."""
    # imported when a test asks for a model: loading the engine's module loads libllama
    from runtime.testing.engines import Shelf

    shelf = Shelf(tmp_path_factory.mktemp("kvagent-models"),
                  threads=int(pytestconfig.getini("kvagent_threads")))
    yield shelf
    shelf.close()


@pytest.fixture(scope="session")
def kvagent_forged(_kvagent_shelf: Any) -> Callable[..., Any]:
    """``kvagent_forged(arch, vision=True, size="tiny")`` → a ``ForgedModel`` (random weights,
    a real GGUF llama.cpp loads: ``llama``, ``qwen35``, ``qwen35moe``...), forged at most once
    a session."""
    return _kvagent_shelf.forged


@pytest.fixture(scope="session")
def kvagent_engine(_kvagent_shelf: Any) -> Callable[..., Any]:
    """``kvagent_engine(arch, vision=True)`` → the session's ``Engine`` on the forged tiny
    ``arch`` model (3 sequences of 2048 positions, n_batch 32 so prefills are chunked),
    with its sequences cleared.  Shared: leave the sequences you use cleared."""
    return _kvagent_shelf.engine


@pytest.fixture(scope="session")
def kvagent_shipped_engine(_kvagent_shelf: Any) -> Callable[..., Any]:
    """``kvagent_shipped_engine(arch="qwen35")`` → the session's ``Engine`` on the trained
    agent kvagent ships (``runtime/agent_models``: it solves simdesk's tasks from 640x384
    screenshots), 3 sequences of 4096 positions, its sequences cleared."""
    return _kvagent_shelf.shipped_engine


@pytest.fixture
def kvagent_simdesk() -> Callable[..., Any]:
    """``kvagent_simdesk(width=320, height=240, **config)`` → a fresh ``SimDesk`` (the
    deterministic simulated desktop; ``config``: ``SimDeskConfig``'s fields, e.g.
    ``action_latency_s``, ``max_steps``); ``await env.reset("open-terminal")`` starts a
    task (a classic one's name or ``"KIND@SEED"``)."""
    # imported when a test asks for it: the simulated desktop loads Pillow
    from vmenv.simdesk import SimDesk, SimDeskConfig

    def make(width: int = 320, height: int = 240, **config: Any) -> Any:
        return SimDesk(SimDeskConfig(width=width, height=height, **config))

    return make


@pytest.fixture
def kvagent_scheduler(_kvagent_shelf: Any) -> Callable[..., Any]:
    """``async with kvagent_scheduler("qwen35", budget=256 << 20) as sched:`` → a
    ``Scheduler`` over ``kvagent_engine(arch)`` (or the ``Engine`` given) with a memory
    ledger of ``budget`` bytes (default unlimited), set up for ``agent`` (an
    ``AgentConfig``) on ``screen`` (default 320x240); integrity is checked whenever it is
    idle, and at the end of the block no episode may be left open and the ledger must be
    back at zero (``LedgerLeakError``)."""
    # imported when a test asks for it: the scheduler's modules load the engine's
    from runtime.testing.scheduling import open_scheduler

    def make(engine: Any = "qwen35", **options: Any) -> Any:
        if isinstance(engine, str):
            engine = _kvagent_shelf.engine(engine)
        return open_scheduler(engine, **options)

    return make


@pytest.fixture
def kvagent_agent(kvagent_forged: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """``kvagent_agent(**options)`` → a ``KvAgent`` (the OSWorld agent class) on the forged
    tiny qwen35 with one thread, n_batch 64 and a 320x240 screen unless ``options`` say
    otherwise (``model_path=None, mmproj_path=None``: the shipped trained agent;
    ``server=URL``: a thin client of a ``kvagent serve``); closed after the test."""
    # imported when a test asks for it: the agent's module loads the runtime
    from runtime.osworld import KvAgent

    m = kvagent_forged("qwen35")
    made: list[Any] = []

    def make(**options: Any) -> Any:
        opts: dict[str, Any] = {"model_path": m.model_path, "mmproj_path": m.mmproj_path,
                                "n_threads": 1, "n_batch": 64, "screen_size": (320, 240)}
        if "server" in options:  # a client of a server loads no model
            opts = {"screen_size": (320, 240)}
        opts.update(options)
        agent = KvAgent(**opts)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()


@pytest.fixture(scope="session")
def kvagent_server(kvagent_forged: Callable[..., Any],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real ``kvagent serve`` process on loopback over the forged tiny qwen35, with one
    fresh API key: ``.url``, ``.api_key``, ``.model`` (the id clients send), ``.headers``
    (the key's Authorization header), ``.openai_base_url``.  Shared by the session; stopped
    with SIGTERM at its end and checked to have exited cleanly."""
    # imported when a test asks for it: only the subprocess loads the model
    from runtime.testing.serving import keyed_server

    model_dir = Path(kvagent_forged("qwen35").model_path).parent
    with keyed_server(model_dir, tmp_path_factory.mktemp("kvagent-serve")) as server:
        yield server


@pytest.fixture
def kvagent_assert_exact(_kvagent_shelf: Any) -> Callable[..., Any]:
    """``await kvagent_assert_exact(policy, reference, engine="qwen35", **options)``: the
    bench trajectory replayed through ``policy`` and its exact ``reference`` (cache policy
    names, or bench arms such as ``"terminal-slot+overlap"``) on ``kvagent_engine(arch)`` (or
    the ``Engine`` given) must decode the same tokens at every step (``NotExactError``
    otherwise); returns both runs.  ``options``: ``runtime.testing.assert_exact``'s."""
    # imported when a test asks for it: the bench's replay loads the engine's modules
    from runtime.testing.exactness import assert_exact

    async def check(policy: str, reference: str, *, engine: Any = "qwen35",
                    **options: Any) -> Any:
        if isinstance(engine, str):
            engine = _kvagent_shelf.engine(engine)
        return await assert_exact(engine, policy, reference, **options)

    return check
