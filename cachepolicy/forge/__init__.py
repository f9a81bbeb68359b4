"""The model forge: deterministic random-weight GGUF models that llama.cpp loads and runs.

Arches: "llama" (attention only), "qwen35" (Gated DeltaNet + attention hybrid with
multi-section RoPE), "qwen35moe" (the hybrid with a mixture-of-experts FFN), and the text
models of the Qwen-VL family GUI agents ship in (attention only, multi-section RoPE):
"qwen2vl" (Qwen2-VL / Qwen2.5-VL: UI-TARS-1.5, OpenCUA, GUI-Owl), "qwen3vl" and "qwen3vlmoe"
(Qwen3-VL dense and MoE, with deepstack). Sizes: "tiny" (unit tests), "XS" (≈3 M, the
smallest whose rows fit K-quants), "S" (≈10 M params), "M" (≈50 M), "L" (≈150 M). With
vision=True an mmproj is written too: LLaVA "mlp" for llama, "qwen2.5vl_merger" for qwen2vl,
"qwen3vl_merger" for qwen35* (no deepstack) and qwen3vl* (with deepstack mergers, so image
rows are (1 + deepstack) × n_embd wide). The Qwen-VL arches carry the released models' chat
templates and added tokens (``tokenizer``). With quant="q4_k_m" (or another of QUANTS) the
text model is quantized by llama.cpp's own quantizer; the mmproj stays f16.

    forged = forge_cached("qwen35", "tiny", vision=True)
    forged.model_path, forged.mmproj_path
    forge_cached("qwen35", "XS", quant="q4_k_m").model_path
"""

from __future__ import annotations

from .build import MMPROJ_FILE, MODEL_FILE, ForgedModel, forge
from .cache import default_cache_dir, entry_name, forge_cached
from .errors import ForgeError
from .quant import QUANTS, check_quant
from .specs import (ARCHES, FORGE_VERSION, SIZES, VL_ARCHES, TextSpec, VisionSpec, text_spec,
                    vision_spec)
from .tokenizer import (CHAT_TEMPLATE, MEDIA_MARKER, QWEN2VL_CHAT_TEMPLATE,
                        QWEN3VL_CHAT_TEMPLATE, chat_template)

__all__ = [
    "ARCHES",
    "CHAT_TEMPLATE",
    "FORGE_VERSION",
    "MEDIA_MARKER",
    "MMPROJ_FILE",
    "QWEN2VL_CHAT_TEMPLATE",
    "QWEN3VL_CHAT_TEMPLATE",
    "VL_ARCHES",
    "chat_template",
    "MODEL_FILE",
    "QUANTS",
    "SIZES",
    "ForgeError",
    "ForgedModel",
    "TextSpec",
    "check_quant",
    "VisionSpec",
    "default_cache_dir",
    "entry_name",
    "forge",
    "forge_cached",
    "text_spec",
    "vision_spec",
]
