"""Locality-aware edge split: a rank's in-edges become a local CSR and a remote CSR."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

LOOPS = ("as_is", "drop", "last")  # edge_split's loops: what becomes of self loops


class RankEdges(NamedTuple):
    """One rank's in-edges, split by where the source lives (n = ub - lb local rows).

    local_indptr   int64 [n+1]   local_indices int32 [El]  source row u - lb
    remote_indptr  int64 [n+1]   remote_slot   int32 [Er]  index into the halo
    halo_pe        int32 [H]     halo_row      int32 [H]   the H distinct remote rows,
                                                            in order of first use
    local_weights / remote_weights float32 or None
    """

    local_indptr: np.ndarray
    local_indices: np.ndarray
    local_weights: np.ndarray | None
    remote_indptr: np.ndarray
    remote_slot: np.ndarray
    remote_weights: np.ndarray | None
    halo_pe: np.ndarray
    halo_row: np.ndarray


def edge_split(
    row_indptr,
    row_indices,
    row_weights,
    bounds,
    rank: int,
    mark: np.ndarray | None = None,
    *,
    loops: str = "as_is",
) -> RankEdges:
    """Split rank ``rank``'s rows into local and remote CSRs.

    row_indptr  int64 [n+1] rows lb..ub-1 of a CSR, rebased to start at 0
    row_indices int [E_r]   global source ids
    bounds      int64 [P+1] node ranges from node_split

    Each remote source is stored once in the halo (pe, row on pe); remote CSR entries
    point into it, so a rank fetches every remote row once however many edges use it.
    ``mark`` (int32 [N], all -1) is scratch that callers splitting many ranks may share;
    it is left all -1 again. ``loops``: "as_is"; "drop", the rows' self loops left out;
    "last", left out and one added at the end of each row, as Graph.add_self_loops puts
    it (unweighted rows only): the split of ``remove_self_loops`` (``.add_self_loops()``)
    without building that graph.
    """
    bounds = np.asarray(bounds, np.int64)
    lb, ub = int(bounds[rank]), int(bounds[rank + 1])
    n = ub - lb
    if row_indptr.size != n + 1:
        raise ValueError(f"rank {rank} owns {n} rows but row_indptr has {row_indptr.size} entries")
    has_w = row_weights is not None
    mode = LOOPS.index(loops)
    if mode and has_w:
        raise ValueError("edge_split: loops='drop' or 'last' takes unweighted rows")
    w = row_weights if has_w else np.empty(0, np.float32)
    counts = np.empty((2, n), np.int64)
    _count_local(row_indptr, row_indices, lb, ub, mode, counts)
    local_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts[0], out=local_indptr[1:])
    remote_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts[1], out=remote_indptr[1:])
    del counts
    el, er = int(local_indptr[-1]), int(remote_indptr[-1])
    local_indices = np.empty(el, np.int32)
    remote_src = np.empty(er, np.int64)
    lw = np.empty(el if has_w else 0, np.float32)
    rw = np.empty(er if has_w else 0, np.float32)
    _fill(
        row_indptr,
        row_indices,
        w,
        has_w,
        lb,
        ub,
        mode,
        local_indptr,
        remote_indptr,
        local_indices,
        lw,
        remote_src,
        rw,
    )
    if mark is None:
        mark = np.full(int(bounds[-1]), -1, np.int32)
    remote_slot, halo_src = _first_use_slots(remote_src, mark)
    halo_pe = (np.searchsorted(bounds, halo_src, side="right") - 1).astype(np.int32)
    halo_row = (halo_src - bounds[halo_pe]).astype(np.int32)
    return RankEdges(
        local_indptr,
        local_indices,
        lw if has_w else None,
        remote_indptr,
        remote_slot,
        rw if has_w else None,
        halo_pe,
        halo_row,
    )


def column_slice(indptr, indices, weights, lb: int, ub: int):
    """Rows lb..ub-1 of the transposed graph, without transposing all of it.

    returns (indptr int64 [n+1], indices int64 [E'] destination ids sorted per row,
    weights float32 [E'] or None): row u - lb lists the v of every edge u -> v.
    """
    n = ub - lb
    has_w = weights is not None
    counts = np.zeros(n, np.int64)
    _count_sources(indices, lb, ub, counts)
    t_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=t_indptr[1:])
    t_indices = np.empty(int(t_indptr[-1]), np.int64)
    t_w = np.empty(t_indices.size if has_w else 0, np.float32)
    _fill_columns(
        indptr,
        indices,
        weights if has_w else np.empty(0, np.float32),
        has_w,
        lb,
        ub,
        t_indptr[:-1].copy(),
        t_indices,
        t_w,
    )
    return t_indptr, t_indices, (t_w if has_w else None)


@numba.njit(cache=True, parallel=True)
def _count_local(indptr, indices, lb, ub, mode, out):
    """out [2, n]: each row's local and remote entries (mode: LOOPS' index)."""
    for i in numba.prange(indptr.size - 1):
        c = 0
        loops = 0
        for e in range(indptr[i], indptr[i + 1]):
            u = indices[e]
            if mode and u == lb + i:
                loops += 1
            elif u >= lb and u < ub:
                c += 1
        out[0, i] = c + (mode == 2)
        out[1, i] = indptr[i + 1] - indptr[i] - c - loops


@numba.njit(cache=True, parallel=True)
def _fill(indptr, indices, w, has_w, lb, ub, mode, lptr, rptr, l_idx, l_w, r_src, r_w):
    for i in numba.prange(indptr.size - 1):
        pl = lptr[i]
        pr = rptr[i]
        for e in range(indptr[i], indptr[i + 1]):
            u = indices[e]
            if mode and u == lb + i:
                continue
            if u >= lb and u < ub:
                l_idx[pl] = u - lb
                if has_w:
                    l_w[pl] = w[e]
                pl += 1
            else:
                r_src[pr] = u
                if has_w:
                    r_w[pr] = w[e]
                pr += 1
        if mode == 2:
            l_idx[pl] = i


@numba.njit(cache=True)
def _first_use_slots(src, mark):
    """(slot int32 [E], unique int64 [H]) with unique ids in order of first appearance;
    mark [N] must be all -1 and is restored."""
    slot = np.empty(src.size, np.int32)
    uniq = np.empty(src.size, np.int64)
    h = 0
    for e in range(src.size):
        g = src[e]
        s = mark[g]
        if s < 0:
            s = h
            mark[g] = h
            uniq[h] = g
            h += 1
        slot[e] = s
    for i in range(h):
        mark[uniq[i]] = -1
    return slot, uniq[:h].copy()


@numba.njit(cache=True)
def _count_sources(indices, lb, ub, counts):
    for e in range(indices.size):
        u = indices[e]
        if u >= lb and u < ub:
            counts[u - lb] += 1


@numba.njit(cache=True)
def _fill_columns(indptr, indices, w, has_w, lb, ub, pos, t_indices, t_w):
    for v in range(indptr.size - 1):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if u >= lb and u < ub:
                p = pos[u - lb]
                t_indices[p] = v
                if has_w:
                    t_w[p] = w[e]
                pos[u - lb] = p + 1
