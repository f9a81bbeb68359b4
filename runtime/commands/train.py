"""``kvagent train``: make kvagent's tiny GUI agents from simdesk's scripted solutions
(``runtime.train.recipe``); needs the ``train`` extra (JAX's CPU build)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

HELP = ("train the tiny simdesk agents (hybrid qwen35 and llama) that kvagent ships; on one "
        "core about 5 min for the projector's recogniser, 2-7 for each of the two datasets, "
        "45-50 per model at the default 4000 updates and 13-18 per model for the done stage "
        "(measured with the two arches side by side on 2 cores beside evaluations; ~65-75 "
        "min an agent in all); "
        "needs pip install 'kvagent[train]')")

if TYPE_CHECKING:  # the train extra's modules load only when the command runs
    from runtime.train.recipe_config import RecipeConfig

DEFAULT_OUT = Path("kvagent-agents")

#: the recipe's on/off options (``RecipeConfig`` fields), each ``--X`` / ``--no-X``
_SWITCHES = (
    ("menu_flag", "the projector reads 'part of the open menu' off each cell and a designed "
                  "head tells the rows that choose an action whether a screenshot in the "
                  "window shows the menu open (docs/training.md, 'The menu flag')"),
    ("flags_in_base", "design the instruction flags (Save / menu / Enter asked) into the fresh "
                      "agents, so the base training learns to read them; off: the done stage "
                      "designs them into the trained base agents"),
    ("enter_key", "the demonstrations type a text that submits without its \\n and press "
                  "Enter as a step of their own; off: type(\"word\\n\")"),
    ("key_row", "the row that chooses a pressed key (press(\") carries the text flag, so it "
                "reads the typed and instruction flags"),
    ("word_slips", "a slipped typing step may type a wrong word, which the expert then "
                   "backspaces; off: its mistake is a click elsewhere, and no demonstration "
                   "presses backspace after typing"),
    ("with_done", "end every demonstration of the base training with the solved state "
                  "labelled done() too (docs/training.md has what it did to the multi-step "
                  "kinds)"),
    ("sub_cell", "agents that click 8 px off a cell's centre where the centre reaches no "
                 "target (the classic OK button, 16 px tall): sub-cell pieces, the "
                 "projector's sub-cell read-out, demonstrations on that grid; add the dense "
                 "kinds (--kinds ...,dense) for targets that need it"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.train.cell_labels import MENU_ENTRIES
    from runtime.train.recipe_config import RecipeConfig, format_click_weights

    d = RecipeConfig()
    f = d.fit
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"output directory (default ./{DEFAULT_OUT}): agent-<arch>.gguf, "
                        "mmproj.gguf, data/ (kept: a rerun reuses finished shards), "
                        "recipe.json")
    p.add_argument("--arch", default=",".join(d.arches),
                   help=f"comma-separated arches to train (default {','.join(d.arches)})")
    p.add_argument("--episodes", type=int, default=d.episodes,
                   help=f"demonstration episodes in the dataset (default {d.episodes}, ~6 "
                        "examples each)")
    p.add_argument("--steps", type=int, default=f.steps,
                   help=f"training updates per model, one example each (default {f.steps})")
    p.add_argument("--learning-rate", type=float, default=f.learning_rate)
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seeds the initial weights, the dataset and the example order "
                        "(same seed, same files, with the same JAX build, CPU kind and "
                        "number of available cores)")
    p.add_argument("--threads", type=int, default=d.threads,
                   help="llama.cpp threads while generating the dataset")
    p.add_argument("--recogniser-episodes", type=int, default=d.recogniser_episodes,
                   help="expert episodes the projector's widget recogniser learns from "
                        f"(default {d.recogniser_episodes})")
    p.add_argument("--recogniser-dialog-episodes", type=int,
                   default=d.recogniser_dialog_episodes,
                   help="more episodes of the dialog kinds for it (their button labels are "
                        f"the rarest classes; default {d.recogniser_dialog_episodes})")
    p.add_argument("--recogniser-updates", type=int, default=d.recogniser_updates,
                   help=f"the recogniser's updates (default {d.recogniser_updates}, ~3 min; "
                        "its screens take 1.5 min more)")
    p.add_argument("--kinds", default=",".join(d.kinds),
                   help="comma-separated task kinds (or the selectors look-back, dense, "
                        "classic) the recogniser and the dataset draw from, in turn (default: "
                        "the default mix and the look-back kind marked-launch)")
    p.add_argument("--pin-share", type=float, default=d.pin_share,
                   help="share of the terminal layouts (K >= 2) with the first screenshot "
                        f"pinned, as --pin-first 1 lays them out; above 0, a look-back step "
                        f"is also laid out pinned wherever its drawn layout dropped the first "
                        f"screenshot (default {d.pin_share:g})")
    p.add_argument("--menu-entries", choices=MENU_ENTRIES, default=d.menu_entries,
                   help="how the recogniser and the dataset class an app's menu entry: menu "
                        "(menu.<app>, the shipped agents) or launch (its launcher's "
                        f"launch.<app>: it opens the app; docs/training.md) (default "
                        f"{d.menu_entries})")
    for name, help_text in _SWITCHES:  # --X / --no-X, each defaulting to the recipe's
        p.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction,
                       default=getattr(d, name),
                       help=f"{help_text} (default {'on' if getattr(d, name) else 'off'})")
    p.add_argument("--click-weights", default=format_click_weights(f.clicked_weights),
                   metavar="[KIND/]CLASS=W,...",
                   help="draw the examples whose click names CLASS (a recogniser class; "
                        "marked: marked-launch's look-back click), of KIND if named, as a "
                        "group of their own, W against 1 for each kind; \"\": the kinds alone "
                        "(default %(default)s)")
    p.add_argument("--perturbed", type=float, default=d.perturbed,
                   help="share of episodes knocked off-track once (default "
                        f"{d.perturbed:g})")
    p.add_argument("--slipped", type=float, default=d.slipped,
                   help=f"share of episodes with the agent's own mistakes (default "
                        f"{d.slipped:g})")
    p.add_argument("--early-typing", type=float, default=d.early_typing,
                   help="share of those whose mistake is typing the task's text before its "
                        f"field is ready (default {d.early_typing:g})")
    p.add_argument("--max-slip-run", type=int, default=d.max_slip_run,
                   help=f"mistakes in a row, 1..N (default {d.max_slip_run})")
    p.add_argument("--done-updates", type=int, default=d.done.updates,
                   help="the done stage: updates each agent trains on from its base file, on "
                        "the demonstrations ending in done(), so it ends its own episodes "
                        f"(default {d.done.updates}, ~{d.done.updates // 120} min a model on "
                        "one core; 0: the base agents, which never say done())")
    p.add_argument("--done-learning-rate", type=float, default=d.done.learning_rate)
    p.add_argument("--done-click-weights", default=format_click_weights(d.done.clicked_weights),
                   metavar="[KIND/]CLASS=W,...",
                   help="--click-weights for the done stage of the arches without their own "
                        "(--done-arch-click-weights) (default %(default)s)")
    own = " ".join(f"{a}:{format_click_weights(g)}" for a, g in d.done.arch_clicked_weights)
    p.add_argument("--done-arch-click-weights", action="append", default=None,
                   metavar="ARCH:[KIND/]CLASS=W,...",
                   help="an arch's own --done-click-weights, in place of them; repeat it for "
                        "another arch; none: every arch draws --done-click-weights (default "
                        f"{own or 'none'})")
    p.add_argument("--done-arch", default=",".join(d.done.arches),
                   help="comma-separated arches that go through the done stage (default "
                        f"{','.join(d.done.arches)}; the others ship their base file)")
    p.add_argument("--done-flags", dest="done_flags", action=argparse.BooleanOptionalAction,
                   default=d.done.instruction_flags,
                   help="with --no-flags-in-base: design the instruction flags (a Save, a "
                        "menu, an Enter asked) into each base agent before its done stage "
                        "(default on; without them the llama agent says done() before Save, "
                        "docs/training.md); with --flags-in-base the agents carry them from "
                        "the start and --no-done-flags is refused")
    p.add_argument("--from", dest="base", type=Path, default=None, metavar="DIR",
                   help="run only the done stage, from the base agents in DIR (agent-<arch>."
                        "gguf, mmproj.gguf and their recipe.json; e.g. a run with "
                        "--done-updates 0): what the whole recipe makes from those files")


def _click_weights(flag: str, text: str, kinds: tuple[str, ...], menu_entries: str,
                   ) -> tuple[tuple[str, float], ...]:
    """``flag``'s draw groups, refused before any work where they cannot match an example:
    a KIND not trained, a menu entry class (``menu.<app>``) the recogniser does not have
    (``--menu-entries launch`` classes them ``launch.<app>``).  A group that still matches
    nothing (a toy budget) is refused by the training itself."""
    from runtime.train.cell_labels import widget_class  # as run's: JAX loads only here
    from runtime.train.recipe_config import parse_click_weights

    try:
        pairs = parse_click_weights(text)
        for name, _ in pairs:
            kind, _, cls = name.rpartition("/")
            if kind and kind not in kinds:
                raise ValueError(f"{name!r} names kind {kind!r}, which --kinds leaves out")
            if cls.startswith("menu.") and widget_class(cls, menu_entries) != cls:
                raise ValueError(f"{name!r} names a menu entry class, which --menu-entries "
                                 f"{menu_entries} does not have")
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc} (\"\" draws the kinds alone)") from exc
    return pairs


def _arch_click_weights(values: list[str] | None, kinds: tuple[str, ...], menu_entries: str,
                        ) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """``--done-arch-click-weights``: None -> the recipe's; ``["none"]`` -> (); else each
    ``ARCH:PAIRS`` checked as ``_click_weights`` checks a stage's, each arch at most once."""
    from runtime.train.recipe_config import RecipeConfig, parse_arches

    flag = "--done-arch-click-weights"
    if values is None:
        return RecipeConfig().done.arch_clicked_weights
    if values == ["none"]:
        return ()
    own: dict[str, tuple[tuple[str, float], ...]] = {}
    for value in values:
        arch, sep, text = value.partition(":")
        if not sep or "," in arch:
            raise ValueError(f"{flag}: {value!r} is not ARCH:[KIND/]CLASS=W,... (or none)")
        (arch,) = parse_arches(arch, option=flag)
        if arch in own:
            raise ValueError(f"{flag}: {arch} is given twice")
        own[arch] = _click_weights(f"{flag} {arch}", text, kinds, menu_entries)
    return tuple(own.items())


def recipe_config(args: argparse.Namespace) -> RecipeConfig:
    """The recipe ``args`` ask for (with no options: ``RecipeConfig()``, the shipped files'
    recipe); ValueError naming the option for a bad value."""
    import attrs

    from runtime.train.done_stage import DoneStage
    from runtime.train.recipe_config import RecipeConfig, parse_arches
    from vmenv.simdesk.kinds import resolve_kinds

    arches = tuple(parse_arches(args.arch))
    if args.episodes < 8 or args.steps < 1 or args.learning_rate <= 0:
        raise ValueError("--episodes must be >= 8, --steps >= 1, --learning-rate > 0")
    if args.done_updates < 0 or args.done_learning_rate <= 0:
        raise ValueError("--done-updates must be >= 0, --done-learning-rate > 0")
    if args.base is not None and args.done_updates == 0:
        raise ValueError("--from runs the done stage: --done-updates must be > 0")
    if args.recogniser_episodes < 8 or args.recogniser_updates < 1 \
            or args.recogniser_dialog_episodes < 0:
        raise ValueError("--recogniser-episodes must be >= 8, --recogniser-updates >= 1, "
                         "--recogniser-dialog-episodes >= 0")
    if args.flags_in_base and not args.done_flags:
        raise ValueError("--no-done-flags needs --no-flags-in-base: with --flags-in-base the "
                         "agents carry the instruction flags from the start")
    kinds = resolve_kinds(args.kinds)
    clicks, done_clicks = (_click_weights(flag, text, kinds, args.menu_entries)
                           for flag, text in (("--click-weights", args.click_weights),
                                              ("--done-click-weights", args.done_click_weights)))
    config = RecipeConfig(arches=arches, seed=args.seed, episodes=args.episodes,
                          fit=attrs.evolve(RecipeConfig().fit, steps=args.steps,
                                           learning_rate=args.learning_rate, seed=args.seed,
                                           clicked_weights=clicks),
                          threads=args.threads,
                          recogniser_episodes=args.recogniser_episodes,
                          recogniser_dialog_episodes=args.recogniser_dialog_episodes,
                          recogniser_updates=args.recogniser_updates,
                          perturbed=args.perturbed, slipped=args.slipped,
                          early_typing=args.early_typing, max_slip_run=args.max_slip_run,
                          with_done=args.with_done,
                          kinds=kinds, pin_share=args.pin_share,
                          menu_entries=args.menu_entries, menu_flag=args.menu_flag,
                          flags_in_base=args.flags_in_base, enter_key=args.enter_key,
                          key_row=args.key_row, word_slips=args.word_slips,
                          sub_cell=args.sub_cell,
                          done=DoneStage(updates=args.done_updates,
                                         learning_rate=args.done_learning_rate,
                                         arches=parse_arches(args.done_arch,
                                                             option="--done-arch"),
                                         clicked_weights=done_clicks,
                                         arch_clicked_weights=_arch_click_weights(
                                             args.done_arch_click_weights, kinds,
                                             args.menu_entries),
                                         instruction_flags=args.done_flags))
    try:
        config.dataset()  # the dataset's own checks, before any work
    except ValueError as exc:
        raise ValueError(f"--perturbed / --slipped / --early-typing / --max-slip-run / "
                         f"--pin-share: {exc}") from exc
    return config


def run(args: argparse.Namespace) -> int:
    from runtime.train.environment import pin_xla_threads

    pin_xla_threads()  # before JAX's first computation: the same seed, the same bytes
    try:
        import jax  # noqa: F401  - the train extra
    except ImportError:
        print("kvagent train: error: needs JAX: pip install 'kvagent[train]'", file=sys.stderr)
        return 2
    from runtime.train.base_record import base_record
    from runtime.train.recipe import train_agents, train_done_from

    try:
        config = recipe_config(args)
        if args.base is not None:
            base_record(args.base, config)  # --from holds base agents of this seed
    except ValueError as exc:
        print(f"kvagent train: error: {exc}", file=sys.stderr)
        return 2
    say = lambda s: print(s, flush=True)  # noqa: E731 - progress lines as they come
    try:
        record = (train_agents(config, args.out, progress=say) if args.base is None
                  else train_done_from(config, args.base, args.out, progress=say))
    except ValueError as exc:  # found only in the data (a draw group no example matches)
        print(f"kvagent train: error: {exc}; the data written so far are kept and reused",
              file=sys.stderr)
        return 2
    for arch, m in record["models"].items():
        print(f"{arch}: {args.out / m['file']} sha256 {m['sha256'][:16]}")
    print(f"projector: {args.out / record['mmproj']['file']}; evaluate with kvagent bench-eval "
          f"--model {args.out / record['models'][config.arches[0]]['file']} --mmproj "
          f"{args.out / record['mmproj']['file']}")
    return 0
