"""The engine's one pre-load GGUF reader (``cachepolicy.engine.gguf_meta``): what it reads is
what llama.cpp reads once the model is loaded, and a damaged file is one clear error naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cachepolicy.engine.gguf_meta import GgufUnreadable, metadata, tensor_types
from cachepolicy.engine.native import model_meta


def test_metadata_before_the_load_is_what_llama_cpp_reads_after_it(forged: Any,
                                                                  engines: Any) -> None:
    model = forged("qwen35")
    meta = metadata(model.model_path)
    loaded = engines("qwen35")._native.model
    keys = [k for k in meta if k.startswith("qwen35.") and not isinstance(meta[k], list)]
    assert len(keys) >= 8, keys  # block count, widths, heads, context, rope, ssm sizes...
    for key in ["general.architecture", *keys]:
        theirs = model_meta(loaded, key)
        assert theirs is not None, key
        ours = meta[key]
        assert (float(theirs) == pytest.approx(float(ours), rel=1e-6)
                if isinstance(ours, float) else theirs == str(ours)), key
    assert not any(k.startswith("tokenizer.") for k in meta)  # the large arrays stay unread


def test_tensor_types_name_every_weight(forged: Any) -> None:
    types = tensor_types(forged("llama").model_path)
    assert "token_embd.weight" in types and "blk.0.attn_q.weight" in types
    assert set(types.values()) <= {"F16", "F32"}  # the forge writes f16 matrices, f32 norms


@pytest.mark.parametrize("content", [b"", b"GGUF\x03\x00\x00\x00" + b"\xff" * 40,
                                     b"not a model at all"])
def test_a_damaged_file_is_one_error_naming_it(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "damaged.gguf"
    bad.write_bytes(content)
    for read in (metadata, tensor_types):
        with pytest.raises(GgufUnreadable, match="damaged.gguf"):
            read(bad)
    with pytest.raises(GgufUnreadable, match="missing.gguf"):
        metadata(tmp_path / "missing.gguf")
