"""One home for the model files and the engine's settings: which model, how big, whether it
fits, and the load.

* ``check_model_choice`` — the one check that the model options go together (a model and
  its projector, or neither), made before anything loads.
* ``resolve_model`` — the user's files, or the default model when none is given (the
  shipped trained agent, or a forged model forged once into the model cache; said once:
  ``ModelFiles.note``).  Every command, ``kvagent
  serve`` and ``KvAgent`` resolve their model here; nothing else forges a fallback.
* ``default_threads`` — the one rule for the engine's thread count (defined beside
  ``EngineConfig``, whose default it is).
* ``engine_config`` — an ``EngineConfig`` within its bounds whose KV cache and attention
  workspace fit in the memory available now (``check_memory``, from the GGUF metadata), or
  a ``ValueError`` naming the options that sized it: a context sized from a long step limit
  is an error message before loading, not an OOM kill after.  Host and device memory are
  checked apart: with ``n_gpu_layers`` the offloaded layers' cells, weights and workspace
  must fit the GPU's free memory, the rest the host's.
* ``load_engine`` — the one construction of an ``Engine`` outside the engine and its tests;
  with a ``ContextNeed`` callback it checks the loaded projector's real screenshot cost and
  reloads once at the measured size when the size was derived.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import structlog

from cachepolicy.engine import EngineConfig
from cachepolicy.engine.records import default_threads
from cachepolicy.engine.gguf_meta import metadata
from cachepolicy.engine.sizing import context_cost, device_weight_bytes
from cachepolicy.forge import forge_cached
from runtime.agent_models import MissingAgentError, agent_files
from runtime.context_budget import ContextNeed
from scheduler.sizes import UNLIMITED_BYTES, format_bytes

if TYPE_CHECKING:  # loading libllama waits for ``load_engine``: a thin KvAgent(server=URL)
    from cachepolicy.engine import Engine  # resolves nothing and loads nothing

__all__ = ["BENCH_MODEL", "DEMO_MODEL", "Default", "DefaultModel", "ModelFiles", "ShippedAgent",
           "available_memory", "check_memory", "check_model_choice", "default_threads",
           "engine_config", "load_engine", "resolve_model"]

log = structlog.get_logger("kvagent.model")


@attrs.frozen
class DefaultModel:
    """A forged model used when none is given: forged deterministically into the model cache,
    its weights random."""

    arch: str
    size: str
    vision: bool = True
    quant: str = "f16"
    trained = False

    @property
    def name(self) -> str:
        quant = "" if self.quant == "f16" else f"-{self.quant}"
        return f"forged-{self.arch}-{self.size}{quant}"

    def describe(self) -> str:
        vision = " with vision" if self.vision else ""
        quant = "" if self.quant == "f16" else f" {self.quant}"
        return f"the forged {self.size} {self.arch}{quant} model{vision}"

    def files(self, vision: bool) -> tuple[Path, Path | None]:
        """The text model and (if ``vision``) its projector, forged on first use."""
        forged = forge_cached(self.arch, self.size, vision=self.vision or vision,
                              quant=self.quant)
        return forged.model_path, forged.mmproj_path if vision else None


@attrs.frozen
class ShippedAgent:
    """One of the tiny agents kvagent ships, trained on simdesk by ``kvagent train``
    (``runtime/agent_models``): real, if narrow, skill instead of random weights."""

    arch: str  # "qwen35" (hybrid) or "llama"
    trained = True

    @property
    def name(self) -> str:
        return f"kvagent-agent-{self.arch}"

    def describe(self) -> str:
        kind = "hybrid qwen35" if self.arch == "qwen35" else self.arch
        return f"kvagent's trained demo agent ({kind}, trained on simdesk)"

    def files(self, vision: bool) -> tuple[Path, Path | None]:
        """The shipped files; ``ModelChoiceError`` if this install lacks them."""
        try:
            return agent_files(self.arch, vision=vision)
        except MissingAgentError as exc:
            raise ModelChoiceError(str(exc)) from exc


Default = DefaultModel | ShippedAgent

#: ``kvagent run`` / ``serve`` / ``KvAgent`` / ``check-exact`` without a model.
DEMO_MODEL: Default = ShippedAgent("qwen35")
#: The benchmarks' model: big enough that prefill, not Python, dominates a step.
BENCH_MODEL = DefaultModel("qwen35", "M")


@attrs.frozen
class ModelFiles:
    """A resolved model: the text model, its vision projector (None for text-only uses) and,
    when it is the default, which one."""

    model: Path
    mmproj: Path | None
    default: Default | None = None

    @property
    def name(self) -> str:
        """What results and APIs call the model: the file stem, or the default's name."""
        return self.default.name if self.default is not None else self.model.stem

    def note(self) -> str | None:
        """The sentence to say once when the default is used (None for the user's files)."""
        if self.default is None:
            return None
        if self.default.trained:
            return (f"no --model: using {self.default.describe()} ({self.model.parent}); it "
                    f"solves simdesk's tasks from screenshots and knows nothing else — bring "
                    f"your own GGUF (--model, --mmproj) for real desktops")
        return (f"no --model: using {self.default.describe()} ({self.model.parent}); its "
                f"weights are random, so its actions are valid (grammar-constrained) but "
                f"aimless — it shows the runtime, not intelligence")


class ModelChoiceError(ValueError):
    """The model options do not name a usable pair of files."""


def check_model_choice(model: object, mmproj: object, *, vision: bool = True,
                       options: tuple[str, str] = ("--model", "--mmproj")) -> None:
    """The one check of a model choice, made before anything is resolved, forged or loaded
    (every command, ``kvagent serve``'s and ``KvAgent``'s configurations, ``resolve_model``):
    ``ModelChoiceError`` for a projector without its model, or — where screenshots are read
    (``vision``) — a model without its projector.  ``options``: what the caller calls the two
    (``KvAgent``: ``model_path``, ``mmproj_path``).  Missing files are the engine's to
    report."""
    if (model is None and mmproj is not None) or (vision and model is not None
                                                  and mmproj is None):
        model_opt, mmproj_opt = options
        raise ModelChoiceError(f"give both {model_opt} and {mmproj_opt} (the model's vision "
                               f"projector), or neither (the default model)")


def resolve_model(model: str | Path | None, mmproj: str | Path | None, *,
                  default: Default = DEMO_MODEL, vision: bool = True) -> ModelFiles:
    """The user's ``model`` (+ ``mmproj`` when ``vision``), or ``default``'s files when
    ``model`` is None.  ``ModelChoiceError`` (``check_model_choice``) for an mmproj without a
    model, or a model without the mmproj a vision use needs; missing files are the engine's
    to report."""
    check_model_choice(model, mmproj, vision=vision)
    if model is None:
        text, projector = default.files(vision)
        files = ModelFiles(text, projector, default)
        log.info("model_default", model=str(files.model), name=files.name)
        return files
    return ModelFiles(Path(model), Path(mmproj) if vision and mmproj is not None else None)


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (``UNLIMITED_BYTES`` where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return UNLIMITED_BYTES


def check_memory(model: Path, config: EngineConfig, *, what: str,
                 available: int | None = None) -> None:
    """ValueError if llama.cpp's allocation for ``config`` would exceed the memory available
    (``what`` names the options that sized it, for the message): host memory for what stays
    on the host, and — when ``config.n_gpu_layers`` offloads layers on this build — the GPU
    devices' free memory for what goes there."""
    offload = _planned_offload(model, config)
    cost = context_cost(model, config, offloaded=offload.layers if offload else 0)
    avail = available_memory() if available is None else available
    if cost is not None and cost.host_bytes > avail:
        where = " in host memory" if cost.device_bytes else ""
        raise ValueError(
            f"{what} size the context to {config.n_seq_max} sequence(s) x "
            f"{config.n_ctx_per_seq} tokens: llama.cpp would allocate about "
            f"{format_bytes(cost.host_bytes)}{where} (KV cache "
            f"{format_bytes(cost.kv_bytes - cost.device_kv_bytes)}, attention workspace "
            f"{format_bytes(cost.workspace_bytes - cost.device_workspace_bytes)}), more than "
            f"the {format_bytes(avail)} available")
    if offload is not None and offload.layers:
        need = device_weight_bytes(model, offload.layers) + (cost.device_bytes if cost else 0)
        free = sum(d.free_bytes for d in offload.devices)
        if free and need > free:
            raise ValueError(
                f"--gpu-layers {config.n_gpu_layers} and {what} put about "
                f"{format_bytes(need)} on {offload.backend} (weights of "
                f"{offload.layers} layers, their KV cache and the workspace), more than its "
                f"{format_bytes(free)} free: offload fewer layers or shrink the context")


def _planned_offload(model: Path, config: EngineConfig) -> Any:
    """Where ``config.n_gpu_layers`` would put the model's layers on this build
    (``cachepolicy.engine.devices.Offload``); None when no layer is asked for or the file
    does not say how many it has (llama.cpp then decides)."""
    if config.n_gpu_layers == 0:
        return None
    # imported here: asking ggml for its devices loads libllama, which a CPU-only
    # configuration (n_gpu_layers 0, every default) must not need before its load
    from cachepolicy.engine.devices import plan

    try:
        meta = metadata(model)
        n_layer = int(meta[f"{meta['general.architecture']}.block_count"])
    except (ValueError, KeyError, TypeError):
        return None
    return plan(config.n_gpu_layers, n_layer)


def engine_config(model: Path, *, what: str, **fields: Any) -> EngineConfig:
    """An ``EngineConfig`` of ``fields`` that passes its bounds and ``check_memory``;
    ValueError (with ``what``, the options that sized it, in the message) otherwise."""
    try:
        config = EngineConfig(**fields)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what}: {exc}") from None
    check_memory(model, config, what=what)
    return config


def load_engine(files: ModelFiles, config: EngineConfig | Callable[[int], EngineConfig], *,
                need: Callable[[Engine], ContextNeed] | None = None, n_ctx: int = 0,
                derived: bool = True, vision: bool = True) -> Engine:
    """Load ``files`` with ``config``.

    With ``need``, ``config`` is a function of the context size: the engine is made for
    ``n_ctx`` positions per sequence and its context must hold ``need(engine)`` (measured
    with the loaded projector) — if it does not, a ``derived`` size (estimated before
    loading) is loaded once more at the measured size, a size the user gave raises
    ``ContextBudgetError``.  With ``vision``, a projector that gives no vision encoder is a
    ``ValueError``.  Engines not returned are closed."""
    # imported here: the engine's module loads libllama, which only a load needs
    from cachepolicy.engine import Engine

    def make(size: int) -> Engine:
        cfg = config(size) if callable(config) else config
        engine = Engine(files.model, files.mmproj, cfg)
        if vision and not engine.has_vision:
            engine.close()
            raise ValueError(f"{files.mmproj} gave no vision projector: screenshots need one")
        return engine

    if need is None:
        return make(n_ctx)
    for _ in range(2):
        engine = make(n_ctx)
        try:
            measured = need(engine)
        except BaseException:
            engine.close()
            raise
        if measured.tokens <= n_ctx:
            return engine
        engine.close()
        if not derived:
            measured.check(n_ctx)
        n_ctx = measured.tokens
    raise AssertionError("unreachable: the second load is sized from the measured count")
