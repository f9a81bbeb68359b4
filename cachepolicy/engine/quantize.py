"""llama.cpp's own quantizer (``llama_model_quantize``): GGUF in, quantized GGUF out.

Lives in the engine package because it is the only code that imports ``llama_cpp``; the
forge uses it to make quantized copies of the models it writes.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from cachepolicy.engine.backend import init_backend
from cachepolicy.engine.errors import QuantizeError

#: quantization name (as llama.cpp's ``llama-quantize`` spells it, lower case) -> llama_ftype
FTYPES: dict[str, int] = {
    "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "q5_k_s": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S,
    "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q4_k_s": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "iq4_xs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
    "iq4_nl": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
    "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
}


def quantize_gguf(src: Path, dst: Path, quant: str, *, threads: int = 2,
                  verbose: bool = False) -> None:
    """Quantize the GGUF model ``src`` to ``dst`` with llama.cpp's rules for ``quant``.

    The output is a pure function of the input and ``quant`` (row-wise quantization, no
    timestamps), whatever ``threads`` is.  Raises KeyError for an unknown ``quant``.
    """
    init_backend(verbose)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(),
                                        ctypes.byref(params))
    if rc != 0:
        raise QuantizeError(f"llama_model_quantize({src} -> {quant}) returned {rc}")
