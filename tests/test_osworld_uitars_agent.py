"""OSWorld's own UI-TARS agents (``mm_agents.uitars15_v1`` / ``uitars15_v2`` / ``uitars_agent``
from the desktop-env 1.0.2 wheel) reset the way ``lib_run_single.run_single_example`` calls
them — ``agent.reset(runtime_logger, vm_ip=env.vm_ip)``, then ``agent.reset(vm_ip=...)`` —
with the real DesktopEnv on the loopback VM giving ``vm_ip``.  As published both forms raise
``TypeError``; ``runtime.osworld.mm_agents.uitars_agent_class`` is the fix docs/serving.md
gives."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import pytest

from runtime.osworld.mm_agents import UITARS_MODULES, uitars_agent_class
from vmenv.osworld_vm import simdesk_example, vm_server
from vmenv.osworld_vm.desktop_env_import import DESKTOP_ENV_INSTALL, load_desktop_env

pytest.importorskip("loguru", reason="OSWorld's UI-TARS agents import loguru (test extra)")
try:
    DesktopEnv = load_desktop_env().DesktopEnv
except ModuleNotFoundError as exc:
    if exc.name != "desktop_env":
        raise
    pytest.skip(f"OSWorld's desktop_env is not installed: {DESKTOP_ENV_INSTALL}",
                allow_module_level=True)

from vmenv.osworld_vm.provider import LOOPBACK_REGION, PROVIDER_NAME  # noqa: E402

SCREEN = (320, 240)
#: what OSWorld's run_multienv_uitars15_v1.py builds its agent with
V1_CONF = {"infer_mode": "qwen25vl_normal", "prompt_style": "qwen25vl_normal",
           "input_swap": True, "language": "English", "history_n": 5, "max_pixels": 2116800,
           "min_pixels": 3136, "callusr_tolerance": 3, "temperature": 0.0, "top_k": -1,
           "top_p": 0.9, "max_tokens": 1000}


def _make(cls: Any, module: str) -> Any:
    if module == "uitars15_v2":
        return cls(model="ui-tars", model_type="qwen25vl", max_tokens=500, top_p=0.9,
                   temperature=0.0, max_trajectory_length=None, max_image_history_length=5)
    return cls(model="ui-tars", runtime_conf=V1_CONF)


@pytest.mark.parametrize("module", sorted(UITARS_MODULES))
def test_osworlds_uitars_agent_resets_as_run_single_example_calls_it(
        module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOUBAO_API_URL", "http://127.0.0.1:9/v1")  # never called here
    monkeypatch.setenv("DOUBAO_API_KEY", "unused")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    monkeypatch.chdir(tmp_path)
    published = getattr(importlib.import_module(f"mm_agents.{module}"), UITARS_MODULES[module])
    runtime_logger = logging.getLogger(f"desktopenv.example.uitars-{module}")
    with vm_server("click-ok", SCREEN) as vm:
        env = DesktopEnv(provider_name=PROVIDER_NAME, region=LOOPBACK_REGION,
                         path_to_vm=vm.address, action_space="pyautogui", screen_size=SCREEN,
                         headless=True, os_type="Ubuntu", require_a11y_tree=False,
                         cache_dir=str(tmp_path / "cache"))
        try:
            env.reset(task_config=simdesk_example("click-ok"))
            assert env.vm_ip
            raw = _make(published, module)
            with pytest.raises(TypeError):  # run_single_example's first form ...
                raw.reset(runtime_logger, vm_ip=env.vm_ip)
            with pytest.raises(TypeError):  # ... and its retry: the runner stops here
                raw.reset(vm_ip=env.vm_ip)
            agent = _make(uitars_agent_class(module), module)
            assert isinstance(agent, published)
            for call in (lambda: agent.reset(runtime_logger, vm_ip=env.vm_ip),
                         lambda: agent.reset(vm_ip=env.vm_ip),
                         lambda: agent.reset(runtime_logger=runtime_logger, vm_ip=env.vm_ip)):
                agent.history_responses.append("the last task's answer")
                agent.history_images.append(b"the last task's screenshot")
                call()
                # the published reset ran: the last task's history is gone
                assert agent.history_responses == [] and agent.history_images == []
        finally:
            env.close()
    with pytest.raises(ValueError, match="known: uitars15_v1"):
        uitars_agent_class("uitars9")
