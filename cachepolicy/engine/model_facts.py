"""What llama.cpp says about a model file without loading its weights (``kvagent check-model``).

``read_facts`` opens the GGUF with ``vocab_only`` — llama.cpp reads the metadata and the
vocabulary and stops before the tensors — so a 30 GB model is answered in about a second:
whether this llama.cpp knows the architecture, the layer kind (attention / hybrid /
recurrent, as the engine classifies it) and the rope type, which llama.cpp decides by the
architecture, and the chat template.  A ``vocab_only`` model has no hyper-parameters
(``llama_model_n_layer`` is 0 and ``llama_model_n_head`` aborts), so the numbers — layers,
trained context, the RoPE's dimensions and scaling — come from the GGUF metadata
(``gguf_meta``), read the way ``kv_access.read_rope`` reads a loaded model's.  A projector's pairing with it is the
engine's own check (``vision.check_pairing``), asked here before anything loads.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import llama_cpp

from cachepolicy.engine.backend import init_backend
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.engine.errors import ModelLoadError
from cachepolicy.engine.gguf_meta import metadata
from cachepolicy.engine.kv_access import edit_problem
from cachepolicy.engine.kv_rope import MULTI_SECTION, RopeSpec, shift_refusal
from cachepolicy.engine.native import model_meta
from cachepolicy.engine.vision import (
    MROPE_PROJECTORS, check_pairing, declares_position_features, projector_type,
)

_MROPE_TYPES = (llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE)


@attrs.frozen
class ModelFacts:
    """One text model (and optionally its projector) as llama.cpp reads it."""

    arch: str
    name: str  # general.name ("" if absent)
    kind: ModelKind
    n_layer: int
    n_ctx_train: int
    n_embd: int
    rope: RopeSpec
    chat_template: str | None
    projector: str | None = None  # clip.projector_type of the mmproj, if one was given
    #: why the projector cannot feed this model (None: it pairs, or none was given)
    pairing_problem: str | None = None

    @property
    def mrope(self) -> bool:
        """Images placed by multi-section RoPE (the model's rope type, or its projector)."""
        return self.rope.rope_type in _MROPE_TYPES or self.projector in MROPE_PROJECTORS

    @property
    def shift_problem(self) -> str | None:
        """Why llama.cpp will not shift this model's cached positions (the condition
        ``Engine.shift_problem`` reads from the loaded context), or None."""
        return shift_refusal(self.rope.rope_type)

    @property
    def kv_edit_problem(self) -> str | None:
        """Why cached KV rows cannot be moved and patched here (the splicing policies'
        condition; None: they can)."""
        return edit_problem(self.kind, self.rope, self.projector in MROPE_PROJECTORS)


def read_facts(model_path: str | Path, mmproj_path: str | Path | None = None) -> ModelFacts:
    """The model's facts, read by llama.cpp with ``vocab_only`` (no weights loaded);
    ``ModelLoadError`` when llama.cpp cannot read the file (a missing file, an architecture
    this llama.cpp does not know)."""
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")
    if mmproj_path is not None and not Path(mmproj_path).is_file():
        raise ModelLoadError(f"mmproj file not found: {mmproj_path}")
    init_backend(False)
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
    if not model:
        raise ModelLoadError(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) could not "
                             f"read {model_path}: an architecture it does not know, or not a "
                             f"GGUF model")
    try:
        if llama_cpp.llama_model_is_hybrid(model):
            kind = ModelKind.HYBRID
        elif llama_cpp.llama_model_is_recurrent(model):
            kind = ModelKind.RECURRENT
        else:
            kind = ModelKind.ATTENTION
        raw = llama_cpp.llama_model_chat_template(model, None)
        rope_type = int(llama_cpp.llama_model_rope_type(model))
        arch = model_meta(model, "general.architecture") or "?"
        name = model_meta(model, "general.name") or ""
    finally:
        llama_cpp.llama_model_free(model)
    meta = metadata(model_path)
    n_layer = int(meta.get(f"{arch}.block_count") or 0)
    rope = _rope(meta, arch, rope_type)
    facts = ModelFacts(arch=arch, name=name, kind=kind, n_layer=n_layer,
                       n_ctx_train=int(meta.get(f"{arch}.context_length") or 0),
                       n_embd=int(meta.get(f"{arch}.embedding_length") or 0), rope=rope,
                       chat_template=raw.decode("utf-8", errors="replace") if raw else None)
    if mmproj_path is None:
        return facts
    mmproj_path = Path(mmproj_path)
    kind_of = projector_type(mmproj_path)
    try:
        check_pairing(mmproj_path, kind_of, rope.rope_type,
                      position_features=declares_position_features(mmproj_path))
        problem = None
    except ModelLoadError as exc:
        problem = str(exc)
    return attrs.evolve(facts, projector=kind_of, pairing_problem=problem)


def _rope(meta: dict, arch: str, rope_type: int) -> RopeSpec:
    """The RoPE as ``kv_access.read_rope`` reads it from a loaded model, from the metadata
    (head dim = key_length, else n_embd / n_head; a scaling factor f is freq_scale 1/f)."""
    n_embd = int(meta.get(f"{arch}.embedding_length") or 0)
    heads = meta.get(f"{arch}.attention.head_count") or 1
    n_head = max(1, max(heads) if isinstance(heads, list) else int(heads))
    key_length = meta.get(f"{arch}.attention.key_length")
    head_dim = int(key_length) if key_length else n_embd // n_head
    n_rot = meta.get(f"{arch}.rope.dimension_count")
    factor = float(meta.get(f"{arch}.rope.scaling.factor") or 0.0)
    sections = (tuple(int(x) for x in meta.get(f"{arch}.rope.dimension_sections") or ())
                if rope_type in MULTI_SECTION else ())
    return RopeSpec(rope_type=rope_type, n_rot=int(n_rot) if n_rot else head_dim,
                    sections=sections,
                    head_dim=head_dim,
                    freq_base=float(meta.get(f"{arch}.rope.freq_base") or 10_000.0),
                    freq_scale=1.0 / factor if factor else 1.0,
                    scaling=str(meta.get(f"{arch}.rope.scaling.type") or "none"))
