"""Parameters ↔ GGUF: read a forge-written model into a pytree, write a trained pytree back.

Export goes through the forge's own writer (``write_text_model(values=…)``): the same
metadata keys, tokenizer keys and chat template as a forged model, matrices f16 and 1-D
tensors (and ``ssm_conv1d``) f32, so kvagent's ``Engine`` loads it through the same llama.cpp
path as any model; ``quant="q8_0"`` (or another of the forge's ``QUANTS``) then runs llama.cpp's
own quantizer on that f16 file.  Export is deterministic: the same pytree, spec and vocabulary
give byte-identical files (the writer adds no timestamps; f32 → f16 rounds to nearest even).
Loading the f16 export gives back the f16-rounded pytree, and exporting a loaded forged
model reproduces the forged file byte for byte.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import gguf
import jax
import jax.numpy as jnp
import numpy as np
import structlog

from cachepolicy.forge import QUANTS, TextSpec, vision_spec
from cachepolicy.forge.build import write_quantized
from cachepolicy.forge.mmproj import write_mmproj
from cachepolicy.forge.text_model import write_text_model
from cachepolicy.forge.tokenizer import Vocab, build_vocab
from runtime.train.model import check_spec
from runtime.train.params import Params, check_params

log = structlog.get_logger("kvagent.train")

_FORGE_NAME = "kvagent-forge-"  # general.name of forged models: kvagent-forge-<arch>-<size>


@attrs.frozen(eq=False)
class LoadedModel:
    """A text model read from GGUF: its hyper-parameters, vocabulary and f32 parameters."""

    spec: TextSpec
    vocab: Vocab
    params: Params = attrs.field(repr=False)


@attrs.frozen
class ExportedModel:
    path: Path
    n_bytes: int
    sha256: str
    quant: str


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value (ValueError if absent and no default is given)."""
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF key {key} missing")
        return default
    return field.contents()


def _array(reader: gguf.GGUFReader, key: str) -> list[Any]:
    value = _field(reader, key)
    if not isinstance(value, list):
        raise ValueError(f"GGUF key {key} is not an array")
    return value


def _f32(value: object) -> float:
    """A stored f32 as the shortest decimal that rounds to it (1e-06, not 9.9999997e-07): the
    spec then equals the one the file was written from, and writes the same bits again."""
    return float(str(np.float32(value)))


def _size_label(reader: gguf.GGUFReader, arch: str) -> str:
    """The forge's size name from ``general.name`` (kvagent-forge-<arch>-<size>), else
    "custom"; it only names the model again on export."""
    name, prefix = str(_field(reader, "general.name", "")), f"{_FORGE_NAME}{arch}-"
    return name[len(prefix):] if name.startswith(prefix) else "custom"


def spec_from_gguf(reader: gguf.GGUFReader) -> TextSpec:
    """The ``TextSpec`` a GGUF's metadata describes (ValueError for what the forge's spec
    cannot express: another arch, other RoPE dims or sections, head sizes that differ)."""
    arch = str(_field(reader, "general.architecture"))
    if arch not in ("llama", "qwen35"):
        raise ValueError(f"arch {arch!r} is not trainable here (llama and qwen35 only)")

    def u(key: str) -> int:
        return int(_field(reader, f"{arch}.{key}"))

    n_embd, n_head = u("embedding_length"), u("attention.head_count")
    spec = TextSpec(
        arch=arch, size=_size_label(reader, arch),
        n_vocab=len(_array(reader, "tokenizer.ggml.tokens")), n_embd=n_embd,
        n_layer=u("block_count"), n_head=n_head, n_head_kv=u("attention.head_count_kv"),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head)),
        n_ff=u("feed_forward_length"), n_ctx_train=u("context_length"),
        rope_freq_base=_f32(_field(reader, f"{arch}.rope.freq_base")),
        rms_eps=_f32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")))
    if arch == "qwen35":
        spec = attrs.evolve(
            spec, full_attention_interval=u("full_attention_interval"),
            ssm_state=u("ssm.state_size"), ssm_groups=u("ssm.group_count"),
            ssm_v_heads=u("ssm.time_step_rank"), ssm_conv_kernel=u("ssm.conv_kernel"))
        sections = tuple(int(x) for x in _array(reader, f"{arch}.rope.dimension_sections"))
        if sections != spec.rope_sections:
            raise ValueError(f"rope sections {sections} differ from the spec's "
                             f"{spec.rope_sections}")
        if u("ssm.inner_size") != spec.ssm_inner:
            raise ValueError("ssm.inner_size != state_size * time_step_rank")
    if u("rope.dimension_count") != spec.rope_dims:
        raise ValueError(f"rope dims {u('rope.dimension_count')} differ from the spec's "
                         f"{spec.rope_dims}")
    return spec


def vocab_from_gguf(reader: gguf.GGUFReader) -> Vocab:
    """The tokenizer arrays (scores as stored: f32)."""
    return Vocab(tuple(str(t) for t in _array(reader, "tokenizer.ggml.tokens")),
                 tuple(float(x) for x in _array(reader, "tokenizer.ggml.scores")),
                 tuple(int(x) for x in _array(reader, "tokenizer.ggml.token_type")))


def _tensor_values(tensor: gguf.ReaderTensor) -> np.ndarray:
    shape = tuple(reversed([int(d) for d in tensor.shape]))
    if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return np.asarray(tensor.data, dtype=np.float32).reshape(shape)
    # quantized (e.g. Q8_0): dequantize with gguf's reference code
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)


def load_gguf(path: str | Path) -> LoadedModel:
    """Read a ``llama`` or ``qwen35`` text model (forged or exported) into f32 parameters.

    f16 / f32 tensors load exactly; quantized ones are dequantized.  Raises ValueError for a
    model this trainer cannot represent (see ``spec_from_gguf``) or whose tensors do not match
    its spec."""
    reader = gguf.GGUFReader(str(path))
    spec = spec_from_gguf(reader)
    check_spec(spec)
    params = {t.name: jnp.asarray(_tensor_values(t)) for t in reader.tensors}
    check_params(spec, params)
    return LoadedModel(spec=spec, vocab=vocab_from_gguf(reader), params=params)


def to_numpy(params: Mapping[str, jax.Array | np.ndarray]) -> dict[str, np.ndarray]:
    """Host f32 copies of every parameter (what export writes)."""
    return {name: np.asarray(jax.device_get(v), dtype=np.float32) for name, v in params.items()}


def export_gguf(path: str | Path, spec: TextSpec, params: Mapping[str, jax.Array | np.ndarray],
                *, vocab: Vocab | None = None, quant: str = "f16") -> ExportedModel:
    """Write ``params`` as a GGUF model of ``spec`` to ``path`` (atomically).

    ``vocab`` defaults to the forge's ``build_vocab(spec.n_vocab)``; pass the loaded model's
    (``LoadedModel.vocab``) or one with extra pieces (``build_vocab(n, extra_pieces)``).
    ``quant`` is "f16" or one of the forge's ``QUANTS`` (llama.cpp's quantizer, same rules and
    row-block limits as ``kvagent forge --quant``).
    """
    check_spec(spec)
    check_params(spec, params)
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; expected one of {', '.join(QUANTS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = to_numpy(params)
    bad = [n for n, v in values.items() if not np.isfinite(v).all()]
    if bad:
        raise ValueError(f"non-finite values in {bad[:5]}")
    vocab = vocab if vocab is not None else build_vocab(spec.n_vocab)

    def write_f16(target: Path) -> object:
        return write_text_model(spec, target, 0, values=values, vocab=vocab)

    if quant == "f16":
        write_f16(path)
    else:
        write_quantized(path, quant, write_f16)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    size = os.path.getsize(path)
    log.info("train_export_written", path=str(path), quant=quant, n_bytes=size,
             sha256=digest[:16])
    return ExportedModel(path=path, n_bytes=size, sha256=digest, quant=quant)


def write_mmproj_for(spec: TextSpec, path: str | Path, *, seed: int = 0,
                     like_size: str = "XS") -> Path:
    """Forge the frozen vision projector for a (custom) ``spec``: the forge's projector of
    ``like_size`` for the arch (``qwen3vl_merger`` for qwen35, LLaVA ``mlp`` for llama) with
    its output width set to ``spec.n_embd``; random weights from ``seed``, like ``forge``'s.
    Deterministic; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vspec = attrs.evolve(vision_spec(spec.arch, like_size), projection_dim=spec.n_embd)
    write_mmproj(vspec, path, seed)
    return path
