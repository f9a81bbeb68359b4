"""Which quantizations the forge offers, and which forged sizes can take them.

llama.cpp quantizes a weight matrix in blocks along its rows: 32 values for the legacy types
(Q8_0, Q5_0, Q4_0, IQ4_NL), 256 for the K-quants and IQ4_XS.  A matrix whose row length is
not a multiple of the block falls back to another type (Q4_K -> Q5_0, Q6_K -> Q8_0, IQ4_XS
-> IQ4_NL, ...), as llama.cpp does for real models.  A request where even the embedding width
is not a multiple would fall back almost everywhere and is refused: the file would be named
for a type it barely contains.
"""

from __future__ import annotations

from .errors import ForgeError
from .specs import SIZES, text_spec

#: quantization names (llama-quantize's, lower case) -> the block length along a row
QUANTS: dict[str, int] = {
    "f16": 1,
    "q8_0": 32,
    "q6_k": 256,
    "q5_k_m": 256,
    "q5_k_s": 256,
    "q5_0": 32,
    "q4_k_m": 256,
    "q4_k_s": 256,
    "q4_0": 32,
    "iq4_xs": 256,
    "iq4_nl": 32,
    "q3_k_m": 256,
    "q2_k": 256,
}


def check_quant(arch: str, size: str, quant: object) -> None:
    """Raise ForgeError unless ``quant`` is known and fits (arch, size)'s row lengths."""
    if quant not in QUANTS:
        raise ForgeError(f"unknown quantization {quant!r}; expected one of {', '.join(QUANTS)}")
    block = QUANTS[quant]
    width = text_spec(arch, size).n_embd
    if width % block:
        fits = [s for s in SIZES if text_spec(arch, s).n_embd % block == 0]
        raise ForgeError(
            f"{quant} quantizes rows in blocks of {block}; size {size} has {width}-wide rows, so "
            f"nearly every matrix would fall back to another type. Sizes that fit: "
            f"{', '.join(fits)}")
