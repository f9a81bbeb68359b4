"""The engines a test session shares: tiny models forged once into the session's directory,
engines loaded once per model (through ``runtime.engine_setup.load_engine``, the one place an
``Engine`` is made), and the trained agents kvagent ships.

Loading a model costs seconds, so a session loads each one once; the price is that tests
share the engine, and a test must leave the sequences it used cleared (``Shelf.engine``
clears them again before handing the engine out).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from cachepolicy.engine import EngineConfig
from cachepolicy.forge import ForgedModel, forge_cached
from runtime.engine_setup import ModelFiles, ShippedAgent, load_engine, resolve_model

if TYPE_CHECKING:  # the engine's module loads libllama: only a load needs it
    from cachepolicy.engine import Engine

__all__ = ["FORGED_CONFIG", "SHIPPED_CONFIG", "Shelf", "forged_files"]

#: The forged engines' settings: three sequences (two episodes and a spare), and a small
#: n_batch so every prefill of more than 32 rows is split into batches (tests see chunking).
FORGED_CONFIG = EngineConfig(n_ctx_per_seq=2048, n_seq_max=3, n_batch=32, n_threads=1)
#: The shipped agents' settings: room for a few 640x384 screenshots (240 tokens each) and
#: their history per sequence.
SHIPPED_CONFIG = EngineConfig(n_ctx_per_seq=4096, n_seq_max=3, n_threads=1)


def forged_files(model: ForgedModel, vision: bool = True) -> ModelFiles:
    """A forged model as the files ``load_engine`` takes (no projector unless ``vision``)."""
    return ModelFiles(model.model_path, model.mmproj_path if vision else None)


@attrs.define(eq=False)
class Shelf:
    """A session's models and engines, each made on first use and closed by ``close``."""

    cache_dir: Path
    threads: int = 1
    _engines: dict[tuple[str, str, bool], Engine] = attrs.Factory(dict)

    def forged(self, arch: str, vision: bool = True, size: str = "tiny") -> ForgedModel:
        """The forged ``arch`` model of ``size`` (``forge_cached``: forged at most once)."""
        return forge_cached(arch, size, vision=vision, cache_dir=self.cache_dir)

    def engine(self, arch: str, vision: bool = True) -> Engine:
        """The shared engine on the forged tiny ``arch`` model, its sequences cleared."""
        key = ("forged", arch, vision)
        if key not in self._engines:
            files = forged_files(self.forged(arch, vision), vision)
            config = attrs.evolve(FORGED_CONFIG, n_threads=self.threads)
            self._engines[key] = load_engine(files, config, vision=vision)
        return self._cleared(self._engines[key])

    def shipped_engine(self, arch: str = "qwen35") -> Engine:
        """The shared engine on the trained ``arch`` agent kvagent ships
        (``runtime/agent_models``), its sequences cleared; ``ModelChoiceError`` if this
        install lacks it."""
        key = ("shipped", arch, True)
        if key not in self._engines:
            files = resolve_model(None, None, default=ShippedAgent(arch))
            config = attrs.evolve(SHIPPED_CONFIG, n_threads=self.threads)
            self._engines[key] = load_engine(files, config)
        return self._cleared(self._engines[key])

    @staticmethod
    def _cleared(engine: Engine) -> Engine:
        for seq in range(engine.config.n_seq_max):
            engine.clear(seq)
        return engine

    def close(self) -> None:
        """Close every engine made (idempotent)."""
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()
