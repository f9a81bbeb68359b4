"""OSWorld result layout: paths, durability as the episode goes, refused escapes; and
run_agents recording real episodes (tiny forged model), isolating failures and cancellation."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from runtime.run.recording import (
    METRICS_FILE, RESULT_FILE, TRAJ_FILE, EpisodeRecorder, ResultLayout, UnsafePathError,
)
from runtime.config import AgentConfig
from runtime.run.agents import EpisodeSpec, RunConfig, run_agents, simdesk_specs
from vmenv.errors import EnvClosedError
from vmenv.simdesk.env import SimDesk, SimDeskConfig

PNG = b"\x89PNG\r\n\x1a\n fake"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_layout_is_osworlds(tmp_path: Path) -> None:
    layout = ResultLayout(tmp_path, model="holo3")
    assert layout.task_dir("open-terminal-ep0") == (
        tmp_path.resolve() / "pyautogui" / "screenshot" / "holo3" / "simdesk" / "open-terminal-ep0")
    assert not any(tmp_path.iterdir())  # looking a directory up creates nothing


def test_lines_are_on_disk_while_the_episode_runs(tmp_path: Path) -> None:
    layout = ResultLayout(tmp_path, model="m")
    rec = EpisodeRecorder.create(layout, "t1")
    name = rec.record_step(step_num=1, action="pyautogui.click(x=1, y=2)", response="click(1, 2)",
                           reward=0.0, done=False, info={"success": False}, screenshot=PNG,
                           metrics={"prefill_tokens": 10})
    d = layout.task_dir("t1")
    # still open: another reader sees complete lines and the PNG they name
    traj = _lines(d / TRAJ_FILE)
    assert traj == [{"step_num": 1, "action_timestamp": traj[0]["action_timestamp"],
                     "action": "pyautogui.click(x=1, y=2)", "response": "click(1, 2)",
                     "reward": 0.0, "done": False, "info": {"success": False},
                     "screenshot_file": name}]
    assert name == f"step_1_{traj[0]['action_timestamp']}.png"
    assert (d / name).read_bytes() == PNG
    assert _lines(d / METRICS_FILE) == [{"step_num": 1, "prefill_tokens": 10}]
    assert not (d / RESULT_FILE).exists()
    rec.record_step(step_num=2, action="DONE", response="done()", reward=1.0, done=True,
                    info={}, screenshot=PNG, metrics={})
    assert len(_lines(d / TRAJ_FILE)) == 2
    rec.finish(1.0)
    rec.close()
    assert (d / RESULT_FILE).read_text() == "1.0\n"
    # a rerun into the same directory starts clean
    with EpisodeRecorder.create(layout, "t1"):
        assert sorted(p.name for p in d.iterdir()) == [METRICS_FILE, TRAJ_FILE]


@pytest.mark.parametrize("task_id", ["../x", "/abs", "a/b", "..", ".", "", "  ", "a\x00b",
                                     "a\\b", "x\ny"])
def test_escaping_task_ids_are_refused_before_writing(tmp_path: Path, task_id: str) -> None:
    layout = ResultLayout(tmp_path / "results", model="m")
    with pytest.raises(UnsafePathError):
        EpisodeRecorder.create(layout, task_id)
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("field", ["model", "domain"])
@pytest.mark.parametrize("value", ["..", "a/b", "/abs", "", "a\x00"])
def test_escaping_model_or_domain_refused(tmp_path: Path, field: str, value: str) -> None:
    with pytest.raises(UnsafePathError):
        ResultLayout(tmp_path, **{"model": "m", field: value})
    assert not any(tmp_path.iterdir())


def test_symlink_out_of_the_result_dir_refused(tmp_path: Path) -> None:
    layout = ResultLayout(tmp_path / "results", model="m")
    layout.domain_dir.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (layout.domain_dir / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePathError):
        EpisodeRecorder.create(layout, "link")
    assert not any((tmp_path / "elsewhere").iterdir())


def _config(**kw: object) -> RunConfig:
    base = {"episodes": 2, "max_steps": 2, "screen": (320, 240), "vm_seconds": 0.01,
            "agent": AgentConfig(temperature=1.0, seed=1), "memory_budget": 1 << 34}
    return RunConfig(**{**base, **kw})


async def test_run_agents_records_as_it_goes(engines, tmp_path: Path) -> None:
    layout = ResultLayout(tmp_path, model="tiny")
    seen: list[tuple[str, int, int]] = []

    def on_event(event) -> None:
        if event.kind == "step":  # the step's lines are durable before its event
            d = layout.task_dir(event.spec.task_id)
            seen.append((event.spec.episode_id, event.step, len(_lines(d / TRAJ_FILE))))
            assert event.summary.startswith("episodes: ")

    result = await run_agents(engines("qwen35"), _config(), layout, on_event=on_event)
    # every step's event saw exactly that many lines on disk (an episode may end early: a
    # random model can sample done())
    assert all(lines == step for _, step, lines in seen)
    specs = {s.episode_id: s for s in simdesk_specs(_config())}
    for e in result.episodes:
        assert [s for ep, s, _ in seen if ep == e.episode_id] == list(range(1, e.n_steps + 1))
    for e in result.episodes:
        directory = result.directories[e.episode_id]
        assert e.status != "error" and directory == layout.task_dir(specs[e.episode_id].task_id)
        rows = _lines(directory / METRICS_FILE)
        assert len(rows) == e.n_steps
        # metrics.jsonl is the StepMetrics record, field for field
        assert [r["output_tokens"] for r in rows] == [list(s.output_tokens) for s in e.steps]
        assert all(r["prefill_tokens"] == r["critical_path_prefill_tokens"]
                   + r["prefetch_prefill_tokens"] for r in rows)
        assert (directory / RESULT_FILE).exists()


async def test_a_failing_episode_does_not_stop_the_others(engines, tmp_path: Path) -> None:
    config = _config()
    good = simdesk_specs(config)[0]
    bad = EpisodeSpec(1, "ep1", "no-such-task", "no-such-task-ep1", "do something")
    layout = ResultLayout(tmp_path, model="tiny")
    result = await run_agents(engines("qwen35"), config, layout, specs=[good, bad])
    ok, failed = result.episodes
    assert ok.status != "error" and ok.n_steps >= 1
    assert failed.status == "error" and "UnknownTaskError" in failed.error
    assert result.errors == (failed,)
    failed_dir = result.directories[failed.episode_id]
    assert _lines(failed_dir / TRAJ_FILE) == [
        {"Error": f"no-such-task-ep1 - {failed.error}"}]
    assert not (failed_dir / RESULT_FILE).exists()


async def test_cancellation_closes_envs_and_frees_sequences(engines, tmp_path: Path) -> None:
    engine = engines("qwen35")
    envs: list[SimDesk] = []

    def make_env(spec: EpisodeSpec) -> SimDesk:
        envs.append(SimDesk(SimDeskConfig(width=320, height=240, action_latency_s=30.0)))
        return envs[-1]

    with anyio.move_on_after(3.0) as scope:
        await run_agents(engine, _config(max_steps=5), ResultLayout(tmp_path, model="tiny"),
                         make_env=make_env)
    assert scope.cancelled_caught and len(envs) == 2
    for env in envs:
        with pytest.raises(EnvClosedError):
            await env.reset()
    assert all(engine.seq_info(s).n_tokens == 0 for s in range(engine.config.n_seq_max))
