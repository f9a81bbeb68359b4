"""``kvagent check-model`` (issue 49 item 5): will it run my model? — on the forged models and
the shipped agents, from the files alone: the facts agree with what the loaded engine says,
the profile follows the files, the context is the one ``kvagent run`` sizes its engine with,
the policies that apply are the ones that construct, a projector of another family and a
policy the model refuses are problems."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.engine.errors import ModelLoadError
from cachepolicy.engine.model_facts import read_facts
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.layouts import PromptKit
from cachepolicy.policies import POLICIES, make_policy
from cachepolicy.segments import model_info
from runtime.agent_models import agent_files
from runtime.config import AgentConfig
from runtime.context_budget import context_need, estimate_image_tokens
from runtime.model_check import check_model, suggest_profile


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "check-model", *args],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "KVAGENT_CACHE_DIR": str(cache)})


@pytest.mark.parametrize("arch, kind, mrope", [("llama", ModelKind.ATTENTION, False),
                                               ("qwen35", ModelKind.HYBRID, True),
                                               ("qwen35moe", ModelKind.HYBRID, True)])
def test_the_files_say_what_the_loaded_engine_says(forged, arch, kind, mrope) -> None:
    """Two independent readings: vocab_only + metadata against the loaded model and mtmd."""
    m = forged(arch, vision=True)
    facts = read_facts(m.model_path, m.mmproj_path)
    assert (facts.arch, facts.kind, facts.mrope) == (arch, kind, mrope)
    assert facts.pairing_problem is None
    config = EngineConfig(n_ctx_per_seq=256, n_seq_max=1, n_batch=32, n_threads=1)
    with Engine(m.model_path, m.mmproj_path, config) as engine:
        assert facts.kind is engine.kind and facts.rope == engine.rope
        assert facts.kv_edit_problem == engine.kv_edit_problem
        assert facts.mrope == engine.uses_mrope
        assert facts.chat_template == engine.chat_template
        import llama_cpp

        native = engine._native.model
        assert facts.n_layer == llama_cpp.llama_model_n_layer(native)
        assert facts.n_ctx_train == llama_cpp.llama_model_n_ctx_train(native)


@pytest.mark.parametrize("arch", ["llama", "qwen35", "qwen35moe", "qwen2vl", "qwen3vl",
                                  "qwen3vlmoe"])
def test_the_policies_that_apply_are_the_ones_that_construct(forged, engines, arch) -> None:
    """What the files say applies is what the loaded model lets a policy construct: the
    policies are given the engine's own ModelInfo (its KV-edit and shift conditions read from
    the loaded context, not from the file)."""
    m = forged(arch, vision=True)
    report = check_model(m.model_path, m.mmproj_path)
    facts = report.facts
    info = model_info(engines(arch))
    assert {p.name for p in report.policies} == set(POLICIES.names())
    for fit in report.policies:
        try:
            make_policy(fit.name, info, PromptKit(generation_prompt=(1, 2), turn_break=(3, 4)))
            constructed = True
        except PolicyRefusedError:
            constructed = False
        assert fit.applies == constructed, fit
        assert fit.quality == POLICIES.get(fit.name).manifest.quality
        assert ("check-exact" in fit.why) == (fit.applies and fit.quality == "exact")
    exact = {p.name for p in report.policies if p.applies and p.quality == "exact"}
    assert {"terminal-slot", "terminal-scratch", "evict", "noevict"} <= exact
    refused = {p.name for p in report.policies if not p.applies}
    if facts.kind is ModelKind.HYBRID:
        assert {"relocate", "kamera"} <= refused
        assert "tail-replay" not in refused
    elif facts.mrope:  # the Qwen-VL archs: llama.cpp shifts no position with 4 components
        assert {"tail-replay", "relocate", "kamera"} <= refused
    else:
        assert "tail-replay" in refused and "relocate" not in refused


def test_the_context_is_what_kvagent_run_sizes_its_engine_with(forged) -> None:
    m = forged("qwen35", vision=True)
    report = check_model(m.model_path, m.mmproj_path, profile="qwen3vl", window=4,
                         steps=20, screen=(1280, 720))
    tokens = estimate_image_tokens(m.mmproj_path, (1280, 720))
    assert report.image_tokens == tokens > 0
    need = context_need(AgentConfig(profile="qwen3vl", window=4), (1280, 720), tokens,
                        steps=20)
    assert report.context == need.tokens and report.window == 4
    # a window past the trained context is said, not hidden
    short = check_model(m.model_path, m.mmproj_path, window=8, steps=200,
                        screen=(3840, 2160))
    assert short.context > short.facts.n_ctx_train
    assert any("trained for" in w for w in short.warnings) and short.runs


def test_profiles_follow_the_files(forged) -> None:
    for arch in ("llama", "qwen35"):
        assert suggest_profile(read_facts(forged(arch).model_path))[0] == "kvagent"
    for arch in ("qwen35", "llama"):
        model, mmproj = agent_files(arch)
        report = check_model(model, mmproj, screen=(640, 384))
        assert report.profile == "kvagent" and report.runs, report.problems
    facts = read_facts(forged("qwen35").model_path)
    renamed = [suggest_profile(attrs_evolve(facts, arch=a, name="x"))[0]
               for a in ("qwen3vl", "qwen3vlmoe", "qwen2vl", "qwen35", "gemma3")]
    assert renamed == ["qwen3vl", "qwen3vl", "uitars", "qwen3vl", "kvagent"]
    # a forged stand-in of a GUI agent's arch gets that agent's format
    assert suggest_profile(attrs_evolve(facts, arch="qwen2vl"))[0] == "uitars"


@pytest.mark.parametrize("arch, profile", [("qwen2vl", "uitars"), ("qwen3vl", "qwen3vl"),
                                           ("qwen3vlmoe", "qwen3vl")])
def test_the_gui_agent_archs(forged, arch, profile) -> None:
    from cachepolicy.forge import ARCHES

    if arch not in ARCHES:
        pytest.skip(f"the forge does not make {arch} yet")
    m = forged(arch, vision=True)
    report = check_model(m.model_path, m.mmproj_path)
    assert report.facts.arch == arch and report.facts.mrope and report.runs
    assert report.profile == profile and report.window == 5
    assert report.facts.kind is ModelKind.ATTENTION
    # the splicing policies follow the engine's KV-edit condition on M-RoPE, not the kind
    kamera = next(p for p in report.policies if p.name == "kamera")
    assert kamera.applies == (report.facts.kv_edit_problem is None)
    if not kamera.applies:
        assert report.facts.kv_edit_problem in kamera.why


def attrs_evolve(facts: object, **changes: object) -> object:
    import attrs

    return attrs.evolve(facts, **changes)


def test_problems_stop_it(forged) -> None:
    llama, qwen = forged("llama"), forged("qwen35")
    crossed = check_model(llama.model_path, qwen.mmproj_path)
    assert not crossed.runs
    assert any("another model family" in p for p in crossed.problems)
    refused = check_model(qwen.model_path, qwen.mmproj_path, policy="relocate")
    assert not refused.runs and any(p.startswith("policy relocate: not on hybrid")
                                    for p in refused.problems)
    blind = check_model(qwen.model_path, None)
    assert not blind.runs and blind.context is None
    with pytest.raises(ModelLoadError, match="not found"):
        check_model(Path("/nonexistent.gguf"), None)


def test_check_model_command(forged, tmp_path: Path) -> None:
    m = forged("qwen35", vision=True)
    text = _cli(str(m.model_path), "--mmproj", str(m.mmproj_path), "--screen", "1280x720",
                cache=tmp_path)
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"model: {m.model_path}"
    assert "qwen35 (hybrid: recurrent and attention layers)" in lines[1]
    assert "multi-section" in lines[2] and "pairs with the model" in lines[3]
    assert lines[4].startswith("profile: kvagent")
    assert any(ln.startswith("screenshot: 1280x720 costs ~") for ln in lines)
    assert any(ln.split()[:2] == ["terminal-slot", "exact,"] and "applies" in ln
               for ln in lines)
    assert lines[-1].startswith("runs: true — next: kvagent check-exact")
    js = _cli(str(m.model_path), "--mmproj", str(m.mmproj_path), "--json", "--profile",
              "qwen3vl", cache=tmp_path)
    assert js.returncode == 0, js.stderr
    report = json.loads(js.stdout)
    assert report["architecture"] == "qwen35" and report["kind"] == "hybrid"
    assert report["mrope"] is True and report["projector_pairs"] is True
    assert report["profile"] == "qwen3vl" and report["window"] == 5
    assert report["runs"] is True and report["problems"] == []
    crossed = _cli(str(forged("llama").model_path), "--mmproj", str(m.mmproj_path),
                   cache=tmp_path)
    assert crossed.returncode == 1 and "problem: mmproj" in crossed.stdout
    assert crossed.stdout.strip().endswith("runs: false")
    missing = _cli(str(tmp_path / "none.gguf"), cache=tmp_path)
    assert missing.returncode == 2 and "model file not found" in missing.stderr
    shipped = _cli("--screen", "640x384", cache=tmp_path)  # the shipped demo agent
    assert shipped.returncode == 0 and "agent-qwen35.gguf" in shipped.stdout
