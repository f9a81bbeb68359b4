"""The Qwen-VL arches GUI agents ship in, forged and run by the real llama.cpp: qwen2vl
(Qwen2.5-VL: UI-TARS-1.5, OpenCUA, GUI-Owl) with its ``qwen2.5vl_merger``, qwen3vl and
qwen3vlmoe with a deepstack ``qwen3vl_merger`` (issue 49 items 1-2).

check-exact on them runs with the other arches' (tests/test_oracle.py: f16 with vision;
tests/test_quantized.py: Q4_K_M with vision).  Here: what makes them these arches (the
projector, the image rows' width and token counts, the deepstack slices reaching the
logits, the released templates and tokens), terminal-slot == terminal-scratch with
screenshots under sampled decoding, which approximate policies apply (measured: none of the
KV-moving ones; each refused at configuration with its reason), and the profiles against
the templates.
"""

from __future__ import annotations

import io
import json

import attrs
import jinja2.sandbox
import numpy as np
import pytest
from PIL import Image

from cachepolicy.chat_format import ChatFormat
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.forge import VL_ARCHES, forge_cached, text_spec, vision_spec
from cachepolicy.forge.tokenizer import VL_TOKENS
from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory
from runtime.profiles.qwen3vl import Qwen3VLProfile
from runtime.profiles.uitars import UITarsProfile
from runtime.engine_setup import load_engine
from runtime.testing.engines import FORGED_CONFIG, forged_files
from runtime.testing.exactness import SAMPLED_DECODE
from vmenv.actions.types import Click, DragTo, Hotkey, TypeText

PROJECTOR = {"qwen2vl": "qwen2.5vl_merger", "qwen3vl": "qwen3vl_merger",
             "qwen3vlmoe": "qwen3vl_merger"}


def _png(width: int, height: int) -> bytes:
    rng = np.random.default_rng(width * height)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


# ---------------------------------------------------------------- the forge


@pytest.mark.parametrize("arch", VL_ARCHES)
def test_the_forged_arch_loads_with_its_projector_and_its_rows(engines, arch: str) -> None:
    e = engines(arch)
    spec, vspec = text_spec(arch, "tiny"), vision_spec(arch, "tiny")
    assert vspec.projector == PROJECTOR[arch]
    assert e.kind.value == "attention" and e.uses_mrope and e.has_vision
    # Qwen3-VL: 3 deepstack slices widen every image row to 4 x n_embd
    assert e.n_embd == spec.n_embd_inp == spec.n_embd * (1 + spec.n_deepstack)
    assert spec.n_deepstack == (0 if arch == "qwen2vl" else 3)
    assert sum(spec.rope_sections) == spec.head_dim // 2  # the whole head rotates
    enc = e.encode_image(_png(1280, 720))
    assert enc.embeddings.shape == (enc.n_tokens, e.n_embd)
    # one token per merged 2x2 patch: 28 px units (14-px patches) / 32 px (16-px patches)
    unit = 28 if arch == "qwen2vl" else 32
    nx, ny = int(1280 / unit + 0.5), int(720 / unit + 0.5)  # each side to the nearest unit
    assert enc.n_tokens == nx * ny
    assert enc.n_pos == max(nx, ny)  # 2-D positions: the image spans its longer side
    assert list(enc.pos_step) == [1, 1, 1, 0]
    # mtmd wraps the rows in the released models' markers
    assert enc.prefix_tokens == e.tokenize("<|vision_start|>")
    assert enc.suffix_tokens == e.tokenize("<|vision_end|>")


@pytest.mark.parametrize("arch", ["qwen3vl", "qwen3vlmoe"])
def test_the_deepstack_slices_reach_the_logits(engines, arch: str) -> None:
    """The image rows' deepstack slices are not padding: zeroing them changes the logits
    after the image, zeroing nothing changes nothing."""
    e = engines(arch)
    enc = e.encode_image(_png(256, 192))
    n = text_spec(arch, "tiny").n_embd
    flat = attrs.evolve(enc, embeddings=np.concatenate(
        [enc.embeddings[:, :n], np.zeros_like(enc.embeddings[:, n:])], axis=1))
    intro, outro = e.tokenize("<|im_start|>user\n"), e.tokenize("what is on the screen?")
    out = []
    for image in (enc, enc, flat):
        try:
            e.prefill_tokens(0, intro, logits=False)
            e.prefill_image(0, image)
            out.append(np.array(e.prefill_tokens(0, outro, logits=True)))
        finally:
            e.clear(0)
    assert np.array_equal(out[0], out[1])
    assert np.abs(out[0] - out[2]).max() > 1e-3


@pytest.mark.parametrize("arch", VL_ARCHES)
def test_the_released_tokens_and_template(engines, arch: str) -> None:
    e = engines(arch)
    for token, _ in VL_TOKENS:  # each is one token, at the end of the vocabulary
        ids = e.tokenize(token)
        assert len(ids) == 1 and ids[0] >= e.n_vocab - len(VL_TOKENS), token
    assert e.is_end_of_generation(e.tokenize("<|im_end|>")[0])
    template = e.chat_template
    assert template is not None
    # kvagent's turn wrappers learned from the released template are ChatML's
    assert ChatFormat.from_template(template) == ChatFormat.from_template(None)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    shot = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                        {"type": "text", "text": "click ok"}]}
    text = env.from_string(template).render(messages=[shot], add_generation_prompt=True)
    # Qwen2-VL's template opens with its default system turn; Qwen3-VL's does not
    system = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
              if arch == "qwen2vl" else "")
    assert text == (system + "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                    "click ok<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- exactness and policies


@pytest.mark.parametrize("arch", VL_ARCHES)
async def test_terminal_slot_equals_terminal_scratch_with_screenshots(
        kvagent_assert_exact, engines, arch: str) -> None:
    """Sampled decoding (greedy on random weights repeats one token whatever the prompt),
    a window of 3 screenshots sliding over 6 steps."""
    slot, scratch = await kvagent_assert_exact("terminal-slot", "terminal-scratch",
                                               engine=engines(arch), steps=6)
    assert len({tuple(s["output_tokens"]) for s in slot.steps}) > 1  # the outputs vary
    assert {s["start"] for s in slot.steps[1:]} == {"trim"}  # it reused, never from scratch
    assert all(s["prefill_tokens"] < t["prefill_tokens"]
               for s, t in zip(slot.steps[3:], scratch.steps[3:]))


@pytest.mark.parametrize("arch", VL_ARCHES)
async def test_terminal_slot_equals_terminal_scratch_on_q4_k_m(
        kvagent_assert_exact, tmp_path_factory, arch: str) -> None:
    """The same on the Q4_K_M model (size XS: the K-quants' 256-wide rows), as users run
    them; the engine loads it without repacked weights, as check-exact checks it."""
    m = forge_cached(arch, "XS", vision=True, quant="q4_k_m",
                     cache_dir=tmp_path_factory.mktemp(f"q4-{arch}"))
    with load_engine(forged_files(m), attrs.evolve(FORGED_CONFIG, n_seq_max=2)) as e:
        slot, _ = await kvagent_assert_exact("terminal-slot", "terminal-scratch", engine=e,
                                             steps=5)
    assert len({tuple(s["output_tokens"]) for s in slot.steps}) > 1
    assert {s["start"] for s in slot.steps[1:]} == {"trim"}


@pytest.mark.parametrize("arch", VL_ARCHES)
def test_kv_moving_policies_are_refused_at_configuration_with_the_reason(
        engines, arch: str) -> None:
    """Measured on these models: relocate's first slide failed mid-episode (llama.cpp's
    K-shift is refused under multi-section RoPE); kamera and the token evictors re-rotate
    keys by one position.  Each is refused before the episode starts, saying why."""
    e = engines(arch)
    info, kit = model_info(e), SegmentFactory(e).kit
    with pytest.raises(PolicyRefusedError, match="multi-section RoPE"):
        make_policy("relocate", info, kit)
    for name in ("kamera", "random-evict"):
        with pytest.raises(PolicyRefusedError, match="M-RoPE|multi-section"):
            make_policy(name, info, kit)
    (res,) = run_arms(e, ["relocate"], trajectory(4, 128, 96),
                      attrs.evolve(SAMPLED_DECODE, window=2, decode_tokens=2))
    assert res.refused and "multi-section RoPE" in res.refused and not res.steps
    e_text = engines(arch, vision=False)  # the text model alone: the RoPE itself refuses
    with pytest.raises(PolicyRefusedError, match="multi-section RoPE"):
        make_policy("kamera", model_info(e_text), SegmentFactory(e_text).kit)


# ---------------------------------------------------------------- profiles vs templates


def test_qwen3vl_profile_writes_the_tool_calls_qwen3vl_template_writes(engines) -> None:
    """An action the qwen3vl profile formats is the text Qwen3-VL's own template renders
    for the same call in an assistant turn (``tool_calls``), and the profile parses that
    rendering back to the action."""
    template = engines("qwen3vl").chat_template
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    profile, screen = Qwen3VLProfile(), (1280, 720)
    for action in (Click(640, 360), TypeText("hello"), Hotkey(("ctrl", "s")),
                   DragTo(10, 20, 300, 400)):
        written = profile.format(action, screen)
        call = json.loads(written.split("<tool_call>\n", 1)[1].split("\n</tool_call>")[0])
        turn = {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": call["name"],
                                             "arguments": call["arguments"]}}]}
        rendered = env.from_string(template).render(messages=[turn])
        body = rendered.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
        assert json.loads(body.split("\n", 1)[1].rsplit("\n", 1)[0]) == call
        assert body.startswith("<tool_call>\n") and body.endswith("\n</tool_call>")
        assert profile.parse_strict(body, screen).action == profile.parse_strict(
            written, screen).action


def test_uitars_profile_fits_the_qwen2vl_model(engines) -> None:
    """UI-TARS-1.5 is a Qwen2.5-VL: the profile's image space is the one the forged
    projector encodes (28 px units), and its history's box markers are the released
    tokens, one each."""
    e = engines("qwen2vl")
    profile = UITarsProfile()
    for screen in ((1280, 720), (1920, 1080)):
        assert e.image_tokens(_png(*screen))[0] == profile.image_tokens(screen)
    text = profile.history_text(Click(100, 200), "Thought: click it\nAction: x", (1280, 720))
    assert "<|box_start|>" in text
    ids = e.tokenize(text)
    for marker in ("<|box_start|>", "<|box_end|>"):
        assert e.tokenize(marker)[0] in ids
    assert e.detokenize(ids, special=False) == text  # (special=False: control tokens print)
