"""One sequence's attention KV as llama.cpp serialises it: parse a
``llama_state_seq_get_data`` blob into rows, and write rows back as a blob
``llama_state_seq_set_data`` accepts.

Pure numpy (no llama.cpp in here).  The format, as ``llama_kv_cache::state_write`` /
``state_read`` of the vendored llama.cpp (llama-cpp-python 0.3.36, ``src/llama-kv-cache.cpp``)
write and read it for one sequence of an attention-only model, all little-endian::

    u32 magic (0xaf143cd8)   i32 seq_id            (llama_context::state_seq_get_data)
    u32 n_stream                                   (one stream per sequence: kv_unified off)
    per stream: u32 cell_count, and when it is not 0:
        per cell:  i32 pos, u32 n_seq_id (1), i32 seq_id
        u32 v_trans, u32 n_layer
        per layer: i32 k_type, u64 k_row_bytes, cell_count rows of K
        v_trans = 0, per layer: i32 v_type, u64 v_row_bytes, cell_count rows of V
        v_trans = 1, per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v_gqa,
                    then n_embd_v_gqa runs of cell_count elements (V transposed)

Cells come in the cache's cell order (not position order); ``state_read`` puts them back in
the order given, after clearing the destination sequence, so a blob is a whole sequence.
Only f32 and f16 K / V are read (the engine's cache is f16).

Two variations, read when the caller says they are there (the engine knows its model):

* **cell extensions** (``cell_ext``): under multi-section RoPE (qwen35, the Qwen-VL models;
  llama.cpp writes them when ``n_pos_per_embd() > 1``) each cell's meta is
  ``i32 pos, u32 n_seq_id, i32 x, i32 y, i32 tok, i32 seq_id`` — ``llama_kv_cell_ext``: the
  cell's x and y position components (``pos`` is its t component) and its token
  (``LLAMA_TOKEN_NULL`` = -1 for an embedding row).  Measured on the forged qwen35: text
  cells hold (x, y) = (p, p), an image's cells its 2-D grid;
* **a hybrid's blob** (``parse_hybrid``): ``llama_memory_hybrid::state_write`` writes the
  attention KV as above, then the recurrent part (``llama_memory_recurrent::state_write``:
  the same bytes a PARTIAL_ONLY snapshot holds after its 8-byte header — measured).  The
  recurrent part is kept as opaque bytes and written back after the rows.
"""

from __future__ import annotations

import struct

import attrs
import numpy as np

from cachepolicy.engine.errors import KvagentCacheError

MAGIC = 0xAF143CD8
#: ggml type ids this parser reads, and their numpy element types
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<f2")}


class KvBlobError(KvagentCacheError):
    """A state blob this parser cannot read (or rows that cannot be written as one)."""


@attrs.frozen(eq=False)
class KvRows:
    """KV cells of one sequence: their positions and, per layer, their K and V rows.

    ``k[l]`` has shape (n_cells, n_embd_k_gqa), ``v[l]`` (n_cells, n_embd_v_gqa), both of the
    cache's type; row i of every layer belongs to the cell at ``pos[i]``.  K rows hold keys
    AFTER RoPE at that position (what the cache stores)."""

    pos: np.ndarray  # int32 (n_cells,)
    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    #: int32 (n_cells, 3): each cell's (x, y, tok) under multi-section RoPE; None without
    ext: np.ndarray | None = None

    def __attrs_post_init__(self) -> None:
        n = len(self.pos)
        if len(self.k) != len(self.v):
            raise KvBlobError("K and V layer counts differ")
        if any(a.shape[0] != n for a in (*self.k, *self.v)):
            raise KvBlobError("every layer needs one row per cell")
        if self.ext is not None and self.ext.shape != (n, 3):
            raise KvBlobError("cell extensions need (x, y, tok) per cell")

    @property
    def n_cells(self) -> int:
        return len(self.pos)

    @property
    def n_layer(self) -> int:
        return len(self.k)

    @property
    def nbytes(self) -> int:
        """Bytes of the K and V rows (the part that grows with the cells)."""
        return sum(a.nbytes for a in (*self.k, *self.v))

    def take(self, index: np.ndarray) -> KvRows:
        """The cells at ``index`` (an index array or a boolean mask), in that order; copies."""
        return KvRows(np.ascontiguousarray(self.pos[index]),
                      tuple(np.ascontiguousarray(a[index]) for a in self.k),
                      tuple(np.ascontiguousarray(a[index]) for a in self.v),
                      None if self.ext is None else np.ascontiguousarray(self.ext[index]))

    def between(self, p0: int, p1: int) -> KvRows:
        """The cells at positions [p0, p1), in position order."""
        sel = np.nonzero((self.pos >= p0) & (self.pos < p1))[0]
        return self.take(sel[np.argsort(self.pos[sel], kind="stable")])

    def sorted(self) -> KvRows:
        """The cells in position order (a fresh prefill's cell order)."""
        return self.take(np.argsort(self.pos, kind="stable"))

    def with_pos(self, pos: np.ndarray) -> KvRows:
        """The same rows labelled with other positions (K is NOT re-rotated, cell extensions
        are not moved: see kv_rope)."""
        return KvRows(np.asarray(pos, dtype=np.int32), self.k, self.v, self.ext)

    @staticmethod
    def concat(parts: list[KvRows]) -> KvRows:
        if not parts:
            raise KvBlobError("nothing to concatenate")
        n_layer = parts[0].n_layer
        if any(p.n_layer != n_layer for p in parts):
            raise KvBlobError("rows of different models")
        if len({p.ext is None for p in parts}) > 1:
            raise KvBlobError("rows with and without cell extensions")
        ext = (None if parts[0].ext is None
               else np.concatenate([p.ext for p in parts]).astype(np.int32))  # type: ignore[misc]
        return KvRows(np.concatenate([p.pos for p in parts]).astype(np.int32),
                      tuple(np.concatenate([p.k[i] for p in parts]) for i in range(n_layer)),
                      tuple(np.concatenate([p.v[i] for p in parts]) for i in range(n_layer)),
                      ext)


@attrs.frozen
class BlobFormat:
    """What a blob of this context looks like around the rows: the stream count, the stream
    the sequence's cells are written under, V's layout and the element types."""

    n_stream: int
    stream: int
    v_trans: bool
    k_types: tuple[int, ...]
    v_types: tuple[int, ...]
    cell_ext: bool = False  # cells carry (x, y, tok): multi-section RoPE


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.off = memoryview(data), 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.off + size > len(self.data):
            raise KvBlobError("the blob ends early")
        out = struct.unpack_from(fmt, self.data, self.off)
        self.off += size
        return out

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        size = dtype.itemsize * count
        if self.off + size > len(self.data):
            raise KvBlobError("the blob ends early")
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.off)
        self.off += size
        return out


def parse(data: bytes, *, cell_ext: bool = False) -> tuple[BlobFormat, KvRows]:
    """A sequence's state blob → its format and its rows (copies, in the blob's cell order).
    An empty sequence gives zero cells (and the format's layer types are then unknown)."""
    fmt, rows, rest = _parse(data, cell_ext)
    if rest:
        raise KvBlobError(f"{len(rest)} bytes after the KV cache's part: a recurrent "
                          "or hybrid model's state (read it with parse_hybrid)")
    return fmt, rows


def parse_hybrid(data: bytes, *, cell_ext: bool = False) -> tuple[BlobFormat, KvRows, bytes]:
    """A hybrid model's sequence blob → the attention part's format and rows, and the
    recurrent part's bytes (what ``compose(..., recurrent=)`` writes back after the rows)."""
    return _parse(data, cell_ext)


def _parse(data: bytes, cell_ext: bool) -> tuple[BlobFormat, KvRows, bytes]:
    r = _Reader(data)
    magic, _seq = r.take("<Ii")
    if magic != MAGIC:
        raise KvBlobError(f"not a sequence state (magic {magic:#x})")
    (n_stream,) = r.take("<I")
    found: tuple[int, BlobFormat, KvRows] | None = None
    for s in range(n_stream):
        (count,) = r.take("<I")
        if count == 0:
            continue
        if found is not None:
            raise KvBlobError("cells in more than one stream (a unified KV cache?)")
        found = (s, *_parse_stream(r, count, n_stream, s, cell_ext))
    rest = bytes(r.data[r.off:])
    if found is None:
        empty = KvRows(np.zeros(0, np.int32), (), (),
                       np.zeros((0, 3), np.int32) if cell_ext else None)
        return BlobFormat(n_stream, 0, False, (), (), cell_ext), empty, rest
    return found[1], found[2], rest


def _parse_stream(r: _Reader, count: int, n_stream: int, s: int,
                  cell_ext: bool) -> tuple[BlobFormat, KvRows]:
    width = 6 if cell_ext else 3
    meta = r.array(np.dtype("<i4"), width * count).reshape(count, width)
    if np.any(meta[:, 1] != 1):
        raise KvBlobError("cells with other than one sequence id, or cell extensions (M-RoPE, "
                          "n-gram hashes) the caller did not announce")
    pos = meta[:, 0].astype(np.int32)
    ext = meta[:, 2:5].astype(np.int32) if cell_ext else None
    v_trans, n_layer = r.take("<II")
    if v_trans not in (0, 1) or not 0 < n_layer < 4096:
        raise KvBlobError("unexpected data header (cell extensions this parser does not read?)")
    k, k_types = [], []
    for _ in range(n_layer):
        k_type, row_bytes = r.take("<iQ")
        dt = _dtype(k_type, "K")
        if row_bytes % dt.itemsize:
            raise KvBlobError("K row size is not a whole number of elements")
        width = row_bytes // dt.itemsize
        k.append(r.array(dt, count * width).reshape(count, width).copy())
        k_types.append(k_type)
    v, v_types = [], []
    for _ in range(n_layer):
        if not v_trans:
            v_type, row_bytes = r.take("<iQ")
            dt = _dtype(v_type, "V")
            width = row_bytes // dt.itemsize
            v.append(r.array(dt, count * width).reshape(count, width).copy())
        else:
            v_type, elem, width = r.take("<iII")
            dt = _dtype(v_type, "V")
            if elem != dt.itemsize:
                raise KvBlobError("V element size does not match its type")
            v.append(np.ascontiguousarray(r.array(dt, count * width).reshape(width, count).T))
        v_types.append(v_type)
    fmt = BlobFormat(n_stream, s, bool(v_trans), tuple(k_types), tuple(v_types), cell_ext)
    return fmt, KvRows(pos, tuple(k), tuple(v), ext)


def _dtype(ggml_type: int, what: str) -> np.dtype:
    if ggml_type not in _DTYPES:
        raise KvBlobError(f"{what} cache of ggml type {ggml_type}: only f32 (0) and f16 (1) "
                          "are read")
    return _DTYPES[ggml_type]


def compose(fmt: BlobFormat, rows: KvRows, seq_id: int, *,
            recurrent: bytes | memoryview = b"") -> bytearray:
    """Rows → a blob ``llama_state_seq_set_data`` reads into any sequence of the context whose
    format this is (the cells in the order given); a hybrid's ``recurrent`` part (the bytes
    ``parse_hybrid`` returned, or a PARTIAL_ONLY snapshot's after its header) follows them.
    Written once into one buffer (no per-layer ``tobytes`` and no join: a window's blob is
    ~12 KB a cell on the forged llama M, and each copy of it counted in the peak RSS of a
    server splicing at every step)."""
    if rows.n_cells and rows.n_layer != len(fmt.k_types):
        raise KvBlobError(f"rows of {rows.n_layer} layers for a cache of {len(fmt.k_types)}")
    if rows.n_cells and fmt.cell_ext != (rows.ext is not None):
        raise KvBlobError("the cache's cells carry extensions the rows lack (or the reverse)")
    count = rows.n_cells
    out: list[bytes | memoryview | np.ndarray] = [struct.pack("<IiI", MAGIC, seq_id,
                                                              fmt.n_stream)]
    for s in range(fmt.n_stream):
        if s != fmt.stream or count == 0:
            out.append(struct.pack("<I", 0))
            continue
        out.append(struct.pack("<I", count))
        meta = np.empty((count, 6 if fmt.cell_ext else 3), dtype="<i4")
        meta[:, 0], meta[:, 1], meta[:, -1] = rows.pos, 1, seq_id
        if fmt.cell_ext:
            meta[:, 2:5] = rows.ext
        out.append(meta)
        out.append(struct.pack("<II", int(fmt.v_trans), rows.n_layer))
        for k_type, k in zip(fmt.k_types, rows.k):
            a = np.ascontiguousarray(k, dtype=_dtype(k_type, "K"))
            out.append(struct.pack("<iQ", k_type, a.shape[1] * a.itemsize))
            out.append(a)
        for v_type, v in zip(fmt.v_types, rows.v):
            a = np.ascontiguousarray(v, dtype=_dtype(v_type, "V"))
            if not fmt.v_trans:
                out.append(struct.pack("<iQ", v_type, a.shape[1] * a.itemsize))
                out.append(a)
            else:
                out.append(struct.pack("<iII", v_type, a.itemsize, a.shape[1]))
                out.append(np.ascontiguousarray(a.T))
    out.append(recurrent)
    sizes = [p.nbytes if isinstance(p, (np.ndarray, memoryview)) else len(p) for p in out]
    blob = bytearray(sum(sizes))
    view, off = memoryview(blob), 0
    for part, n in zip(out, sizes):
        if n:
            view[off:off + n] = (part.reshape(-1).view(np.uint8)
                                 if isinstance(part, np.ndarray) else memoryview(part).cast("B"))
        off += n
    return blob
