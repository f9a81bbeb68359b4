"""Tensor plans and metadata of the vision projectors (mmproj, general.architecture = clip).

Three flavours, following tools/mtmd/clip.cpp (and tools/mtmd/models/qwen2vl.cpp, qwen3vl.cpp):
- "mlp" (LLaVA-1.5 style) for llama: class token + learned positions, ViT blocks with
  separate q/k/v, and a 2-layer MLP projector mm.0 / mm.2. LLaVA reads features from the
  second-to-last block, so the last block is loaded but unused (as in real LLaVA).
- "qwen3vl_merger" for qwen35*: two temporal patch kernels, learned position grid
  (bilinearly resized per image), fused qkv blocks with 2-D M-RoPE, and a 2×2 spatial
  merge followed by mm.0 {4E,H} / mm.2 {H,text_E} (H = 4E unless the spec says). Paired with
  qwen35* there are no deepstack layers (the text model has none); paired with qwen3vl* the
  blocks in ``deepstack_layers`` each feed a deepstack merger ``v.deepstack.<block>.{norm,
  fc1, fc2}`` (LayerNorm over the merged 4E, then 4E -> 4E -> text_E) whose output is
  appended to every image row: rows are (1 + len(deepstack_layers)) * text_E wide, what the
  text model's ``n_deepstack_layers`` makes it expect.
- "qwen2.5vl_merger" for qwen2vl (Qwen2.5-VL, UI-TARS-1.5, OpenCUA): two temporal patch
  kernels without bias, no learned positions (2-D M-RoPE only), RMS norms, separate q/k/v
  with biases, a SwiGLU FFN, window attention in every block but each ``n_wa_pattern``-th,
  and the same 2×2 merge into mm.0 / mm.2.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from .specs import VisionSpec
from .writer import TensorPlan, const, normal, write_gguf

QWEN25VL = "qwen2.5vl_merger"

# CLIP / SigLIP normalisation is irrelevant for random weights; 0.5/0.5 maps [0,1] to [-1,1].
_IMAGE_MEAN = [0.5, 0.5, 0.5]
_IMAGE_STD = [0.5, 0.5, 0.5]


def _linear(name: str, n_in: int, n_out: int) -> list[TensorPlan]:
    return [normal(f"{name}.weight", n_in, n_out), const(f"{name}.bias", n_out, value=0.0)]


def _layer_norm(name: str, n: int) -> list[TensorPlan]:
    return [const(f"{name}.weight", n), const(f"{name}.bias", n, value=0.0)]


def _rms_norm(name: str, n: int) -> list[TensorPlan]:
    return [const(f"{name}.weight", n)]


def _block(spec: VisionSpec, il: int) -> list[TensorPlan]:
    e, p = spec.n_embd, f"v.blk.{il}"
    qwen25 = spec.projector == QWEN25VL
    norm = _rms_norm if qwen25 else _layer_norm
    plans = norm(f"{p}.ln1", e)
    if spec.projector == "qwen3vl_merger":
        plans += _linear(f"{p}.attn_qkv", e, 3 * e)
    else:
        for part in ("attn_q", "attn_k", "attn_v"):
            plans += _linear(f"{p}.{part}", e, e)
    plans += _linear(f"{p}.attn_out", e, e)
    plans += norm(f"{p}.ln2", e)
    if qwen25:  # SwiGLU
        plans += _linear(f"{p}.ffn_gate", e, spec.n_ff)
    plans += _linear(f"{p}.ffn_up", e, spec.n_ff)
    plans += _linear(f"{p}.ffn_down", spec.n_ff, e)
    return plans


def _deepstack(spec: VisionSpec, il: int) -> list[TensorPlan]:
    merged = spec.n_embd * spec.spatial_merge**2
    p = f"v.deepstack.{il}"
    return [*_layer_norm(f"{p}.norm", merged), *_linear(f"{p}.fc1", merged, merged),
            *_linear(f"{p}.fc2", merged, spec.projection_dim)]


def mmproj_plans(spec: VisionSpec) -> list[TensorPlan]:
    """Every tensor of the projector, in file order."""
    e, ps = spec.n_embd, spec.patch_size
    # conv kernel {P, P, 3, E}; patch std ~ 1/sqrt(fan_in) keeps patch features O(1)
    patch_std = (3 * ps * ps) ** -0.5
    plans = [normal("v.patch_embd.weight", ps, ps, 3, e, std=patch_std)]
    if spec.projector == QWEN25VL:
        # no patch bias (clip.cpp asserts it), no learned positions
        plans.append(normal("v.patch_embd.weight.1", ps, ps, 3, e, std=patch_std))
    elif spec.projector == "qwen3vl_merger":
        plans += [
            normal("v.patch_embd.weight.1", ps, ps, 3, e, std=patch_std),
            const("v.patch_embd.bias", e, value=0.0),
            # f32: the grid is bilinearly resized (ggml_interpolate) for every image
            normal("v.position_embd.weight", e, spec.pos_side**2, f32=True),
        ]
    else:
        n_pos = spec.pos_side**2 + 1  # patches + class token
        plans += [
            normal("v.class_embd", e),
            normal("v.position_embd.weight", e, n_pos, f32=True),
            *_layer_norm("v.pre_ln", e),
        ]
    for il in range(spec.n_layer):
        plans += _block(spec, il)
        if il in spec.deepstack_layers:
            plans += _deepstack(spec, il)
    if spec.projector in ("qwen3vl_merger", QWEN25VL):
        merged = e * spec.spatial_merge**2
        plans += (_rms_norm if spec.projector == QWEN25VL else _layer_norm)("v.post_ln", e)
        hidden = spec.merger_hidden or merged
        plans += _linear("mm.0", merged, hidden)
        plans += _linear("mm.2", hidden, spec.projection_dim)
    else:
        plans += _linear("mm.0", e, spec.projection_dim)
        plans += _linear("mm.2", spec.projection_dim, spec.projection_dim)
    return plans


def _add_metadata(writer: gguf.GGUFWriter, spec: VisionSpec, name: str | None = None) -> None:
    writer.add_string("general.name", name or f"kvagent-forge-mmproj-{spec.projector}")
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", spec.projector)
    if spec.projector == QWEN25VL:
        writer.add_bool("clip.use_silu", True)
    else:
        writer.add_bool("clip.use_gelu", True)
    v = "clip.vision"
    writer.add_uint32(f"{v}.image_size", spec.image_size)
    writer.add_uint32(f"{v}.patch_size", spec.patch_size)
    writer.add_uint32(f"{v}.embedding_length", spec.n_embd)
    writer.add_uint32(f"{v}.feed_forward_length", spec.n_ff)
    writer.add_uint32(f"{v}.block_count", spec.n_layer)
    writer.add_uint32(f"{v}.attention.head_count", spec.n_head)
    writer.add_uint32(f"{v}.projection_dim", spec.projection_dim)
    writer.add_float32(f"{v}.attention.layer_norm_epsilon", spec.eps)
    writer.add_array(f"{v}.image_mean", _IMAGE_MEAN)
    writer.add_array(f"{v}.image_std", _IMAGE_STD)
    if spec.projector in ("qwen3vl_merger", QWEN25VL):
        writer.add_uint32(f"{v}.spatial_merge_size", spec.spatial_merge)
    if spec.deepstack_layers:
        writer.add_array(f"{v}.is_deepstack_layers",
                         [il in spec.deepstack_layers for il in range(spec.n_layer)])
    if spec.n_wa_pattern:
        writer.add_uint32(f"{v}.n_wa_pattern", spec.n_wa_pattern)
        writer.add_uint32(f"{v}.window_size", spec.window_size)


def write_mmproj(spec: VisionSpec, path: Path, seed: int,
                 plans: list[TensorPlan] | None = None, *, name: str | None = None,
                 flags: tuple[str, ...] = ()) -> int:
    """Write the projector GGUF to `path`; returns the file size in bytes.  ``plans``: the
    tensors (default ``mmproj_plans(spec)`` drawn from ``seed``); ``name``: general.name;
    ``flags``: boolean metadata keys written as true."""
    # tensor names (v.*, mm.*) are disjoint from the text model's, so the same seed gives
    # independent values in the two files
    chosen = mmproj_plans(spec) if plans is None else plans

    def metadata(writer: gguf.GGUFWriter) -> None:
        _add_metadata(writer, spec, name)
        for flag in flags:
            writer.add_bool(flag, True)

    return write_gguf(path, "clip", metadata, chosen, seed)
