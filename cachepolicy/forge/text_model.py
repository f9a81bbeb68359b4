"""Tensor plans and metadata of the text models (llama, qwen35, qwen35moe, and the Qwen-VL
text models qwen2vl, qwen3vl, qwen3vlmoe).

Shapes follow llama.cpp's create_tensor calls (src/llama-model.cpp, src/models/qwen35*.cpp,
qwen2vl.cpp, qwen3vl*.cpp), in llama.cpp dim order. The output projection is tied to
token_embd (llama.cpp duplicates token_embd when `output.weight` is absent), as in small
Qwen models.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np

from .specs import TextSpec
from .tokenizer import Vocab, add_tokenizer, build_vocab, chat_template, vl_vocab
from .writer import TensorPlan, const, given, normal, uniform, write_gguf

#: An untied LM head: llama.cpp uses it when present, else token_embd (the forge's default).
OUTPUT = "output.weight"

# Conv taps see few inputs; a larger std keeps the recurrent path's signal comparable to the
# attention path's, so the recurrent state visibly matters for the logits.
_CONV_STD = 0.5


def _attention(spec: TextSpec, p: str) -> list[TensorPlan]:
    e, hd = spec.n_embd, spec.head_dim
    q_out = spec.n_head * hd
    kv_out = spec.n_head_kv * hd
    plans = [
        # qwen35 packs a per-head output gate next to the query: twice the query width
        normal(f"{p}.attn_q.weight", e, 2 * q_out if spec.is_hybrid else q_out),
        normal(f"{p}.attn_k.weight", e, kv_out),
        normal(f"{p}.attn_v.weight", e, kv_out),
        normal(f"{p}.attn_output.weight", q_out, e),
    ]
    if spec.qkv_bias:  # Qwen2 / Qwen2.5: biases on q, k, v (small, so they matter a little)
        plans += [normal(f"{p}.attn_q.bias", q_out), normal(f"{p}.attn_k.bias", kv_out),
                  normal(f"{p}.attn_v.bias", kv_out)]
    if spec.qk_norm:
        plans += [const(f"{p}.attn_q_norm.weight", hd), const(f"{p}.attn_k_norm.weight", hd)]
    return plans


def _delta_net(spec: TextSpec, p: str) -> list[TensorPlan]:
    e, nv = spec.n_embd, spec.ssm_v_heads
    return [
        normal(f"{p}.attn_qkv.weight", e, spec.ssm_conv_dim),
        normal(f"{p}.attn_gate.weight", e, spec.ssm_inner),
        # llama.cpp's ssm_conv kernel aborts on f16 weights
        normal(f"{p}.ssm_conv1d.weight", spec.ssm_conv_kernel, spec.ssm_conv_dim,
               std=_CONV_STD, f32=True),
        const(f"{p}.ssm_dt.bias", nv, value=0.0),
        # A = -exp(A_log) must be negative so the state decays
        uniform(f"{p}.ssm_a", nv, low=-8.0, high=-0.5),
        normal(f"{p}.ssm_beta.weight", e, nv),
        normal(f"{p}.ssm_alpha.weight", e, nv),
        const(f"{p}.ssm_norm.weight", spec.ssm_state),
        normal(f"{p}.ssm_out.weight", spec.ssm_inner, e),
    ]


def _ffn(spec: TextSpec, p: str) -> list[TensorPlan]:
    e = spec.n_embd
    if not spec.is_moe:
        return [
            normal(f"{p}.ffn_gate.weight", e, spec.n_ff),
            normal(f"{p}.ffn_up.weight", e, spec.n_ff),
            normal(f"{p}.ffn_down.weight", spec.n_ff, e),
        ]
    x, fe, fs = spec.n_expert, spec.n_ff_exp, spec.n_ff_shexp
    experts = [
        normal(f"{p}.ffn_gate_inp.weight", e, x),
        normal(f"{p}.ffn_gate_exps.weight", e, fe, x),
        normal(f"{p}.ffn_up_exps.weight", e, fe, x),
        normal(f"{p}.ffn_down_exps.weight", fe, e, x),
    ]
    if not fs:  # Qwen3-VL MoE: no shared expert
        return experts
    return experts + [
        normal(f"{p}.ffn_gate_inp_shexp.weight", e),
        normal(f"{p}.ffn_gate_shexp.weight", e, fs),
        normal(f"{p}.ffn_up_shexp.weight", e, fs),
        normal(f"{p}.ffn_down_shexp.weight", fs, e),
    ]


def text_plans(spec: TextSpec) -> list[TensorPlan]:
    """Every tensor of the text model, in file order."""
    e = spec.n_embd
    plans = [normal("token_embd.weight", e, spec.n_vocab), const("output_norm.weight", e)]
    for il in range(spec.n_layer):
        p = f"blk.{il}"
        plans.append(const(f"{p}.attn_norm.weight", e))
        if spec.is_attention(il):
            plans += _attention(spec, p)
        else:
            plans += _delta_net(spec, p)
        # llama calls the pre-FFN norm ffn_norm; Qwen3.5 calls it post_attention_norm
        norm = "post_attention_norm" if spec.is_hybrid else "ffn_norm"
        plans.append(const(f"{p}.{norm}.weight", e))
        plans += _ffn(spec, p)
    return plans


def given_plans(spec: TextSpec, values: Mapping[str, np.ndarray]) -> list[TensorPlan]:
    """``text_plans(spec)`` carrying ``values`` (a trained model's weights, numpy order).

    Every planned tensor must be given, nothing else may be, except an untied
    ``output.weight`` {n_embd, n_vocab}, written after ``output_norm``.  ValueError otherwise
    (a missing, unknown or misshapen tensor).
    """
    plans = text_plans(spec)
    if OUTPUT in values:
        plans.insert(2, normal(OUTPUT, spec.n_embd, spec.n_vocab))
    names = {plan.name for plan in plans}
    missing = sorted(names - set(values))
    unknown = sorted(set(values) - names)
    if missing or unknown:
        raise ValueError(f"tensors missing: {missing[:5]}, unknown: {unknown[:5]} "
                         f"(spec {spec.arch}/{spec.size})")
    return [given(plan, values[plan.name]) for plan in plans]


def _add_metadata(writer: gguf.GGUFWriter, spec: TextSpec, vocab: Vocab) -> None:
    a = spec.arch
    writer.add_string("general.name", f"kvagent-forge-{a}-{spec.size}")
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_uint32(f"{a}.context_length", spec.n_ctx_train)
    writer.add_uint32(f"{a}.embedding_length", spec.n_embd)
    writer.add_uint32(f"{a}.block_count", spec.n_layer)
    writer.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    writer.add_uint32(f"{a}.attention.head_count", spec.n_head)
    writer.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    writer.add_float32(f"{a}.rope.freq_base", spec.rope_freq_base)
    writer.add_uint32(f"{a}.rope.dimension_count", spec.rope_dims)
    if spec.qk_norm:
        writer.add_uint32(f"{a}.attention.key_length", spec.head_dim)
        writer.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    if spec.is_mrope:
        # multi-section RoPE is what lets mtmd give image tokens 2-D positions
        writer.add_array(f"{a}.rope.dimension_sections", list(spec.rope_sections))
    if spec.n_deepstack:
        writer.add_uint32(f"{a}.n_deepstack_layers", spec.n_deepstack)
    if spec.is_hybrid:
        writer.add_uint32(f"{a}.ssm.conv_kernel", spec.ssm_conv_kernel)
        writer.add_uint32(f"{a}.ssm.state_size", spec.ssm_state)
        writer.add_uint32(f"{a}.ssm.group_count", spec.ssm_groups)
        writer.add_uint32(f"{a}.ssm.time_step_rank", spec.ssm_v_heads)
        writer.add_uint32(f"{a}.ssm.inner_size", spec.ssm_inner)
        writer.add_uint32(f"{a}.full_attention_interval", spec.full_attention_interval)
    if spec.is_moe:
        writer.add_uint32(f"{a}.expert_count", spec.n_expert)
        writer.add_uint32(f"{a}.expert_used_count", spec.n_expert_used)
        writer.add_uint32(f"{a}.expert_feed_forward_length", spec.n_ff_exp)
        if spec.n_ff_shexp:
            writer.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)
    add_tokenizer(writer, vocab, chat_template(spec.arch))


def write_text_model(spec: TextSpec, path: Path, seed: int, *,
                     values: Mapping[str, np.ndarray] | None = None,
                     vocab: Vocab | None = None) -> int:
    """Write the text model GGUF to `path`; returns the file size in bytes.

    By default the weights are drawn from ``seed`` and the vocabulary is the forge's
    ``build_vocab(spec.n_vocab)``.  ``values`` writes given weights instead (``given_plans``:
    a trained model; ``seed`` is then unused) and ``vocab`` another vocabulary of
    ``spec.n_vocab`` tokens; metadata, tokenizer keys and chat template are the same either
    way, so the file loads through the same llama.cpp path as a forged model.
    """
    if vocab is None:
        vocab = build_vocab(spec.n_vocab)
        if spec.is_vl:
            vocab = vl_vocab(vocab)
    if len(vocab.tokens) != spec.n_vocab:
        raise ValueError(f"vocabulary of {len(vocab.tokens)} tokens, spec has {spec.n_vocab}")
    plans = text_plans(spec) if values is None else given_plans(spec, values)
    return write_gguf(path, spec.arch, lambda w: _add_metadata(w, spec, vocab), plans, seed)
