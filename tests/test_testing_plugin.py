"""kvagent's pytest plugin (``runtime.testing``): registered as a ``pytest11`` entry point and
loaded once, light to load, each fixture doing what it says — and the example a user copies
(examples/test_my_policy.py) passing with pytest alone, in place and outside the project."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import httpx
import pytest

from runtime.agent_models import AGENT_DIR
from runtime.commands.options import bench_agent_defaults
from runtime.config import AgentConfig
from runtime.driver import EpisodeDriver
from runtime.engine_setup import load_engine
from runtime.metrics import EpisodeResult, StepMetrics
from runtime.testing import (
    FIXED_DECODE, FORGED_CONFIG, LedgerLeakError, NotExactError, assert_engine_exact,
    assert_same_outputs, forged_files,
)
from runtime.testing import plugin

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "test_my_policy.py"


def test_the_plugin_is_registered_and_loaded_once(request) -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11")
                if e.name == "kvagent"]
    assert entry.value == "runtime.testing.plugin" and entry.load() is plugin
    manager = request.config.pluginmanager
    assert manager.get_plugin("kvagent") is plugin
    assert [p for p in manager.get_plugins() if p is plugin] == [plugin]


def test_loading_the_plugin_loads_nothing_heavy() -> None:
    """Every pytest run in an environment with kvagent imports the plugin: it must not load
    libllama (nor the engine, numpy or Pillow) until a test asks for a model."""
    probe = ("import sys, runtime.testing.plugin, runtime.testing; "
             "print(sorted(m for m in ('llama_cpp', 'cachepolicy.engine', 'numpy', 'PIL') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_suites_fixtures_are_the_plugins(forged, kvagent_forged, engines,
                                            kvagent_engine) -> None:
    assert forged is kvagent_forged and engines is kvagent_engine


def test_forged_models_and_engines_are_made_once_and_handed_out_clean(
        kvagent_forged, kvagent_engine) -> None:
    m = kvagent_forged("llama", vision=False)
    made = m.model_path.stat().st_mtime_ns
    assert kvagent_forged("llama", vision=False) == m and m.mmproj_path is None
    assert m.model_path.stat().st_mtime_ns == made  # forged once, then read back
    e = kvagent_engine("llama", vision=False)
    c = e.config
    assert (c.n_ctx_per_seq, c.n_seq_max, c.n_batch) == (2048, 3, 32) and not e.has_vision
    assert Path(e.model_path) == m.model_path
    e.prefill_tokens(1, e.tokenize("a sequence left full"), logits=False)
    assert e.seq_info(1).n_tokens > 0
    again = kvagent_engine("llama", vision=False)
    assert again is e and e.seq_info(1).n_tokens == 0  # cleared before it is handed out
    assert kvagent_engine("qwen35").has_vision


def test_the_shipped_engine_is_the_trained_agent(kvagent_shipped_engine) -> None:
    e = kvagent_shipped_engine()
    assert Path(e.model_path) == AGENT_DIR / "agent-qwen35.gguf" and e.has_vision
    assert kvagent_shipped_engine("qwen35") is e


async def test_simdesk_factory_gives_a_fresh_desktop(kvagent_simdesk) -> None:
    env = kvagent_simdesk(400, 300, max_steps=1)
    obs = await env.reset("open-terminal")
    assert obs.size == (400, 300) and obs.screenshot.startswith(b"\x89PNG")
    assert kvagent_simdesk() is not env and kvagent_simdesk().config.width == 320


async def _one_step(sched, agent: AgentConfig, env, *, close: bool = True) -> None:
    obs = await env.reset("open-terminal")
    driver = EpisodeDriver.open(sched, sched.factory, agent, "ep0", obs.instruction, obs.size)
    step = await driver.act(obs.screenshot, screen=obs.size)
    assert step.act.parsed
    assert sched.ledger.snapshot().held > 0  # the episode holds its cache now
    if close:
        await driver.aclose()


async def test_scheduler_ledger_returns_to_zero(kvagent_scheduler, kvagent_simdesk) -> None:
    agent = AgentConfig()  # grammar-constrained: even random weights give an action
    budget = 64 << 20
    async with kvagent_scheduler("qwen35", budget=budget, agent=agent) as sched:
        assert sched.ledger.budget == budget and sched.debug  # checks itself when idle
        await _one_step(sched, agent, kvagent_simdesk())
        assert 0 < sched.ledger.snapshot().peak <= budget
    snap = sched.ledger.snapshot()
    assert (snap.held, snap.reserved) == (0, 0)


@pytest.mark.anyio
async def test_scheduler_fixture_fails_a_test_that_leaves_an_episode_open(
        kvagent_scheduler, kvagent_simdesk) -> None:
    agent = AgentConfig()  # grammar-constrained: even random weights give an action
    with pytest.raises(LedgerLeakError, match="episodes left open"):
        async with kvagent_scheduler("qwen35", agent=agent) as sched:
            await _one_step(sched, agent, kvagent_simdesk(), close=False)
    assert sched.ledger.snapshot().held == 0  # closing the scheduler still closed it


def test_the_server_takes_its_key_and_refuses_others(kvagent_server) -> None:
    assert kvagent_server.url.startswith("http://127.0.0.1:")
    assert kvagent_server.api_key not in repr(kvagent_server)
    with httpx.Client(base_url=kvagent_server.url, timeout=60) as c:
        assert c.get("/health").status_code == 200  # the one route without a key
        models = c.get("/v1/models", headers=kvagent_server.headers)
        assert models.status_code == 200, models.text
        assert [m["id"] for m in models.json()["data"]] == [kvagent_server.model]
        for wrong in ({}, {"authorization": "Bearer not-the-key-000"}):
            r = c.get("/v1/models", headers=wrong)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_fixed_decode_is_the_benchs() -> None:
    assert FIXED_DECODE == bench_agent_defaults()


@pytest.mark.anyio
async def test_exactness_fixture_passes_exact_pairs_and_fails_the_rest(
        kvagent_assert_exact) -> None:
    slot, scratch = await kvagent_assert_exact("terminal-slot", "terminal-scratch",
                                               engine="qwen35", steps=4)
    assert slot.output_sha256 == scratch.output_sha256
    assert {s.start for s in slot.episode.steps[1:]} == {"truncate"}  # it did reuse
    # another prompt decodes other tokens: caught, with the step that differs
    with pytest.raises(NotExactError, match=r"step \d differs"):
        await kvagent_assert_exact("evict", "terminal-scratch", engine="llama", steps=4)
    # greedy on random weights repeats one token whatever the prompt: refused, not passed
    with pytest.raises(NotExactError, match="over and over"):
        await kvagent_assert_exact("evict", "terminal-scratch", engine="llama", steps=2,
                                   agent=FIXED_DECODE)
    # a policy refused on this model is nothing to compare, never a pass
    with pytest.raises(NotExactError, match="did not run"):
        await kvagent_assert_exact("relocate", "terminal-scratch", engine="qwen35", steps=2)


def test_same_outputs_needs_something_to_compare() -> None:
    def run(*tokens: tuple[int, ...], status: str = "done") -> EpisodeResult:
        steps = tuple(StepMetrics(episode_id="e", step=i, status="ok", output_tokens=t)
                      for i, t in enumerate(tokens))
        return EpisodeResult("e", None, status, 0.0, steps)

    assert_same_outputs(run((1, 2), (3,)), run((1, 2), (3,)))
    for got, ref, why in ((run((1, 2), (3,)), run((1, 2), (4,)), "step 1 differs"),
                          (run((1,)), run((1,), (2,)), "1 steps against"),
                          (run(), run(), "nothing to compare"),
                          (run((), ()), run((), ()), "no step decoded"),
                          (run((7, 7), (7,)), run((7, 7), (7,)), "over and over"),
                          (run((1,), status="error"), run((1,)), "nothing to compare")):
        with pytest.raises(NotExactError, match=why):
            assert_same_outputs(got, ref)


def test_engine_oracle_assertion_passes_and_can_fail(kvagent_forged) -> None:
    files = forged_files(kvagent_forged("llama", vision=False), vision=False)
    config = attrs.evolve(FORGED_CONFIG, n_seq_max=2, n_batch=64)
    with load_engine(files, config, vision=False) as engine:
        assert_engine_exact(engine, only=("split_prefill", "restore_same_seq", "tail_trim"))
    # flash attention makes a split prefill drift from one call: the assertion says so
    with load_engine(files, attrs.evolve(config, flash_attn=True), vision=False) as engine:
        with pytest.raises(NotExactError, match="split_prefill"):
            assert_engine_exact(engine, only=("split_prefill",))


@pytest.mark.parametrize("where", ["in place", "copied out of the project"])
def test_the_example_passes_with_pytest_alone(where: str, tmp_path: Path) -> None:
    """In examples/ (the project's pytest settings apply: asyncio_mode=auto) and copied with
    the policy it tests into a directory of its own (no settings: pytest-asyncio's strict
    mode), as a user copies it."""
    cwd = EXAMPLE.parent
    if where != "in place":
        for name in (EXAMPLE.name, "custom_policy.py"):
            shutil.copy(EXAMPLE.parent / name, tmp_path / name)
        cwd = tmp_path
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          EXAMPLE.name], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "3 passed" in out.stdout
