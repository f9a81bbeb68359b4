"""The training data on disk: one ``.npz`` per shard of episodes, no pickles.

A shard holds examples and the screenshots they show, each screenshot once (by pixel
identity), with the frozen vision encoder's output for it — so a trainer never runs the
encoder and no screenshot is encoded twice.

Examples (E of them) are runs of pieces (P in all), in prompt order::

    example_offsets  int64 [E+1]   example e = pieces[example_offsets[e]:example_offsets[e+1]]
    piece_kind       uint8 [P]     TEXT (prompt text), TARGET (trained text), IMAGE
    piece_start      int64 [P]     text: offset into ``tokens``; image: index into the images
    piece_len        int32 [P]     text: token count; image: 0
    tokens           int32 [T]
    meta_<name>      [E]           per example: see ``META`` (kind, seed, step, layout, …)

Images (I of them)::

    image_ids        str   [I]     pixel hash (``DecodedImage.image_id``)
    png_offsets      int64 [I+1]   into ``png`` (uint8): the screenshot as the env sent it
    embd_offsets     int64 [I+1]   into ``embeddings`` (float32 [rows, n_embd]), bitwise what
                                   the engine feeds llama.cpp
    positions0       int32 [S, rows]  decoder positions at start 0 (S sections), per row
    pos_step         int32 [I, S]; n_pos int32 [I]; size int32 [I, 2]

The projector's marker tokens (the same around every image) and everything else the reader
needs to rebuild an ``EncodedImage`` are in the dataset's manifest (``ShardInfo``).
"""

from __future__ import annotations

import enum
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from cachepolicy.engine.images import EncodedImage
from runtime.train.prompts import ImagePiece, TextPiece, TrainPiece
from vmenv.trajectory_writer import write_durably


class PieceKind(enum.IntEnum):
    TEXT = 0
    TARGET = 1
    IMAGE = 2


#: Per-example metadata columns and their dtypes.
META: dict[str, str] = {
    "episode": "int32",  # the episode's index in the dataset
    "kind": "uint8",  # index into the manifest's kinds
    "seed": "uint64",  # the instance's seed (a training seed)
    "step": "int16",  # the step of the episode this example decides
    "layout": "uint8",  # index into the manifest's layouts (policies)
    "window": "int8",  # K (0: every screenshot, noevict's layout)
    "shown": "int8",  # screenshots the prompt shows
    "rows": "int32",  # rows of the whole example (prompt + target)
    "target_tokens": "int16",
    "mode": "uint8",  # the episode: 0 clean, 1 perturbed once, 2 one slip (a mistake)
    "recovery": "bool",  # at or after the step the episode went off-track
    "clicked": "U40",  # the class of the widget the target clicks (cell_labels); "" if none
}


@attrs.frozen
class Projector:
    """What every image of a dataset shares: its marker tokens and embedding width."""

    prefix_tokens: tuple[int, ...]
    suffix_tokens: tuple[int, ...]
    n_embd: int
    non_causal: bool = False


class ShardWriter:
    """Collects one shard's examples and images, then writes them atomically.  The
    projector is the first image's unless given; every image must share it."""

    def __init__(self, projector: Projector | None = None) -> None:
        self.projector = projector
        self._offsets = [0]
        self._kind: list[int] = []
        self._start: list[int] = []
        self._len: list[int] = []
        self._tokens: list[np.ndarray] = []
        self._n_tokens = 0
        self._meta: dict[str, list[Any]] = {k: [] for k in META}
        self._images: dict[str, int] = {}
        self._encoded: list[EncodedImage] = []
        self._pngs: list[bytes] = []

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def add_image(self, png: bytes, enc: EncodedImage) -> int:
        """The image's index in the shard (stored the first time it is seen)."""
        if enc.image_id in self._images:
            return self._images[enc.image_id]
        mine = Projector(tuple(enc.prefix_tokens), tuple(enc.suffix_tokens),
                         int(enc.embeddings.shape[1]), enc.non_causal)
        if self.projector is None:
            self.projector = mine
        elif mine != self.projector:
            raise ValueError(f"image {enc.image_id}: another projector than the dataset's")
        self._images[enc.image_id] = len(self._encoded)
        self._encoded.append(enc)
        self._pngs.append(png)
        return len(self._encoded) - 1

    def add_example(self, pieces: Sequence[tuple[PieceKind, Sequence[int] | int]],
                    **meta: Any) -> None:
        """One example: (TEXT | TARGET, tokens) or (IMAGE, image index) pieces, in order;
        ``meta`` gives every ``META`` column."""
        if set(meta) != set(META):
            raise ValueError(f"meta columns {sorted(meta)} are not {sorted(META)}")
        for kind, content in pieces:
            self._kind.append(int(kind))
            if kind is PieceKind.IMAGE:
                assert isinstance(content, int) and 0 <= content < len(self._encoded)
                self._start.append(content)
                self._len.append(0)
            else:
                toks = np.asarray(content, dtype=np.int32)
                self._start.append(self._n_tokens)
                self._len.append(len(toks))
                self._tokens.append(toks)
                self._n_tokens += len(toks)
        self._offsets.append(len(self._kind))
        for k, v in meta.items():
            self._meta[k].append(v)

    def arrays(self) -> dict[str, np.ndarray]:
        encs = self._encoded
        sections = encs[0].positions0.shape[0] if encs else 1
        arrays: dict[str, np.ndarray] = {
            "example_offsets": np.asarray(self._offsets, dtype=np.int64),
            "piece_kind": np.asarray(self._kind, dtype=np.uint8),
            "piece_start": np.asarray(self._start, dtype=np.int64),
            "piece_len": np.asarray(self._len, dtype=np.int32),
            "tokens": (np.concatenate(self._tokens) if self._tokens
                       else np.zeros(0, dtype=np.int32)),
            "image_ids": np.asarray([e.image_id for e in encs], dtype=str),
            "png_offsets": _offsets(len(b) for b in self._pngs),
            "png": np.frombuffer(b"".join(self._pngs), dtype=np.uint8),
            "embd_offsets": _offsets(e.n_tokens for e in encs),
            "embeddings": (np.concatenate([e.embeddings for e in encs]).astype(np.float32)
                           if encs else np.zeros((0, 0), np.float32)),
            "positions0": (np.concatenate([e.positions0 for e in encs], axis=1).astype(np.int32)
                           if encs else np.zeros((sections, 0), np.int32)),
            "pos_step": np.asarray([e.pos_step for e in encs], dtype=np.int32).reshape(
                len(encs), sections),
            "n_pos": np.asarray([e.n_pos for e in encs], dtype=np.int32),
            "size": np.asarray([(e.width, e.height) for e in encs], dtype=np.int32).reshape(
                len(encs), 2),
        }
        for k, dtype in META.items():
            arrays[f"meta_{k}"] = np.asarray(self._meta[k], dtype=dtype)
        return arrays

    def write(self, path: Path) -> int:
        """Write the shard to ``path`` atomically; returns its size in bytes."""
        buf = io.BytesIO()
        np.savez(buf, **self.arrays())
        data = buf.getvalue()
        write_durably(path, data)
        return len(data)


def _offsets(lengths: Any) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(list(lengths), dtype=np.int64)]).astype(np.int64)


class Shard:
    """A written shard, read back (``np.load``: no pickles)."""

    def __init__(self, path: Path, projector: Projector) -> None:
        with np.load(path, allow_pickle=False) as z:
            self.a = {k: z[k] for k in z.files}
        self.projector = projector

    def __len__(self) -> int:
        return len(self.a["example_offsets"]) - 1

    @property
    def n_images(self) -> int:
        return len(self.a["image_ids"])

    def meta(self, e: int) -> dict[str, int | bool]:
        return {k: self.a[f"meta_{k}"][e].item() for k in META}

    def raw_pieces(self, e: int) -> list[tuple[PieceKind, np.ndarray | int]]:
        """Example ``e`` as (kind, tokens | image index) pieces."""
        a = self.a
        out: list[tuple[PieceKind, np.ndarray | int]] = []
        for j in range(a["example_offsets"][e], a["example_offsets"][e + 1]):
            kind, start = PieceKind(a["piece_kind"][j]), int(a["piece_start"][j])
            if kind is PieceKind.IMAGE:
                out.append((kind, start))
            else:
                out.append((kind, a["tokens"][start: start + int(a["piece_len"][j])]))
        return out

    def pieces(self, e: int) -> tuple[TrainPiece, ...]:
        """Example ``e`` as the trainer's pieces (``build_example``'s input)."""
        return tuple(ImagePiece(self.png(c)) if k is PieceKind.IMAGE  # type: ignore[arg-type]
                     else TextPiece(c, train=k is PieceKind.TARGET)  # type: ignore[arg-type]
                     for k, c in self.raw_pieces(e))

    def png(self, i: int) -> bytes:
        o = self.a["png_offsets"]
        return self.a["png"][o[i]: o[i + 1]].tobytes()

    def encoded(self, i: int) -> EncodedImage:
        """Image ``i`` as the engine's vision encoder gave it (the trainer's stand-in
        encoder serves it, ``fit``, so ``build_example`` never encodes)."""
        a, p = self.a, self.projector
        r0, r1 = a["embd_offsets"][i], a["embd_offsets"][i + 1]
        w, h = (int(x) for x in a["size"][i])
        return EncodedImage(image_id=str(a["image_ids"][i]), width=w, height=h,
                            embeddings=a["embeddings"][r0:r1], positions0=a["positions0"][:, r0:r1],
                            pos_step=a["pos_step"][i], n_pos=int(a["n_pos"][i]),
                            non_causal=p.non_causal, prefix_tokens=p.prefix_tokens,
                            suffix_tokens=p.suffix_tokens)
