"""The done stage: a trained agent taught to end its own episodes with ``done()``.

OSWorld's loop stops only on the agent's DONE / FAIL or at max_steps; an agent that never
says ``done()`` keeps acting on a solved desktop and can undo it (issue 47).  Trained on
``done()`` demonstrations from the start, the agents' multi-step kinds collapsed (53 % / 57 %
held out, docs/training.md); so the recipe trains them first without ``done()`` (the base
agents) and then continues each from its exported base file for ``DoneStage.updates`` more
updates, at a lower learning rate, on the same demonstrations each ending in its solved
state labelled ``done()`` (``dataset.DatasetConfig.with_done``), with the same designed
slices kept fixed (``designs``).

Invariant: the stage starts from the base agent's *file* (its f16 weights, ``load_gguf``),
never from the f32 weights in memory, so ``kvagent train`` (base, then this stage) and
``kvagent train --from DIR`` (this stage from the base files in DIR) make the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np

from runtime.train.designs import Designs
from runtime.train.fit import FitConfig, FitReport, fit
from runtime.train.gguf_io import ExportedModel, export_gguf, load_gguf
from runtime.train.optim import merge_masks

__all__ = ["DoneStage", "train_done"]


@attrs.frozen
class DoneStage:
    """How long and how hard the done stage trains (the defaults: the shipped agents' done
    stage but for its draw groups, ``recipe_config.DONE_CLICK_WEIGHTS`` and the hybrid's
    ``HYBRID_DONE_CLICK_WEIGHTS``, which ``RecipeConfig.done`` adds).

    1000 updates at 1e-4 with the instruction flags designed in first (measured, 2026-12-06,
    docs/training.md, on the agents shipped until 2026-12-07): on 210 held-out instances by
    OSWorld's rule the hybrid solved 167/210 ending 210 with ``done()``, the llama agent
    171/210 ending 202 — against 157/210 and 123/210 without the flags (the llama agent then
    said ``done()`` where Save was still to click) and the base files' 170/210 and 155/210,
    which never say ``done()``.  ``arches``: the agents that go through it (both)."""

    updates: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    arches: tuple[str, ...] = attrs.field(default=("qwen35", "llama"), converter=tuple)
    learning_rate: float = 1e-4
    warmup_steps: int = 50
    #: (kind, weight): a kind's share of the stage's updates against 1 for the others
    #: (``FitConfig.kind_weights``)
    kind_weights: tuple[tuple[str, float], ...] = ()
    #: ([KIND/]CLASS, weight): a click's examples drawn as a group of their own
    #: (``FitConfig.clicked_weights``)
    clicked_weights: tuple[tuple[str, float], ...] = ()
    #: (arch, its groups): an arch's own draw groups in place of ``clicked_weights`` (each
    #: arch at most once; measured on the shipped agents, the hybrid needs groups under
    #: which the llama agent loses a kind, docs/training.md)
    arch_clicked_weights: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = attrs.field(
        default=(), converter=lambda pairs: tuple((a, tuple(g)) for a, g in pairs))
    #: design the instruction flags (``instruction_flags``: Save / menu / Enter asked) into
    #: the base agent before the stage trains it
    instruction_flags: bool = True

    @arch_clicked_weights.validator
    def _each_arch_once(self, _: object, pairs: tuple[tuple[str, object], ...]) -> None:
        arches = [a for a, _ in pairs]
        if len(set(arches)) != len(arches):
            raise ValueError(f"an arch has two sets of done-stage draw groups: {arches}")

    def applies(self, arch: str) -> bool:
        return self.updates > 0 and arch in self.arches

    def clicks_of(self, arch: str) -> tuple[tuple[str, float], ...]:
        """``arch``'s draw groups: its own if it has them, else ``clicked_weights``."""
        return dict(self.arch_clicked_weights).get(arch, self.clicked_weights)

    def fit_config(self, seed: int, arch: str) -> FitConfig:
        return FitConfig(steps=max(1, self.updates), learning_rate=self.learning_rate,
                         warmup_steps=self.warmup_steps, seed=seed,
                         kind_weights=self.kind_weights, clicked_weights=self.clicks_of(arch))


def train_done(base: Path, data: Path, out: Path, stage: DoneStage, designs: Designs, *,
               arch: str, seed: int, progress: Callable[[str], None] = lambda _: None,
               ) -> tuple[ExportedModel, FitReport]:
    """Train ``arch``'s agent in ``base`` (a GGUF file) on the with-``done()`` dataset in ``data``
    and export it to ``out``; returns the export and the run's report."""
    loaded = load_gguf(base)
    start = {k: np.asarray(v) for k, v in loaded.params.items()}
    frozen = designs.frozen(start, loaded.spec)
    if stage.instruction_flags and not designs.flags_in_base:  # else designed and frozen
        start, flag_masks = designs.apply_flags(start, loaded.spec)
        frozen = merge_masks(frozen, flag_masks)
    params, report = fit(loaded.spec, start, data, stage.fit_config(seed, arch), progress=progress,
                         grounding=designs.grounding, frozen=frozen)
    return export_gguf(out, loaded.spec, params, vocab=loaded.vocab), report
