"""Stored screenshot KV and the conditioning patch (the Kamera design), as numpy on rows
read out of state blobs (``kv_blob``).  Pure: no llama.cpp in here.

A chunk's cached KV mixes two things: its position (fixed exactly by re-rotating its keys,
``kv_rope``) and what it absorbed from the chunks before it (its conditioning).  With
``canon`` = the chunk's KV computed once in a canonical context and ``own`` = its KV in the
context it really had, the conditioning is

    ΔK = R(-p_own) K_own - R(-p_can) K_can      (keys compared before RoPE, per cell)
    ΔV = V_own - V_can

per layer, a (cells x features) matrix each.  ``make_patch`` keeps its best rank-m
approximation (truncated SVD, A = U_m S_m, B = V_m^T, through the Gram matrix; stored in the
cache's type);
``place`` rebuilds the chunk at any positions p as

    K = R(p - p_can) K_can + R(p) (A_K B_K)      V = V_can + A_V B_V

summed in float64 and rounded once to the cache type.  Rank 0 is no patch at all: ``place``
is then exactly ``relocate`` of the canonical rows (bit for bit), and a full-rank patch
reproduces ``own`` re-rotated up to the rounding of its factors.
"""

from __future__ import annotations

import attrs
import numpy as np

from cachepolicy.engine.blas import one_thread
from cachepolicy.engine.kv_blob import KvBlobError, KvRows
from cachepolicy.engine.kv_rope import TEXT_STEP, RopeSpec, rotate


@attrs.frozen(eq=False)
class KvPatch:
    """Per layer, the rank-``rank`` factors of ΔK (pre-RoPE) and ΔV: ``a`` (cells x rank) and
    ``b`` (rank x features), in the cache's element type."""

    rank: int
    k_a: tuple[np.ndarray, ...]
    k_b: tuple[np.ndarray, ...]
    v_a: tuple[np.ndarray, ...]
    v_b: tuple[np.ndarray, ...]
    #: the fraction of ||Δ||² the kept components hold (K and V together, all layers)
    energy: float = 1.0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.k_a, *self.k_b, *self.v_a, *self.v_b))


@attrs.frozen(eq=False)
class StoredKv:
    """A chunk's KV kept outside any sequence: rows as cached at their positions (canonical
    or the chunk's own) and an optional conditioning patch."""

    rows: KvRows
    patch: KvPatch | None = None

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + (self.patch.nbytes if self.patch is not None else 0)

    @property
    def n_cells(self) -> int:
        return self.rows.n_cells

    def part(self, offset: int, n_pos: int) -> StoredKv:
        """The cells at offsets [offset, offset + n_pos) from the chunk's first position,
        with their rows of the patch (a patch's ``a`` factors hold one row per cell, in the
        rows' order)."""
        if self.rows.n_cells == 0:
            raise KvBlobError("an empty chunk has no part")
        p0 = int(self.rows.pos[0]) + offset
        sel = np.nonzero((self.rows.pos >= p0) & (self.rows.pos < p0 + n_pos))[0]
        if sel.size == 0:
            raise KvBlobError(f"the chunk holds no cell at offsets [{offset}, "
                              f"{offset + n_pos})")
        patch = self.patch
        if patch is not None:
            patch = attrs.evolve(patch, k_a=tuple(np.ascontiguousarray(a[sel]) for a in patch.k_a),
                                 v_a=tuple(np.ascontiguousarray(a[sel]) for a in patch.v_a))
        return StoredKv(self.rows.take(sel), patch)


def relocate(spec: RopeSpec, rows: KvRows, delta: int,
             steps: np.ndarray | None = None) -> KvRows:
    """The cells moved by ``delta`` positions: keys re-rotated, values as they are.  Under
    multi-section RoPE each cell's components move by ``delta * steps[cell]`` (``steps``:
    (n_cells, 4) or one row for all, how the components of each cell follow its unit's start;
    default ``kv_rope.TEXT_STEP``), and so do the cells' (x, y) extensions."""
    if delta == 0:
        return rows
    if not spec.multi_section:
        return KvRows(rows.pos + np.int32(delta),
                      tuple(rotate(spec, k, delta) for k in rows.k), rows.v, rows.ext)
    step = np.broadcast_to(np.asarray(TEXT_STEP if steps is None else steps, dtype=np.int64),
                           (rows.n_cells, 4))
    moves = delta * step  # (n, 4): t, y, x, z
    ext = None
    if rows.ext is not None:
        ext = rows.ext.copy()
        ext[:, 0] += moves[:, 2].astype(np.int32)  # x
        ext[:, 1] += moves[:, 1].astype(np.int32)  # y
    return KvRows((rows.pos + moves[:, 0]).astype(np.int32),
                  tuple(rotate(spec, k, moves) for k in rows.k), rows.v, ext)


def _truncated(delta: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(A, B, kept energy, total energy) of the best rank-``rank`` approximation A @ B.

    Through the Gram matrix: the top eigenvectors V_m of ΔᵀΔ are Δ's top right singular
    vectors, and A = Δ V_m, B = V_mᵀ is Δ projected onto them — the truncated SVD (Eckart–
    Young), exact at full rank (V V^T = I), at a fraction of a full SVD's cost."""
    delta = delta.astype(np.float32)
    with one_thread():
        w, v = np.linalg.eigh(delta.T @ delta)  # ascending
        w = w.astype(np.float64)
    m = min(rank, len(w))
    top = v[:, ::-1][:, :m]
    total = float(np.sum(np.clip(w, 0, None)))
    kept = float(np.sum(np.clip(w[::-1][:m], 0, None)))
    with one_thread():
        a = delta @ top
    return a, top.T, kept, total


def make_patch(spec: RopeSpec, own: KvRows, canon: KvRows, rank: int) -> KvPatch | None:
    """The rank-``rank`` patch taking ``canon`` to ``own`` (both sorted by position, the same
    cells at the same offsets); None for rank 0."""
    if rank < 0:
        raise ValueError("a patch rank is >= 0")
    if own.n_cells != canon.n_cells or own.n_layer != canon.n_layer:
        raise KvBlobError("own and canonical rows of different chunks")
    if not np.array_equal(own.pos - own.pos[0], canon.pos - canon.pos[0]):
        raise KvBlobError("own and canonical rows hold different cells of the chunk")
    if rank == 0:
        return None
    parts: dict[str, list[np.ndarray]] = {"k_a": [], "k_b": [], "v_a": [], "v_b": []}
    kept = total = 0.0
    for k_own, k_can, v_own, v_can in zip(own.k, canon.k, own.v, canon.v):
        dk = (rotate(spec, k_own, -own.pos, np.float64)
              - rotate(spec, k_can, -canon.pos, np.float64))
        dv = v_own.astype(np.float64) - v_can.astype(np.float64)
        for name, d, dtype in (("k", dk, k_own.dtype), ("v", dv, v_own.dtype)):
            a, b, e_kept, e_total = _truncated(d, rank)
            parts[f"{name}_a"].append(a.astype(dtype))
            parts[f"{name}_b"].append(b.astype(dtype))
            kept, total = kept + e_kept, total + e_total
    return KvPatch(rank=min(rank, *(b.shape[0] for b in parts["k_b"])),
                   k_a=tuple(parts["k_a"]), k_b=tuple(parts["k_b"]),
                   v_a=tuple(parts["v_a"]), v_b=tuple(parts["v_b"]),
                   energy=kept / total if total > 0 else 1.0)


def place(spec: RopeSpec, stored: StoredKv, pos0: int) -> KvRows:
    """The stored chunk rebuilt with its first cell at ``pos0`` (the patch, if any, added)."""
    rows = stored.rows
    delta = int(pos0 - rows.pos[0])
    moved = relocate(spec, rows, delta)
    patch = stored.patch
    if patch is None or patch.rank == 0:
        return moved
    pos = moved.pos
    ks, vs = [], []
    for i, (k_can, v_can) in enumerate(zip(rows.k, rows.v)):
        with one_thread():  # numpy's BLAS beside llama.cpp's threads: see blas.py
            dk = patch.k_a[i].astype(np.float64) @ patch.k_b[i].astype(np.float64)
            dv = patch.v_a[i].astype(np.float64) @ patch.v_b[i].astype(np.float64)
        k = (rotate(spec, k_can, delta, np.float64) + rotate(spec, dk, pos, np.float64))
        v = v_can.astype(np.float64) + dv
        ks.append(k.astype(k_can.dtype))
        vs.append(v.astype(v_can.dtype))
    return KvRows(pos, tuple(ks), tuple(vs))
