"""What ``kvagent train`` makes its agents from: the recipe's configuration
(``RecipeConfig``, whose defaults make the shipped files), the names of the files it writes,
and the parsers of its listed options."""

from __future__ import annotations

import math

import attrs

from runtime.arg_parsers import parse_names
from runtime.train.agents import AGENT_ARCHES
from runtime.train.cell_labels import MenuEntries
from runtime.train.dataset import DatasetConfig
from runtime.train.done_stage import DoneStage
from runtime.train.fit import FitConfig
from vmenv.simdesk.kinds import task_kinds

__all__ = ["BASE_DIR", "CLICK_WEIGHTS", "DONE_CLICK_WEIGHTS", "DONE_DATA", "RECIPE_KINDS",
           "HYBRID_DONE_CLICK_WEIGHTS", "MMPROJ_NAME", "SUB_UNITS", "RecipeConfig",
           "format_click_weights", "model_name", "parse_arches", "parse_click_weights"]

MMPROJ_NAME = "mmproj.gguf"
BASE_DIR = "base"  # the base agents of a recipe with a done stage
DONE_DATA = "data-done"  # the done stage's dataset


def model_name(arch: str) -> str:
    """The file name of ``arch``'s trained agent."""
    return f"agent-{arch}.gguf"


_DATA = attrs.fields(DatasetConfig)

#: the shipped agents' draw groups (``FitConfig.clicked_weights``), base training: menu-launch's
#: menu clicks and its other steps, the Save click after typing, and the look-back kind's
#: last click (the ``marked`` launcher) with its Save as often (so the agent tells the step
#: after typing from the step after Save), each drawn as a group of its own beside the kinds
#: (docs/training.md, "The look-back click drawn as a group of its own" and after)
CLICK_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("menu-launch/menu.notes", 0.5), ("menu-launch/menu.terminal", 0.5),
    ("menu-launch/menu.button", 0.5), ("menu-launch/", 1.0),
    ("save-note/notes.save", 0.5), ("switch-window/notes.save", 0.5),
    ("marked", 1.0), ("marked-launch/notes.save", 1.0))
#: and the done stage's: the same with menu-launch's groups heavier (its steps 2, its menu
#: clicks 0.75 each: beside the look-back groups its share fell, and with it menu-launch to
#: 16/30 and 15/30, docs/training.md "The look-back kind in the recipe"), type-in-field's
#: steps after its click (the typed word, then ``done()``), and the field click before typing
#: in the kinds that then Save (without it the hybrid's done stage taught it to type into the
#: unfocused window: save-note 15/30)
DONE_CLICK_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("menu-launch/menu.notes", 0.75), ("menu-launch/menu.terminal", 0.75),
    ("menu-launch/menu.button", 0.75), ("menu-launch/", 2.0),
    *((name, w) for name, w in CLICK_WEIGHTS if not name.startswith("menu-launch/")),
    ("type-in-field/", 1.0),
    ("save-note/notes.field", 0.5), ("switch-window/notes.field", 0.5),
    ("marked-launch/notes.field", 0.5))
#: and the hybrid's own done-stage groups: the same with save-note's and switch-window's
#: steps drawn too (the typed word, ``done()`` after Save: without them the hybrid clicked
#: Save again until max_steps, ``kvagent run`` 8 of 12 ended by ``done()``; with them 12 of
#: 12 — and the llama agent, trained under them, fell to switch-window 13/30, so it keeps
#: ``DONE_CLICK_WEIGHTS``; docs/training.md "The look-back kind in the recipe")
HYBRID_DONE_CLICK_WEIGHTS: tuple[tuple[str, float], ...] = (
    *DONE_CLICK_WEIGHTS, ("save-note/", 1.0), ("switch-window/", 1.0))


#: The sub-cell read-out's units per axis (``RecipeConfig.sub_cell``).
SUB_UNITS = 16
#: The kinds the shipped agents were trained on: the default mix and ``marked-launch``.
RECIPE_KINDS: tuple[str, ...] = (*task_kinds(), "marked-launch")

@attrs.frozen
class RecipeConfig:
    """Everything the shipped agents are made from (the defaults make them)."""

    arches: tuple[str, ...] = AGENT_ARCHES
    seed: int = 0
    episodes: int = 512
    fit: FitConfig = FitConfig(clicked_weights=CLICK_WEIGHTS)
    threads: int = 2
    #: the projector's recogniser: expert episodes it learns from (every kind in turn, then
    #: the dialog kinds again: their button labels are the classes with the fewest screens,
    #: ~57 buttons per label in 1500 episodes, and held out it found dialog-button's button
    #: on 0.775 of clicks against 0.994 on its own screens), and its updates
    recogniser_episodes: int = 1500
    recogniser_dialog_episodes: int = 3000
    recogniser_updates: int = 1500
    #: the query scaffold's weight (``grounding``)
    scaffold_weight: float = 10.0
    #: the dataset's off-track episodes (``dataset.DatasetConfig``, whose defaults and
    #: checks these are): knocked off-track, with the agent's own mistakes, and how those
    #: mistakes look
    perturbed: float = _DATA.perturbed.default
    slipped: float = _DATA.slipped.default
    early_typing: float = _DATA.early_typing.default
    max_slip_run: int = _DATA.max_slip_run.default
    #: the task kinds the recogniser and the dataset draw from (default ``RECIPE_KINDS``: the
    #: default mix and the opt-in look-back kind ``marked-launch``, whose ``marked`` class
    #: the recogniser learns), and the share of terminal layouts with the first screenshot
    #: pinned (``DatasetConfig.pin_share``: how an agent learns a look-back kind with
    #: ``--pin-first 1``); a share above 0 also lays every look-back step out pinned where
    #: its drawn layout dropped the first screenshot (``DatasetConfig.pin_look_back``)
    kinds: tuple[str, ...] = attrs.field(default=RECIPE_KINDS, converter=tuple)
    pin_share: float = 0.3
    #: every demonstration of the base training ends with the solved state labelled
    #: ``done()`` (issue 47, measured in docs/training.md: every episode then ends with
    #: done() but the multi-step kinds collapse to click, type, done()); off: the base
    #: agents never say done(), and the done stage teaches it
    with_done: bool = False
    #: how an app's menu entry is classed, for the recogniser and the dataset alike
    #: (``cell_labels.MenuEntries``): ``menu.<app>`` (the shipped agents) or its launcher's
    #: ``launch.<app>`` (measured in docs/training.md, "Menu entries as launchers, and three
    #: times the data")
    menu_entries: MenuEntries = _DATA.menu_entries.default
    #: the menu flag (``menu_flag``): the projector reads "part of the open menu" off the
    #: recogniser's units into a dim of its own, and a designed head carries "a screenshot
    #: in the window shows the menu open" to the rows that choose a verb or a coordinate
    menu_flag: bool = True
    #: the instruction flags (``instruction_flags``) designed into the fresh agents, so the
    #: base training learns to read them (the done stage otherwise designs them into the
    #: trained base agents)
    flags_in_base: bool = True
    #: the demonstrations press Enter as a step of their own after typing a text that
    #: submits (``DatasetConfig.enter_key``), instead of typing ``"\n"``
    enter_key: bool = True
    #: the key row (the response's ``press("``) carries the text flag, so it reads the
    #: typed and instruction flags (``typed_flag.KEY_PIECES``)
    key_row: bool = True
    #: a slipped typing step may type a wrong word (``DatasetConfig.word_slips``); off, no
    #: demonstration presses backspace after typing, the habit that undid correct words
    word_slips: bool = False
    #: agents that click 8 px off a cell's centre where the centre reaches no target
    #: (``cell_labels.sub_cell_grid``): the sub-cell pieces in their vocabulary
    #: (``agents.agent_vocab``), the recogniser's sub-cell read-out in the projector
    #: (``sub_readout``, ``SUB_UNITS`` units per axis), demonstrations on that grid
    sub_cell: bool = False
    #: the done stage (``done_stage``): after the base training, each agent continues from
    #: its base file on the demonstrations ending in ``done()``; ``updates`` 0 ships the base
    #: agents (they never say done())
    done: DoneStage = DoneStage(clicked_weights=DONE_CLICK_WEIGHTS,
                                arch_clicked_weights=(("qwen35", HYBRID_DONE_CLICK_WEIGHTS),))

    def dataset(self) -> DatasetConfig:
        """The dataset this recipe trains on; ValueError if its settings are not valid."""
        return DatasetConfig(seed=self.seed, episodes=self.episodes, shard_episodes=128,
                             perturbed=self.perturbed, slipped=self.slipped,
                             early_typing=self.early_typing, max_slip_run=self.max_slip_run,
                             with_done=self.with_done, kinds=self.kinds,
                             pin_share=self.pin_share, pin_look_back=self.pin_share > 0,
                             menu_entries=self.menu_entries, enter_key=self.enter_key,
                             word_slips=self.word_slips, sub_cell=self.sub_cell)

    def done_dataset(self) -> DatasetConfig:
        """The done stage's dataset: the same demonstrations, each ending in ``done()``."""
        return attrs.evolve(self.dataset(), with_done=True)


def parse_arches(text: str, *, option: str = "--arch") -> tuple[str, ...]:
    """``"qwen35,llama"`` -> the arches (ValueError for an unknown one)."""
    return parse_names(text, AGENT_ARCHES, option=option, what="arch(es)")


def format_click_weights(pairs: tuple[tuple[str, float], ...]) -> str:
    """``parse_click_weights``'s inverse: (("marked", 1.0),) -> ``"marked=1"`` (a weight
    ``:g`` would round is written in full)."""
    return ",".join(f"{name}={w:g}" if float(f"{w:g}") == w else f"{name}={w!r}"
                    for name, w in pairs)


def parse_click_weights(text: str) -> tuple[tuple[str, float], ...]:
    """``"marked=1,marked-launch/notes.save=0.5"`` -> (([KIND/]CLASS, weight), ...) for
    ``FitConfig.clicked_weights`` (ValueError for a pair that is not [KIND/]CLASS=W with a
    finite W > 0, or a name given twice)."""
    pairs: list[tuple[str, float]] = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        name, sep, weight = item.partition("=")
        try:
            w = float(weight)
        except ValueError:
            w = 0.0
        if not sep or not name.strip() or not 0 < w < math.inf:
            raise ValueError(f"{item!r} is not [KIND/]CLASS=WEIGHT with a finite weight above 0")
        pairs.append((name.strip(), w))
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"a name is given twice in {text!r}")
    return tuple(pairs)
