"""The model forge writes GGUF files that the real llama.cpp (llama-cpp-python) loads and runs.

No stand-ins here: every forged tiny model is loaded with the low-level llama_cpp API,
prompts are decoded with a llama_batch, and images are tokenized/encoded with mtmd.
"""

from __future__ import annotations

import ctypes
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import jinja2.sandbox
import llama_cpp
import numpy as np
import pytest
from llama_cpp import mtmd_cpp
from PIL import Image

from cachepolicy.forge import build as forge_build
from cachepolicy.forge import (
    ARCHES,
    CHAT_TEMPLATE,
    FORGE_VERSION,
    SIZES,
    ForgedModel,
    ForgeError,
    entry_name,
    forge,
    forge_cached,
    text_spec,
)

CHAT_PROMPT = "<|im_start|>user\nclick the submit button<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------- fixtures / helpers


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], ForgedModel]:
    """Every arch at size tiny, text-only and with vision."""
    root = tmp_path_factory.mktemp("forge")
    return {
        (arch, vision): forge(arch, "tiny", root / f"{arch}-{vision}", vision=vision)
        for arch in ARCHES
        for vision in (False, True)
    }


@contextmanager
def loaded(path: Path) -> Iterator[tuple[object, object]]:
    """(model, context) with flash attention off, freed on exit."""
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp refused to load {path}"
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = 512
    cparams.n_batch = 512
    cparams.n_ubatch = 512
    cparams.n_threads = cparams.n_threads_batch = 2
    cparams.flash_attn_type = 0
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    assert ctx, "llama_init_from_model failed"
    try:
        yield model, ctx
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def tokenize(model: object, text: str, *, special: bool = True) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, special)
    assert n >= 0
    return list(buf[:n])


def decode(model: object, ctx: object, tokens: list[int]) -> np.ndarray:
    """Prefill `tokens` into sequence 0 from position 0; logits of every row (n, n_vocab)."""
    n = len(tokens)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        assert llama_cpp.llama_decode(ctx, batch) == 0
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        return np.stack([
            np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
            for i in range(n)
        ])
    finally:
        llama_cpp.llama_batch_free(batch)


def png_bytes(width: int, height: int) -> bytes:
    pixels = np.random.default_rng(7).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@contextmanager
def vision_context(mmproj: Path, model: object) -> Iterator[object]:
    params = mtmd_cpp.mtmd_context_params_default()
    params.use_gpu = False
    params.warmup = False
    params.print_timings = False
    params.n_threads = 2
    mctx = mtmd_cpp.mtmd_init_from_file(str(mmproj).encode(), model, params)
    assert mctx, f"mtmd refused to load {mmproj}"
    try:
        yield mctx
    finally:
        mtmd_cpp.mtmd_free(mctx)


def file_bytes(forged_model: ForgedModel) -> tuple[bytes, bytes]:
    mmproj = forged_model.mmproj_path.read_bytes() if forged_model.mmproj_path else b""
    return forged_model.model_path.read_bytes(), mmproj


# ---------------------------------------------------------------- text models


@pytest.mark.parametrize("arch", ARCHES)
def test_text_model_loads_and_gives_finite_varied_logits(tiny_models, arch: str) -> None:
    record = tiny_models[(arch, False)]
    spec = text_spec(arch, "tiny")
    with loaded(record.model_path) as (model, ctx):
        assert llama_cpp.llama_model_is_hybrid(model) == spec.is_hybrid
        assert llama_cpp.llama_model_n_params(model) == record.n_params
        assert llama_cpp.llama_model_n_embd(model) == spec.n_embd
        assert llama_cpp.llama_model_n_layer(model) == spec.n_layer
        tokens = tokenize(model, CHAT_PROMPT)
        logits = decode(model, ctx, tokens)
    assert np.isfinite(logits).all()
    assert (logits.std(axis=1) > 1e-3).all(), "logits must differ between vocab entries"
    assert np.abs(logits[0] - logits[-1]).max() > 1e-3, "logits must depend on the context"


def test_every_size_has_two_attention_and_two_recurrent_layers() -> None:
    for arch in ARCHES:
        for size in SIZES:
            spec = text_spec(arch, size)
            assert len(spec.attention_layers) >= 2
            if spec.is_hybrid:
                assert len(spec.recurrent_layers) >= 2
                assert spec.attention_layers[-1] == spec.n_layer - 1
                assert sum(spec.rope_sections) * 2 == spec.rope_dims
                assert all(spec.rope_sections[:3])  # t, y and x all rotate


@pytest.mark.parametrize("arch", ARCHES)
def test_tokenizer_control_tokens_and_byte_fallback(tiny_models, arch: str) -> None:
    with loaded(tiny_models[(arch, False)].model_path) as (model, _ctx):
        vocab = llama_cpp.llama_model_get_vocab(model)
        for marker in ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                       "<|image_pad|>"):
            (tok,) = tokenize(model, marker)
            assert llama_cpp.llama_vocab_is_control(vocab, tok)
            assert len(tokenize(model, marker, special=False)) > 1  # plain text otherwise
        (im_end,) = tokenize(model, "<|im_end|>")
        assert llama_cpp.llama_vocab_is_eog(vocab, im_end)
        assert tokenize(model, "<|im_start|>user")[1:] == tokenize(model, "user")
        assert len(tokenize(model, " the")) == 1  # word pieces merge
        unk = llama_cpp.llama_vocab_get_text(vocab, 0)
        assert unk == b"<unk>"
        assert 0 not in tokenize(model, "héllo wörld 日本 \u2603 \x00")  # bytes, never <unk>


def test_chat_template_is_chatml(tiny_models) -> None:
    with loaded(tiny_models[("qwen35", False)].model_path) as (model, _ctx):
        stored = llama_cpp.llama_model_chat_template(model, None)
    assert stored.decode() == CHAT_TEMPLATE
    # rendered the way llama-cpp-python's Jinja2ChatFormatter does
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(CHAT_TEMPLATE)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is "},
                                     {"type": "image_url", "image_url": {"url": "x"}}]},
    ]
    expected = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwhat is <__media__><|im_end|>\n"
    assert template.render(messages=messages, add_generation_prompt=False) == expected
    with_prompt = template.render(messages=messages, add_generation_prompt=True)
    assert with_prompt == expected + "<|im_start|>assistant\n"


# ---------------------------------------------------------------- vision


@pytest.mark.parametrize("arch", ARCHES)
def test_mmproj_tokenizes_encodes_and_feeds_the_text_model(tiny_models, arch: str) -> None:
    record = tiny_models[(arch, True)]
    n_embd = text_spec(arch, "tiny").n_embd
    png = png_bytes(160, 96)
    with loaded(record.model_path) as (model, ctx), vision_context(record.mmproj_path, model) as mctx:
        assert mtmd_cpp.mtmd_support_vision(mctx)
        assert mtmd_cpp.mtmd_decode_use_mrope(mctx) == (arch != "llama")
        buf = (ctypes.c_uint8 * len(png)).from_buffer_copy(png)
        bitmap = mtmd_cpp.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(png), False)
        assert bitmap
        chunks = mtmd_cpp.mtmd_input_chunks_init()
        try:
            prompt = f"<|im_start|>user\n{mtmd_cpp.mtmd_default_marker().decode()}what is it?"
            text = mtmd_cpp.mtmd_input_text()
            text.text = prompt.encode()
            text.text_len = len(text.text)
            text.add_special = False
            text.parse_special = True
            bitmaps = (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(bitmap)
            assert mtmd_cpp.mtmd_tokenize(mctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
            kinds = [
                mtmd_cpp.mtmd_input_chunk_get_type(mtmd_cpp.mtmd_input_chunks_get(chunks, i))
                for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks))
            ]
            assert kinds == [0, 1, 0]  # text, image, text
            image = mtmd_cpp.mtmd_input_chunks_get(chunks, 1)
            n_tokens = mtmd_cpp.mtmd_input_chunk_get_n_tokens(image)
            assert n_tokens > 0
            n_pos = mtmd_cpp.mtmd_input_chunk_get_n_pos(image)
            if arch == "llama":
                assert n_pos == n_tokens == 16  # 64 px / 16 px patches, squared
            else:
                # M-RoPE: the image spans max(grid w, grid h) positions, not n_tokens
                image_tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_image(image)
                nx = mtmd_cpp.mtmd_image_tokens_get_nx(image_tokens)
                ny = mtmd_cpp.mtmd_image_tokens_get_ny(image_tokens)
                assert n_tokens == nx * ny and n_pos == max(nx, ny) < n_tokens
                # mtmd wraps Qwen-VL images in <|vision_start|> ... <|vision_end|>
                n_text = ctypes.c_size_t()
                head = mtmd_cpp.mtmd_input_chunk_get_tokens_text(
                    mtmd_cpp.mtmd_input_chunks_get(chunks, 0), ctypes.byref(n_text))
                assert head[n_text.value - 1] == tokenize(model, "<|vision_start|>")[0]

            assert mtmd_cpp.mtmd_encode_chunk(mctx, image) == 0
            embd = np.ctypeslib.as_array(mtmd_cpp.mtmd_get_output_embd(mctx),
                                         shape=(n_tokens, n_embd))
            assert np.isfinite(embd).all() and embd.std() > 1e-4

            new_n_past = llama_cpp.llama_pos(0)
            assert mtmd_cpp.mtmd_helper_eval_chunks(
                mctx, ctx, chunks, 0, 0, 512, True, ctypes.byref(new_n_past)) == 0
            assert new_n_past.value == mtmd_cpp.mtmd_helper_get_n_pos(chunks)
            n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            assert np.isfinite(logits).all() and logits.std() > 1e-3
        finally:
            mtmd_cpp.mtmd_input_chunks_free(chunks)
            mtmd_cpp.mtmd_bitmap_free(bitmap)


@pytest.mark.parametrize("arch", ARCHES)
def test_vision_does_not_change_the_text_model(tiny_models, arch: str) -> None:
    text_only, with_vision = tiny_models[(arch, False)], tiny_models[(arch, True)]
    assert text_only.mmproj_path is None and text_only.mmproj_bytes == 0
    assert with_vision.mmproj_bytes == with_vision.mmproj_path.stat().st_size > 0
    assert text_only.model_path.read_bytes() == with_vision.model_path.read_bytes()


# ---------------------------------------------------------------- determinism, caching, errors


def test_same_seed_same_bytes_other_seed_other_bytes(tiny_models, tmp_path: Path) -> None:
    reference = tiny_models[("qwen35moe", True)]
    again = forge("qwen35moe", "tiny", tmp_path / "again", vision=True, seed=0)
    assert file_bytes(again) == file_bytes(reference)
    assert attrs.evolve(again, model_path=reference.model_path,
                        mmproj_path=reference.mmproj_path) == reference
    other = forge("qwen35moe", "tiny", tmp_path / "other", vision=True, seed=1)
    model, mmproj = file_bytes(other)
    ref_model, ref_mmproj = file_bytes(reference)
    assert model != ref_model and mmproj != ref_mmproj
    assert len(model) == len(ref_model)  # same shapes, other values


def test_forge_cached_forges_once(tmp_path: Path) -> None:
    first = forge_cached("llama", "tiny", vision=True, seed=3, cache_dir=tmp_path)
    entry = tmp_path / f"llama-tiny-v-s3-{FORGE_VERSION}"
    assert entry.name == entry_name("llama", "tiny", vision=True, seed=3)
    assert first.model_path == entry / "model.gguf" and first.mmproj_path == entry / "mmproj.gguf"
    # back-date the files: a rewrite would give them a current mtime again
    for path in (first.model_path, first.mmproj_path):
        os.utime(path, ns=(1, 1))
    second = forge_cached("llama", "tiny", vision=True, seed=3, cache_dir=tmp_path)
    assert second == first
    assert second.model_path.stat().st_mtime_ns == second.mmproj_path.stat().st_mtime_ns == 1
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temp dirs left


def test_forge_cached_crash_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*_args: object) -> int:
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(forge_build, "write_mmproj", crash)  # after model.gguf was written
    with pytest.raises(RuntimeError):
        forge_cached("qwen35", "tiny", vision=True, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    record = forge_cached("qwen35", "tiny", vision=True, cache_dir=tmp_path)
    assert record.mmproj_path is not None and record.mmproj_path.is_file()


def test_forge_cached_concurrent_callers_agree(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        records = list(pool.map(
            lambda _: forge_cached("qwen35moe", "tiny", vision=True, seed=9, cache_dir=tmp_path),
            range(4)))
    assert all(r == records[0] for r in records)
    assert [p.name for p in tmp_path.iterdir()] == [entry_name("qwen35moe", "tiny", vision=True,
                                                               seed=9)]
    assert sorted(p.name for p in records[0].model_path.parent.iterdir()) == ["mmproj.gguf",
                                                                             "model.gguf"]


def test_forge_cached_default_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVAGENT_CACHE_DIR", str(tmp_path / "cache"))
    record = forge_cached("qwen35", "tiny")
    assert record.model_path == tmp_path / "cache" / f"qwen35-tiny-t-s0-{FORGE_VERSION}" / "model.gguf"
    assert record.mmproj_path is None


@pytest.mark.parametrize(
    ("arch", "size", "seed"),
    [("gpt2", "tiny", 0), ("llama", "XL", 0), ("llama", "tiny", -1), ("llama", "tiny", 1.5),
     ("llama", "tiny", True), ("llama", "tiny", "1"), ("llama", "tiny", 2**63)],
)
def test_bad_requests_raise_forge_error(tmp_path: Path, arch, size, seed) -> None:
    with pytest.raises(ForgeError):
        forge(arch, size, tmp_path / "out", seed=seed)
    with pytest.raises(ValueError):  # ForgeError is a ValueError
        forge_cached(arch, size, seed=seed, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_out_dir_that_is_a_file_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ForgeError, match="not a directory"):
        forge("llama", "tiny", blocker)
    with pytest.raises(ForgeError, match="not a directory"):
        forge_cached("llama", "tiny", cache_dir=blocker)
