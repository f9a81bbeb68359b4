"""The base agents a done stage starts from (``kvagent train --from DIR``): ``DIR``'s recipe
record, checked to have been made as the recipe asked now would make them (seed, the options
the files depend on, the files themselves, no done stage yet)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.train.recipe_config import MMPROJ_NAME, RecipeConfig, model_name

__all__ = ["base_record"]

#: the options whose value the done stage must share with its base agents beyond the seed —
#: the projector and designs they were made with, and demonstrations the done data must not
#: contradict (a data option that only reweighs or resamples the same kind of steps is not
#: here) —, what a recipe.json written before the option existed made (the recipe then had
#: no other way), and how: ``--from`` refuses base agents made with another value
_BASE_OPTIONS = (
    ("kinds", ("open-terminal", "type-in-field", "click-ok", "save-note", "menu-launch",
               "dialog-button", "remember-code", "switch-window"),
     "its projector learnt these kinds' classes (marked-launch's marked) and no others"),
    ("menu_entries", "menu", "its projector classes menu entries so"),
    ("menu_flag", False, "its projector and designs carry the menu flag or lack it"),
    ("flags_in_base", False, "its agents carry the instruction flags or lack them"),
    ("enter_key", False, "its demonstrations press Enter as a step of its own or type it"),
    ("key_row", False, "its key row carries the text flag or lacks it"),
    ("word_slips", True, "its demonstrations type wrong words as slips or never do"),
    ("sub_cell", False, "its vocabulary, projector and designs carry the sub-cell points or "
                        "lack them"),
)


def base_record(base: Path, config: RecipeConfig) -> dict[str, Any]:
    """``base``'s recipe record, checked to hold base agents of ``config``'s seed."""
    try:
        made = json.loads((base / "recipe.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{base}: no readable recipe.json ({exc})") from exc
    if made.get("config", {}).get("seed") != config.seed:
        raise ValueError(f"{base} was made with seed {made.get('config', {}).get('seed')}, "
                         f"not {config.seed}: its designs would differ")
    for key, before, what in _BASE_OPTIONS:
        was = made["config"].get(key, before)
        was = tuple(was) if isinstance(was, list) else was  # JSON has no tuples
        if was != getattr(config, key):
            raise ValueError(f"{base} was made {_made_with(key, was)}, not as asked now: {what}")
    missing = [n for n in (MMPROJ_NAME, *map(model_name, config.arches))
               if not (base / n).is_file()]
    missing += [f"{a} in recipe.json" for a in config.arches if a not in made.get("models", {})]
    if missing:
        raise ValueError(f"{base} lacks {', '.join(missing)}")
    if any("base" in made["models"][a] for a in config.arches if config.done.applies(a)):
        raise ValueError(f"{base} holds agents that went through the done stage already")
    return made


def _made_with(key: str, value: object) -> str:
    """How the command line says ``key`` had ``value``: "with --menu-flag", "--kinds a,b"."""
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return f"{'with' if value else 'without'} {flag}"
    return f"{flag} {','.join(value) if isinstance(value, tuple) else value}"
