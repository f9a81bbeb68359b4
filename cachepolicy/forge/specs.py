"""Size tables: the hyper-parameters of every forgeable text model and vision projector.

All numbers are chosen so that llama.cpp accepts the model (see the shape rules in
text_model.py / mmproj.py) and so that the parameter counts land near the targets:
tiny ≈ 0.2-0.4 M (unit tests), XS ≈ 2-4 M, S ≈ 10 M, M ≈ 50 M, L ≈ 150 M.

XS is the smallest size whose every weight matrix has rows (ne0) that are multiples of 256,
so llama.cpp's K-quants and IQ4_XS quantize all of it without falling back to a legacy type:
the unit-test size for quantized models (tiny's 64-wide rows would all fall back).
"""

from __future__ import annotations

import attrs

from .errors import ForgeError

ARCHES: tuple[str, ...] = (
    "llama", "qwen35", "qwen35moe", "qwen2vl", "qwen3vl", "qwen3vlmoe")

#: The Qwen-VL text models (attention only, multi-section RoPE over the whole head): Qwen2-VL /
#: Qwen2.5-VL (``qwen2vl``: UI-TARS-1.5, OpenCUA, GUI-Owl), Qwen3-VL dense and MoE.
VL_ARCHES: tuple[str, ...] = ("qwen2vl", "qwen3vl", "qwen3vlmoe")
SIZES: tuple[str, ...] = ("tiny", "XS", "S", "M", "L")

#: Bump whenever the bytes a given (arch, size, vision, seed) produce change, so caches
#: keyed by it never serve a stale model.
FORGE_VERSION = "f1"


@attrs.frozen
class TextSpec:
    """Hyper-parameters of one text model (dims in llama.cpp terms)."""

    arch: str
    size: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx_train: int = 32768
    rope_freq_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    # hybrid (qwen35*): layer i is attention iff (i + 1) % full_attention_interval == 0
    full_attention_interval: int = 1
    ssm_state: int = 0  # head dim of the delta-net keys/values (ds)
    ssm_groups: int = 0  # key heads (nk)
    ssm_v_heads: int = 0  # value heads (nv), a multiple of nk
    ssm_conv_kernel: int = 4
    # mixture of experts (qwen35moe)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    #: Qwen3-VL: the number of first layers that add one deepstack slice of an image row
    #: (image rows are (1 + n_deepstack) * n_embd wide; text rows are padded with zeros)
    n_deepstack: int = 0

    @property
    def is_hybrid(self) -> bool:
        return self.arch in ("qwen35", "qwen35moe")

    @property
    def is_vl(self) -> bool:
        """A Qwen-VL text model (qwen2vl, qwen3vl, qwen3vlmoe)."""
        return self.arch in VL_ARCHES

    @property
    def is_mrope(self) -> bool:
        """Positions have four components (t, y, x, z): multi-section RoPE."""
        return self.is_hybrid or self.is_vl

    @property
    def qk_norm(self) -> bool:
        """RMS norms on each head's query and key (Qwen3 and Qwen3.5)."""
        return self.arch != "llama" and self.arch != "qwen2vl"

    @property
    def qkv_bias(self) -> bool:
        """Biases on the query, key and value projections (Qwen2 / Qwen2.5)."""
        return self.arch == "qwen2vl"

    @property
    def n_embd_inp(self) -> int:
        """The width of an embedding row fed to the model (image rows)."""
        return self.n_embd * (1 + self.n_deepstack)

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def is_attention(self, il: int) -> bool:
        """True if block `il` is a (full) attention block, False if recurrent."""
        if not self.is_hybrid:
            return True
        return (il + 1) % self.full_attention_interval == 0

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layer) if self.is_attention(i))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layer) if not self.is_attention(i))

    @property
    def rope_dims(self) -> int:
        # Qwen3.5 rotates only a quarter of each head (partial_rotary_factor 0.25).
        return self.head_dim // 4 if self.is_hybrid else self.head_dim

    @property
    def rope_sections(self) -> tuple[int, int, int, int]:
        """Multi-section RoPE split (t, y, x, unused) in rotary pairs; sums to rope_dims/2.

        The released models' proportions, scaled to the head: Qwen2-VL / 2.5-VL split 64
        pairs as [16, 24, 24], Qwen3-VL as [24, 20, 20]; Qwen3.5 splits its quarter-head
        rotation in thirds."""
        s = self.rope_dims // 2
        if self.arch == "qwen2vl":
            t = s // 4
            y = (s - t) // 2
            return (t, y, s - t - y, 0)
        if self.arch in ("qwen3vl", "qwen3vlmoe"):
            y = (s * 20) // 64
            return (s - 2 * y, y, y, 0)
        third = s // 3
        return (s - 2 * third, third, third, 0)

    @property
    def ssm_conv_dim(self) -> int:
        return 2 * self.ssm_state * self.ssm_groups + self.ssm_state * self.ssm_v_heads

    @property
    def ssm_inner(self) -> int:
        return self.ssm_state * self.ssm_v_heads


@attrs.frozen
class VisionSpec:
    """Hyper-parameters of one vision projector (mmproj)."""

    #: "mlp" (LLaVA, pairs with llama), "qwen2.5vl_merger" (pairs with qwen2vl) or
    #: "qwen3vl_merger" (pairs with qwen35*, qwen3vl*)
    projector: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    projection_dim: int  # = text n_embd
    pos_side: int  # learned position grid is pos_side x pos_side (qwen3vl) / n_patch+1 rows (mlp)
    spatial_merge: int = 2
    eps: float = 1e-6
    #: qwen3vl_merger: the width of mm.0's output (the merger's hidden layer); 0 means 4E,
    #: clip.cpp reads it from the tensor's shape
    merger_hidden: int = 0
    #: qwen3vl_merger: the vision blocks whose output feeds a deepstack merger (one slice of
    #: each image row per block, in block order)
    deepstack_layers: tuple[int, ...] = ()
    #: qwen2.5vl_merger: every n-th block attends to the whole image, the others within
    #: windows of ``window_size`` pixels (0: every block attends to the whole image)
    n_wa_pattern: int = 0
    window_size: int = 0


# Shared "shape" per size: (vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff).
_BASE: dict[str, tuple[int, int, int, int, int, int, int]] = {
    "tiny": (512, 64, 4, 2, 1, 32, 128),
    "XS": (1024, 256, 4, 4, 2, 64, 512),
    "S": (4096, 256, 12, 4, 2, 64, 640),
    "M": (8192, 512, 12, 8, 4, 64, 1792),
    "L": (8192, 768, 20, 12, 4, 64, 2304),
}

# Hybrid extras per size: (full_attention_interval, ssm_state, ssm_groups, ssm_v_heads).
_HYBRID: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 16, 2, 4),
    "XS": (2, 32, 2, 8),
    "S": (4, 64, 2, 4),
    "M": (4, 64, 4, 8),
    "L": (4, 64, 4, 12),
}

# MoE extras per size: (n_expert, n_expert_used, n_ff_exp, n_ff_shexp).
_MOE: dict[str, tuple[int, int, int, int]] = {
    "tiny": (4, 2, 64, 64),
    "XS": (4, 2, 256, 256),
    "S": (8, 2, 64, 64),
    "M": (8, 2, 192, 192),
    "L": (8, 2, 256, 256),
}


#: deepstack slices of a Qwen3-VL image row (the released models: 3)
_DEEPSTACK = 3


def check_arch_size(arch: object, size: object) -> None:
    """Raise ForgeError unless (arch, size) name a forgeable model."""
    if arch not in ARCHES:
        raise ForgeError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")
    if size not in SIZES:
        raise ForgeError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")


def text_spec(arch: str, size: str) -> TextSpec:
    """The text-model hyper-parameters for (arch, size)."""
    check_arch_size(arch, size)
    vocab, embd, layers, heads, heads_kv, head_dim, ff = _BASE[size]
    spec = TextSpec(
        arch=arch, size=size, n_vocab=vocab, n_embd=embd, n_layer=layers,
        n_head=heads, n_head_kv=heads_kv, head_dim=head_dim, n_ff=ff,
        rope_freq_base=10_000.0 if arch == "llama" else 1_000_000.0,
    )
    if arch in ("qwen35", "qwen35moe"):
        interval, ds, nk, nv = _HYBRID[size]
        spec = attrs.evolve(
            spec, full_attention_interval=interval, ssm_state=ds, ssm_groups=nk, ssm_v_heads=nv
        )
    if arch == "qwen35moe":
        n_exp, n_used, ff_exp, ff_sh = _MOE[size]
        spec = attrs.evolve(
            spec, n_expert=n_exp, n_expert_used=n_used, n_ff_exp=ff_exp, n_ff_shexp=ff_sh
        )
    if arch == "qwen3vlmoe":
        # Qwen3-VL-30B-A3B: experts only, no shared expert
        n_exp, n_used, ff_exp, _ = _MOE[size]
        spec = attrs.evolve(spec, n_expert=n_exp, n_expert_used=n_used, n_ff_exp=ff_exp)
    if arch in ("qwen3vl", "qwen3vlmoe"):
        # the released models add 3 deepstack slices at the first 3 layers
        spec = attrs.evolve(spec, n_deepstack=min(_DEEPSTACK, layers - 1),
                            rope_freq_base=5_000_000.0)
    return spec


def vision_spec(arch: str, size: str) -> VisionSpec:
    """The vision-projector hyper-parameters paired with text_spec(arch, size).

    The tower is tiny for every size (64-dim, 2 blocks) so a ~2400-token screenshot encodes
    in about a second on 2 cores; only the projection follows the text model's width.
    """
    text = text_spec(arch, size)
    if arch == "llama":
        # LLaVA resizes every image to image_size²: 64 px -> 16 tokens for unit tests,
        # 384 px -> 576 tokens (LLaVA-1.5's cost) for benchmarks.
        image_size = 64 if size in ("tiny", "XS") else 384
        return VisionSpec(
            projector="mlp", image_size=image_size, patch_size=16, n_embd=64, n_ff=128,
            n_layer=2, n_head=4, projection_dim=text.n_embd, pos_side=image_size // 16,
        )
    if arch == "qwen2vl":
        # Qwen2.5-VL: 14-px patches, 2x2 merge (a W×H image gives ≈ (W/28)·(H/28) tokens, the
        # UI-TARS profile's unit), no learned positions, window attention in all blocks but
        # every n_wa_pattern-th (the released tower: 32 blocks, full attention every 8th)
        return VisionSpec(
            projector="qwen2.5vl_merger", image_size=560, patch_size=14, n_embd=64, n_ff=128,
            n_layer=2, n_head=4, projection_dim=text.n_embd, pos_side=0, n_wa_pattern=2,
            window_size=112,
        )
    # Qwen3-VL keeps the aspect ratio: a W×H image gives ≈ (W/32)·(H/32) tokens.
    spec = VisionSpec(
        projector="qwen3vl_merger", image_size=512, patch_size=16, n_embd=64, n_ff=128,
        n_layer=2, n_head=4, projection_dim=text.n_embd, pos_side=32,
    )
    if text.n_deepstack:
        # one deepstack merger per slice, after the tower's first blocks (the released
        # tower: 27 blocks, mergers after blocks 8, 16 and 24)
        n = text.n_deepstack
        spec = attrs.evolve(spec, n_layer=n + 1, deepstack_layers=tuple(range(n)))
    return spec
