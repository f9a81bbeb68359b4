"""``kvagent train --from DIR`` runs the done stage on base agents made before: it refuses a
DIR whose recipe made its projector and designs otherwise than the options asked now
(``base_record.base_record``) — a recipe.json written before an option existed reads as what
the recipe made then, whatever the option's default is now."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from runtime.train.base_record import base_record
from runtime.train.recipe_config import RecipeConfig

#: (the option's recipe.json key, what the recipe made before the option existed, another value)
CASES = [("kinds", ("open-terminal", "type-in-field", "click-ok", "save-note", "menu-launch",
                   "dialog-button", "remember-code", "switch-window"),
          ("open-terminal", "type-in-field", "click-ok", "save-note", "menu-launch",
           "dialog-button", "remember-code", "switch-window", "marked-launch")),
         ("menu_entries", "menu", "launch"),
         ("menu_flag", False, True),
         ("flags_in_base", False, True),
         ("enter_key", False, True),
         ("key_row", False, True),
         ("word_slips", True, False),
         ("sub_cell", False, True)]


def test_every_checked_option_has_a_case() -> None:
    from runtime.train.base_record import _BASE_OPTIONS

    assert [c[:2] for c in CASES] == [(key, before) for key, before, _ in _BASE_OPTIONS]


@pytest.mark.parametrize("option, before, other", CASES, ids=[c[0] for c in CASES])
def test_the_done_stage_refuses_base_agents_made_the_other_way(
        tmp_path: Path, option: str, before: object, other: object) -> None:
    for name in ("mmproj.gguf", "agent-qwen35.gguf", "agent-llama.gguf"):
        (tmp_path / name).write_bytes(b"")
    models = {"qwen35": {}, "llama": {}}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"config": {"seed": 0}, "models": models}))
    made_before = RecipeConfig(**{o: b for o, b, _ in CASES})  # all of them as before
    made_other = attrs.evolve(made_before, **{option: other})
    assert base_record(tmp_path, made_before)["models"] == models  # written before the option
    with pytest.raises(ValueError, match=option.replace("_", "-")):
        base_record(tmp_path, made_other)
    # as the recipe writes it (json has no tuples: the kinds come back a list)
    recipe.write_text(json.dumps({"config": {"seed": 0, option: other}, "models": models}))
    assert base_record(tmp_path, made_other)["models"] == models
    with pytest.raises(ValueError, match=option.replace("_", "-")):
        base_record(tmp_path, made_before)
