"""Shared fixtures: tiny models forged once per test session into a temporary cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cachepolicy.forge import ForgedModel, forge_cached


@pytest.fixture(scope="session")
def forged(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., ForgedModel]:
    """``forged(arch, vision=True, size="tiny")`` → a ForgedModel, forged at most once."""
    cache = tmp_path_factory.mktemp("models")

    def get(arch: str, vision: bool = True, size: str = "tiny") -> ForgedModel:
        return forge_cached(arch, size, vision=vision, cache_dir=cache)

    return get


@pytest.fixture(scope="session")
def engines(forged: Callable[..., ForgedModel]) -> Iterator[Callable[..., object]]:
    """``engines(arch, vision=True)`` → a shared Engine (n_seq_max=3, n_batch=32).

    A small n_batch makes every prefill of more than 32 rows split into several batches, so
    the tests exercise chunking.  Tests must leave the sequences they use cleared.
    """
    from cachepolicy.engine import Engine, EngineConfig

    made: dict[tuple[str, bool], Engine] = {}

    def get(arch: str, vision: bool = True) -> Engine:
        key = (arch, vision)
        if key not in made:
            m = forged(arch, vision)
            made[key] = Engine(m.model_path, m.mmproj_path,
                               EngineConfig(n_ctx_per_seq=2048, n_seq_max=3, n_batch=32,
                                            n_threads=1))
        for s in range(3):
            made[key].clear(s)
        return made[key]

    yield get
    for e in made.values():
        e.close()


@pytest.fixture(autouse=True)
def _structlog_configuration_restored() -> Iterator[None]:
    """A test that runs a command (``runtime.cli.main`` configures logging, process-wide, at
    warning level) must not change what later tests log: ``capture_logs`` sees only what the
    configured level lets through."""
    import structlog

    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture(autouse=True, scope="session")
def _integrity_checks_everywhere() -> Iterator[None]:
    """Every scheduler in the suite checks its integrity (ledger vs engine) whenever it goes
    idle and when it closes (``KVAGENT_DEBUG=1``): a drift fails the test that caused it."""
    import os

    old = os.environ.get("KVAGENT_DEBUG")
    os.environ["KVAGENT_DEBUG"] = "1"
    yield
    if old is None:
        os.environ.pop("KVAGENT_DEBUG", None)
    else:
        os.environ["KVAGENT_DEBUG"] = old


@pytest.fixture
def kv_agents(forged: Callable[..., ForgedModel]) -> Iterator[Callable[..., object]]:
    """``kv_agents(**options)`` → a ``KvAgent`` on the forged tiny qwen35, with one thread,
    n_batch 64 and a 320x240 screen unless ``options`` say otherwise; closed after the test."""
    from runtime.osworld import KvAgent

    m = forged("qwen35")
    made: list[KvAgent] = []

    def make(**options: object) -> KvAgent:
        opts: dict[str, object] = {"model_path": m.model_path, "mmproj_path": m.mmproj_path,
                                   "n_threads": 1, "n_batch": 64, "screen_size": (320, 240)}
        opts.update(options)
        agent = KvAgent(**opts)  # type: ignore[arg-type]
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.close()


def skip_without_fast_kernels(model_path: object) -> None:
    """Skip the calling test where llama.cpp's repacked kernels crash (``fast_kernels``
    engines are then refused with the reason: ``cachepolicy.engine.fast_kernels``)."""
    from pathlib import Path

    from cachepolicy.engine.fast_kernels import fast_kernels_problem

    why = fast_kernels_problem(Path(str(model_path)).resolve())
    if why is not None:
        pytest.skip(f"fast_kernels unavailable here: {why}")
