"""What a ``KvAgent`` runs with, and the context it loads with.

``KvAgentConfig`` holds where and with what an agent runs: the model files, the engine's
settings (an ``EngineConfig``: threads, prefill rows, decode lanes — one sequence, the
episode's), the memory budget, what OSWorld hands it — and ``agent``, how it decides (the
``AgentConfig`` that ``kvagent run`` and the bench use too).

``plan_context`` resolves the model (``runtime.engine_setup``: the user's files or the
default) and sizes the context from the projector's metadata before anything loads: it
derives ``n_ctx`` when none is given, else checks it — ``ContextBudgetError`` (a
ValueError) names the knobs to turn.  Threads default to ``default_threads(shared=True)``:
an agent does not assume it owns the machine (N OSWorld workers, one agent each).
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import structlog

from cachepolicy.engine.records import MAX_N_CTX_PER_SEQ, EngineConfig, default_threads
from runtime.config import AgentConfig
from runtime.context_budget import ContextNeed, context_need, estimate_image_tokens
from runtime.engine_setup import ModelFiles, check_model_choice, resolve_model
from scheduler.sizes import parse_budget

log = structlog.get_logger("kvagent.osworld")

#: The context a planned agent loads with before its size is known (replaced by the plan).
_PLANNED = 512


def _budget(value: int | str | None) -> int | None:
    budget = parse_budget(value, relative=False)
    return None if budget.unlimited else budget.resolve()


def agent_engine(*, n_threads: int | None = None, n_batch: int = 512,
                 n_gpu_layers: int = 0) -> EngineConfig:
    """An agent's engine settings: one sequence; ``n_threads`` default: the shared rule;
    ``n_gpu_layers``: layers on the GPU (``EngineConfig``).  Its ``n_ctx_per_seq`` is a
    placeholder until ``plan_context`` sizes it."""
    return EngineConfig(n_ctx_per_seq=max(_PLANNED, n_batch), n_seq_max=1, n_batch=n_batch,
                        n_threads=default_threads(shared=True) if n_threads is None
                        else n_threads, n_gpu_layers=n_gpu_layers)


@attrs.frozen
class KvAgentConfig:
    """Where and with what a KvAgent runs (see the module docstring)."""

    model_path: Path | None = attrs.field(converter=attrs.converters.optional(Path))
    mmproj_path: Path | None = attrs.field(converter=attrs.converters.optional(Path))
    agent: AgentConfig = attrs.Factory(AgentConfig)
    #: the engine's settings; its context size is ``n_ctx`` or what the plan derives
    engine: EngineConfig = attrs.Factory(agent_engine)
    #: positions of the episode's sequence; None: what ``max_steps`` steps need on
    #: ``screen_size`` screenshots (``plan_context``)
    n_ctx: int | None = attrs.field(default=None, validator=attrs.validators.optional([
        attrs.validators.ge(256), attrs.validators.le(MAX_N_CTX_PER_SEQ)]))
    #: the steps of one episode the context is sized for (OSWorld's run.py: --max_steps 15)
    max_steps: int = attrs.field(default=15, validator=[attrs.validators.ge(1),
                                                        attrs.validators.le(1000)])
    memory_budget: int | None = attrs.field(default=None, converter=_budget)
    #: the VM's screen (pyautogui's pixels); screenshots of another size are scaled onto it
    screen_size: tuple[int, int] = attrs.field(default=(1920, 1080), converter=tuple)
    action_space: str = "pyautogui"
    observation_type: str = "screenshot"
    name: str = attrs.field(factory=lambda: f"kvagent-{os.getpid()}")

    def __attrs_post_init__(self) -> None:
        if self.action_space != "pyautogui":
            raise ValueError(f"KvAgent emits pyautogui code; action_space={self.action_space!r} "
                             "is not supported")
        if self.observation_type != "screenshot":
            raise ValueError("KvAgent reads screenshots only (observation_type='screenshot')")
        check_model_choice(self.model_path, self.mmproj_path,
                           options=("model_path", "mmproj_path"))
        if len(self.screen_size) != 2 or min(self.screen_size) < 1:
            raise ValueError(f"screen_size must be (width, height), got {self.screen_size}")
        if self.engine.n_seq_max != 1:
            raise ValueError("a KvAgent's engine holds one sequence (n_seq_max=1)")

    def need(self, image_tokens: int) -> ContextNeed:
        """What an episode needs with ``screen_size`` screenshots of ``image_tokens`` tokens."""
        return context_need(self.agent, self.screen_size, image_tokens, steps=self.max_steps)


@attrs.frozen
class ContextPlan:
    """The model files and the context size an agent loads with."""

    files: ModelFiles
    n_ctx: int
    derived: bool  # n_ctx was estimated here (reload once if the projector costs more)

    def engine(self, config: KvAgentConfig, n_ctx: int) -> EngineConfig:
        """``config``'s engine settings with ``n_ctx`` positions (at least one batch)."""
        return attrs.evolve(config.engine,
                            n_ctx_per_seq=max(n_ctx, config.engine.n_batch))


def plan_context(config: KvAgentConfig) -> ContextPlan:
    """Resolve the model and size the context before anything loads (module docstring)."""
    files = resolve_model(config.model_path, config.mmproj_path)
    assert files.mmproj is not None  # resolve_model's vision default
    if (note := files.note()) is not None:
        log.warning("kvagent_default_model", agent=config.name, note=note)
    need = config.need(estimate_image_tokens(files.mmproj, config.screen_size))
    if config.n_ctx is None:
        return ContextPlan(files, max(need.tokens, config.engine.n_batch), derived=True)
    need.check(config.n_ctx)
    return ContextPlan(files, config.n_ctx, derived=False)
