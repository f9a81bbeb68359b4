"""The trained agents kvagent ships (runtime/agent_models) are llama.cpp's models, and the trainer
saw what the engine shows them.

- Parity: on a real simdesk step prompt (instruction, a 640x384 screenshot, the runtime's chat
  layout, the expert's action as the response), the trainer's JAX forward of the shipped GGUF
  and llama.cpp through kvagent's Engine agree on every row's logits within the stated
  tolerance, with the same greedy token — for the hybrid qwen35 (M-RoPE image rows) and for
  llama (the same projector's rows on a line).  A perturbed copy of the weights fails.
- The cell projector declares that it carries positions in its features; the engine pairs
  an M-RoPE projector with a model without M-RoPE only then.
- Stored encodings (what training reads) give the same rows as the engine encoding the same
  screenshot, for both arches (llama's through ``on_a_line``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.errors import ModelLoadError
from cachepolicy.engine.vision import check_pairing, declares_position_features
from runtime.agent_models import agent_files
from runtime.train import ImagePiece, TextPiece, build_example, compare, load_gguf
from runtime.train.fit import on_a_line
from vmenv.simdesk import demonstration, sample_task
from vmenv.simdesk.render import render_png

ARCHES = ("qwen35", "llama")
CONFIG = EngineConfig(n_ctx_per_seq=4096, n_seq_max=1, n_threads=2, decode_rows=1)


@pytest.fixture(scope="module")
def step_png() -> bytes:
    task = sample_task("dialog-button", 3)
    return render_png(demonstration(task, 640, 384)[0].state)


def step_prompt(engine: Engine, png: bytes) -> list[TextPiece | ImagePiece]:
    tok = engine.tokenize
    return [TextPiece(tok("<|im_start|>system\nYou are a GUI agent.<|im_end|>\n<|im_start|>user"
                          "\nTask: A dialog is open. Press its \"Discard\" button.\n"
                          "Screenshot 0:")),
            ImagePiece(png),
            TextPiece(tok("\n<|im_end|>\n<|im_start|>assistant\n")),
            TextPiece(tok("click(464, 112)<|im_end|>"), train=True)]


@pytest.mark.parametrize("arch", ARCHES)
def test_shipped_agent_is_llama_cpps_model(arch: str, step_png: bytes) -> None:
    model, mmproj = agent_files(arch)
    with Engine(model, mmproj, CONFIG) as engine:
        pieces = step_prompt(engine, step_png)
    report = compare(model, mmproj, pieces, engine_config=CONFIG)
    assert report.passed, report.summary()
    assert report.n_image_rows == 240  # 640x384 -> 20 x 12 cells of 32 px
    # a perturbed copy of the trained weights is caught by the same check
    loaded = load_gguf(model)
    name = "blk.0.ffn_down.weight"
    bent = dict(loaded.params, **{name: loaded.params[name] + 0.5})
    worse = compare(model, mmproj, pieces, params=bent, engine_config=CONFIG)
    assert not worse.passed and worse.max_abs_diff > 10 * report.max_abs_diff


def test_cell_projector_declares_positions_and_pairs_only_then() -> None:
    _, mmproj = agent_files("qwen35")
    assert mmproj is not None and declares_position_features(mmproj)
    norm_rope = 0  # LLAMA_ROPE_TYPE_NORM: a text model without M-RoPE
    check_pairing(mmproj, "qwen3vl_merger", norm_rope, position_features=True)
    with pytest.raises(ModelLoadError, match="another model family"):
        check_pairing(mmproj, "qwen3vl_merger", norm_rope, position_features=False)


class _Stored:
    """What training reads: an encoding kept from the hybrid engine (as the dataset stores it)."""

    def __init__(self, enc: object, *, uses_mrope: bool, n_embd: int) -> None:
        self.enc, self.uses_mrope, self.n_embd = enc, uses_mrope, n_embd

    def encode_image(self, png: bytes) -> object:
        return self.enc if self.uses_mrope else on_a_line(self.enc)  # type: ignore[arg-type]


def test_stored_encodings_are_the_engines_rows_for_both_arches(step_png: bytes) -> None:
    hybrid_model, mmproj = agent_files("qwen35")
    with Engine(hybrid_model, mmproj, CONFIG) as hybrid:
        stored = hybrid.encode_image(step_png)
        pieces = step_prompt(hybrid, step_png)
    for arch in ARCHES:
        model, _ = agent_files(arch)
        with Engine(model, mmproj, CONFIG) as engine:
            want = build_example(engine, pieces)
            got = build_example(_Stored(stored, uses_mrope=engine.uses_mrope,
                                        n_embd=engine.n_embd), pieces)  # type: ignore[arg-type]
        assert np.array_equal(got.tokens, want.tokens)
        assert np.array_equal(got.positions, want.positions), arch
        assert np.array_equal(got.image_embeds, want.image_embeds)  # bitwise
        assert got.next_pos == want.next_pos
    assert Path(mmproj).stat().st_size < 4 * 2**20  # type: ignore[arg-type]
