"""``kvagent train --from DIR`` runs the done stage on base agents made before: it refuses a
DIR whose recipe made its projector and designs otherwise than the options asked now
(``base_record.base_record``) — a recipe.json written before an option existed reads as its
default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.train.base_record import base_record
from runtime.train.recipe_config import RecipeConfig

#: (the option's recipe.json key, a value other than its default, the config asking for it)
CASES = [("menu_entries", "launch", {"menu_entries": "launch"}),
         ("menu_flag", True, {"menu_flag": True}),
         ("flags_in_base", True, {"flags_in_base": True}),
         ("enter_key", True, {"enter_key": True}),
         ("key_row", True, {"key_row": True}),
         ("word_slips", False, {"word_slips": False})]


@pytest.mark.parametrize("option, value, matching", CASES, ids=[c[0] for c in CASES])
def test_the_done_stage_refuses_base_agents_made_the_other_way(
        tmp_path: Path, option: str, value: object, matching: dict) -> None:
    for name in ("mmproj.gguf", "agent-qwen35.gguf", "agent-llama.gguf"):
        (tmp_path / name).write_bytes(b"")
    models = {"qwen35": {}, "llama": {}}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"config": {"seed": 0}, "models": models}))
    assert base_record(tmp_path, RecipeConfig())["models"] == models  # before the option
    with pytest.raises(ValueError, match=option.replace("_", "-")):
        base_record(tmp_path, RecipeConfig(**matching))
    recipe.write_text(json.dumps({"config": {"seed": 0, option: value}, "models": models}))
    assert base_record(tmp_path, RecipeConfig(**matching))["models"] == models
    with pytest.raises(ValueError, match=option.replace("_", "-")):
        base_record(tmp_path, RecipeConfig())
