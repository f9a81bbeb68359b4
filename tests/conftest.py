"""Shared fixtures: tiny models forged once per test session into a temporary cache.

The fixtures are kvagent's pytest plugin's (``runtime.testing.plugin``, loaded through its
``pytest11`` entry point, so not named in ``pytest_plugins`` here); ``forged``, ``engines``
and ``kv_agents`` are the names the suite has always used for them."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from cachepolicy.forge import ForgedModel


#: what ``pytest_configure`` put in the environment for JAX's persistent compilation cache
#: (``pytest_unconfigure`` takes it out again and removes the cache)
_SET_ENV: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    """One XLA compilation cache for the whole run, empty at its start: the trainer's tests
    compile the same toy graphs again and again (a toy ``kvagent train`` spends ~40 of its
    ~60 s compiling; with the graphs cached, ~25 s in all, the same bytes).  Set through the
    environment before any test module imports JAX, so commands the tests start in
    subprocesses share it; what the user set is left alone."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    _SET_ENV["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvagent-xla-")
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        _SET_ENV["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the toy graphs too
    os.environ.update(_SET_ENV)


def pytest_unconfigure(config: pytest.Config) -> None:
    for name in _SET_ENV:
        os.environ.pop(name, None)
    if cache := _SET_ENV.pop("JAX_COMPILATION_CACHE_DIR", None):
        shutil.rmtree(cache, ignore_errors=True)
    _SET_ENV.clear()


@pytest.fixture(scope="session")
def forged(kvagent_forged: Callable[..., ForgedModel]) -> Callable[..., ForgedModel]:
    """``forged(arch, vision=True, size="tiny")`` → a ForgedModel, forged at most once (the
    plugin's ``kvagent_forged``)."""
    return kvagent_forged


@pytest.fixture(scope="session")
def engines(kvagent_engine: Callable[..., object]) -> Callable[..., object]:
    """``engines(arch, vision=True)`` → a shared Engine (n_seq_max=3, n_batch=32): the
    plugin's ``kvagent_engine``.

    A small n_batch makes every prefill of more than 32 rows split into several batches, so
    the tests exercise chunking.  Tests must leave the sequences they use cleared.
    """
    return kvagent_engine


@pytest.fixture(scope="session")
def _structlog_pristine() -> dict[str, object]:
    """structlog's configuration before any test ran a command."""
    import structlog

    return structlog.get_config()


@pytest.fixture(autouse=True)
def _structlog_configuration_restored(_structlog_pristine: dict[str, object]) -> Iterator[None]:
    """A command run by a test or by a module fixture (``runtime.cli.main`` configures
    logging, process-wide, at warning level) must not change what other tests log:
    ``capture_logs`` sees only what the configured level lets through.  So every test starts
    and ends with the configuration the session started with (a module fixture's command runs
    before a test's own fixtures, and the suite's files run in any order on its workers)."""
    import structlog

    structlog.configure(**_structlog_pristine)
    yield
    structlog.configure(**_structlog_pristine)


@pytest.fixture(autouse=True, scope="session")
def _integrity_checks_everywhere() -> Iterator[None]:
    """Every scheduler in the suite checks its integrity (ledger vs engine) whenever it goes
    idle and when it closes (``KVAGENT_DEBUG=1``): a drift fails the test that caused it."""
    old = os.environ.get("KVAGENT_DEBUG")
    os.environ["KVAGENT_DEBUG"] = "1"
    yield
    if old is None:
        os.environ.pop("KVAGENT_DEBUG", None)
    else:
        os.environ["KVAGENT_DEBUG"] = old


@pytest.fixture
def kv_agents(kvagent_agent: Callable[..., object]) -> Callable[..., object]:
    """``kv_agents(**options)`` → a ``KvAgent`` on the forged tiny qwen35, with one thread,
    n_batch 64 and a 320x240 screen unless ``options`` say otherwise; closed after the test
    (the plugin's ``kvagent_agent``)."""
    return kvagent_agent


def skip_without_fast_kernels(model_path: object) -> None:
    """Skip the calling test where llama.cpp's repacked kernels crash (``fast_kernels``
    engines are then refused with the reason: ``cachepolicy.engine.fast_kernels``)."""
    from pathlib import Path

    from cachepolicy.engine.fast_kernels import fast_kernels_problem

    why = fast_kernels_problem(Path(str(model_path)).resolve())
    if why is not None:
        pytest.skip(f"fast_kernels unavailable here: {why}")
