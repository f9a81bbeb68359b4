""""Will it run my model?" — one model file and its projector judged before anything loads
(``kvagent check-model``).

``check_model`` gathers what a user needs to decide: what llama.cpp reads from the files
(``cachepolicy.engine.model_facts``: the architecture, its layer kind, multi-section RoPE or
not, the trained context, whether the projector pairs with the model), the profile that
speaks the model's output format (``suggest_profile``), what one screenshot costs at the
screen size (the projector's patch size and merge: ``context_budget.estimate_image_tokens``),
the context a profile's window needs for an episode (``context_budget.context_need``, the
arithmetic ``kvagent run`` and ``KvAgent`` size their engines with) and which cache policies
apply to the model (each policy's manifest, and the splicing policies' KV-edit condition),
exact by construction or approximate.  Exactness on the user's machine is
``kvagent check-exact``'s to verify: the report says so rather than claiming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.engine.model_facts import ModelFacts, read_facts
from cachepolicy.engine.records import EngineConfig
from cachepolicy.engine.sizing import context_cost
from cachepolicy.engine.kv_access import window_problem
from cachepolicy.policies import POLICIES
from cachepolicy.policies.window_replay import WindowReplayPolicy
from cachepolicy.splicing import SplicingPolicy
from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.context_budget import context_need, estimate_image_tokens

#: What each layer kind means, for the report.
KIND_TEXT = {ModelKind.ATTENTION: "attention-only",
             ModelKind.HYBRID: "hybrid: recurrent and attention layers",
             ModelKind.RECURRENT: "recurrent"}
EXACT_NOTE = ("exact by construction; verify it on this machine (and backend) with "
              "kvagent check-exact")
APPROXIMATE_NOTE = "approximate (opt-in): its drift is measured, its steps are marked"


@attrs.frozen
class PolicyFit:
    """One cache policy on the model: does it apply, and what it promises there."""

    name: str
    applies: bool
    quality: str  # "exact" or "approximate"
    bounded: bool
    why: str  # the contract where it applies, the reason where it is refused

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def policy_fits(facts: ModelFacts) -> tuple[PolicyFit, ...]:
    """Every registered policy asked about this model: its manifest's model kinds, for the
    policies that move cached KV rows (``SplicingPolicy``) the model's KV-edit problem, for
    window-replay whether it can keep a hybrid's rows (``kv_access.window_problem``), and
    for those that shift cached positions the model's shift problem — the conditions a
    policy's construction checks."""
    out = []
    for name, cls in POLICIES.items():
        m = cls.manifest
        if facts.kind not in m.supports:
            supported = ", ".join(sorted(k.value for k in m.supports))
            applies, why = False, f"not on {facts.kind.value} models (supports: {supported})"
        elif issubclass(cls, SplicingPolicy) and facts.kv_edit_problem is not None:
            applies, why = False, f"cannot move this model's cached KV: {facts.kv_edit_problem}"
        elif (issubclass(cls, WindowReplayPolicy)
              and (why_not := window_problem(facts.kind, facts.rope)) is not None):
            applies, why = False, why_not
        elif m.shifts_positions and facts.shift_problem is not None:
            applies, why = False, facts.shift_problem
        else:
            applies, why = True, EXACT_NOTE if m.quality == "exact" else APPROXIMATE_NOTE
        out.append(PolicyFit(name, applies, m.quality, m.bounded, why))
    return tuple(out)


def suggest_profile(facts: ModelFacts) -> tuple[str, str]:
    """The profile whose output format the model was trained on, and why (a guess from the
    file's name and architecture: check the model card when it is not kvagent's own).
    kvagent's shipped agents speak kvagent's language; a forged stand-in of a GUI agent's
    architecture (qwen2vl, qwen3vl) the format of the agents it stands in for; the other
    forged models (random weights) kvagent's, as ``kvagent run``'s default model does."""
    own = facts.name.startswith("kvagent-")
    if own and facts.name.endswith("-agent"):
        return "kvagent", (f"{facts.name} is one of kvagent's shipped agents, trained on "
                           f"kvagent's action language")
    if facts.arch in ("qwen3vl", "qwen3vlmoe"):
        return "qwen3vl", f"{facts.arch} is Qwen3-VL: computer_use tool calls on a 0-999 grid"
    if facts.arch == "qwen2vl":
        return "uitars", ("qwen2vl is Qwen2.5-VL, the base of UI-TARS-1.5 (also OpenCUA and "
                          "GUI-Owl: check their output format against the uitars profile)")
    if own:
        return "kvagent", (f"{facts.name} is a model kvagent forged (random weights): "
                           f"kvagent's action language, as kvagent run's default model")
    if facts.arch in ("qwen35", "qwen35moe"):
        return "qwen3vl", (f"{facts.arch} is the Qwen3.5 family (Holo3): Qwen-VL computer_use "
                           f"tool calls")
    return "kvagent", (f"{facts.arch}: no GUI-agent format known for it; kvagent's action "
                       f"language works with any instruction model")


@attrs.frozen
class ModelCheck:
    """The report (see the module docstring); ``problems`` are what stops it running,
    ``warnings`` what it runs despite (llama.cpp runs past the trained context, worse)."""

    model: Path
    mmproj: Path | None
    facts: ModelFacts
    profile: str
    profile_reason: str
    policy: str
    window: int
    steps: int
    screen: Screen
    image_tokens: int | None  # one screenshot's (None: no projector)
    context: int | None  # positions one episode needs (None: no projector)
    context_kv_bytes: int | None  # that context's KV cache + workspace, one episode + lanes
    policies: tuple[PolicyFit, ...]
    problems: tuple[str, ...]
    warnings: tuple[str, ...] = ()

    @property
    def runs(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        f = self.facts
        return {
            "model": str(self.model), "mmproj": None if self.mmproj is None else str(self.mmproj),
            "architecture": f.arch, "name": f.name, "kind": f.kind.value,
            "layers": f.n_layer, "context_trained": f.n_ctx_train, "mrope": f.mrope,
            "rope_type": f.rope.rope_type, "projector": f.projector,
            "projector_pairs": f.pairing_problem is None if self.mmproj else None,
            "profile": self.profile, "profile_reason": self.profile_reason,
            "policy": self.policy, "window": self.window, "steps": self.steps,
            "screen": list(self.screen), "image_tokens": self.image_tokens,
            "context": self.context, "context_bytes": self.context_kv_bytes,
            "policies": [p.as_dict() for p in self.policies],
            "exactness": "check-exact verifies the exact policies on this machine",
            "problems": list(self.problems), "warnings": list(self.warnings),
            "runs": self.runs}


def check_model(model: str | Path, mmproj: str | Path | None, *, profile: str | None = None,
                policy: str = "terminal-slot", window: int | None = None, steps: int = 15,
                screen: Screen = (1920, 1080)) -> ModelCheck:
    """The report for ``model`` (+ ``mmproj``) run with ``profile`` (None: the suggested
    one), ``policy`` and ``window`` (None: the profile's) for episodes of ``steps`` steps on
    ``screen``-sized screenshots.  ``ModelLoadError`` when llama.cpp cannot read the model;
    ValueError for a configuration ``AgentConfig`` refuses."""
    model = Path(model)
    mmproj = Path(mmproj) if mmproj is not None else None
    facts = read_facts(model, mmproj)
    suggested, reason = suggest_profile(facts)
    if profile is not None and profile != suggested:
        reason = f"chosen (the files suggest {suggested}: {reason})"
    chosen = profile or suggested
    agent = AgentConfig(profile=chosen, policy=policy,
                        **({"window": window} if window is not None else {}))
    fits = policy_fits(facts)
    problems, warnings = [], []
    fit = next(p for p in fits if p.name == policy)  # AgentConfig knows the name
    if not fit.applies:
        problems.append(f"policy {policy}: {fit.why}")
    image_tokens = context = cost = None
    if mmproj is None:
        problems.append("no projector (--mmproj): kvagent's agents read screenshots")
    else:
        if facts.pairing_problem is not None:
            problems.append(facts.pairing_problem)
        image_tokens = estimate_image_tokens(mmproj, screen)
        context = context_need(agent, screen, image_tokens, steps=steps).tokens
        if facts.n_ctx_train and context > facts.n_ctx_train:
            warnings.append(
                f"one episode needs {context} positions, more than the {facts.n_ctx_train} "
                f"the model was trained for (llama.cpp runs past it, the model answers "
                f"worse): lower the window ({agent.window}), the screen size or the steps")
        size = max(context, 512)
        estimate = context_cost(model, EngineConfig(n_ctx_per_seq=size, n_seq_max=1,
                                                    n_threads=1))
        cost = estimate.total_bytes if estimate is not None else None
    return ModelCheck(model=model, mmproj=mmproj, facts=facts, profile=chosen,
                      profile_reason=reason, policy=policy, window=agent.window, steps=steps,
                      screen=screen, image_tokens=image_tokens, context=context,
                      context_kv_bytes=cost, policies=fits, problems=tuple(problems),
                      warnings=tuple(warnings))
