"""The MGG artifact's binary CSR: ``<prefix>_beg_pos.bin`` + ``<prefix>_csr.bin``, raw
little-endian int64."""

from __future__ import annotations

import os
import warnings

import numpy as np

from ...memory import csr_bytes, require
from ..core import Graph, GraphError
from ._common import BEG_SUFFIX, CSR_SUFFIX, check_indptr, csr_slice, edge_range, err
from .base import EdgeSlice, Format

__all__ = ["FORMAT", "edge_slice", "mgg_paths", "read_mgg_bin", "write_files", "write_mgg_bin"]


def mgg_paths(prefix_or_path) -> tuple[str, str]:
    """(``<prefix>_beg_pos.bin``, ``<prefix>_csr.bin``) of the prefix or either file."""
    p = os.fspath(prefix_or_path)
    for suffix in (BEG_SUFFIX, CSR_SUFFIX):
        if p.endswith(suffix):
            p = p[: -len(suffix)]
            break
    return p + BEG_SUFFIX, p + CSR_SUFFIX


def _read_int64(path: str) -> np.ndarray:
    size = os.path.getsize(path)
    if size % 8:
        raise err(
            path,
            f"byte offset {size - size % 8}",
            f"file size {size} bytes is not a multiple of 8 (int64 entries): "
            f"{size % 8} trailing bytes",
        )
    return np.fromfile(path, dtype="<i8")


def read_mgg_bin(prefix_or_path) -> Graph:
    """Read the MGG artifact's CSR: ``<prefix>_beg_pos.bin`` int64 [N+1] and
    ``<prefix>_csr.bin`` int64 [E] (raw little-endian). Accepts the prefix or either file.
    """
    beg_path, csr_path = mgg_paths(prefix_or_path)
    n, e = (os.path.getsize(p) // 8 for p in (beg_path, csr_path))
    require(
        8 * (n + e) + csr_bytes(n, e),
        f"{n:,} beg_pos and {e:,} csr entries (int64), and the graph built from them",
        beg_path,
    )
    beg = _read_int64(beg_path)
    csr = _read_int64(csr_path)
    if beg.size == 0:
        raise err(beg_path, "byte offset 0", "empty file; beg_pos needs N+1 >= 1 entries")
    if beg[0] != 0:
        raise err(beg_path, "element 0 (byte offset 0)", f"beg_pos[0] is {beg[0]}, expected 0")
    dec = np.flatnonzero(np.diff(beg) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise err(
            beg_path,
            f"element {i} (byte offset {8 * i})",
            f"beg_pos is not monotone: beg_pos[{i}] = {beg[i]} < beg_pos[{i - 1}] = {beg[i - 1]}",
        )
    n = beg.size - 1
    if beg[-1] != csr.size:
        raise err(
            beg_path,
            f"element {n} (byte offset {8 * n})",
            f"last entry beg_pos[{n}] = {beg[-1]} but {csr_path} holds {csr.size} entries",
        )
    out = np.flatnonzero((csr < 0) | (csr >= n))
    if out.size:
        i = int(out[0])
        raise err(
            csr_path, f"element {i} (byte offset {8 * i})", f"node id {csr[i]} is outside [0, {n})"
        )
    try:
        return Graph(beg, csr, None, n)
    except GraphError as e:
        raise GraphError(f"{beg_path}: {e}") from e


def write_mgg_bin(graph: Graph, prefix) -> tuple[str, str]:
    """Write ``<prefix>_beg_pos.bin`` and ``<prefix>_csr.bin`` (int64); returns both paths.

    The format has no weights: a weighted graph is written without them (with a warning).
    """
    beg_path, csr_path = mgg_paths(prefix)
    write_files(graph, beg_path, csr_path)
    return beg_path, csr_path


def write_files(graph: Graph, beg_path, csr_path) -> None:
    """The two files of the format, at any two paths (write_graph's temporaries)."""
    if graph.weights is not None:
        warnings.warn("the MGG binary CSR stores no edge weights; they are dropped", stacklevel=3)
    graph.indptr.astype("<i8").tofile(beg_path)
    graph.indices.astype("<i8").tofile(csr_path)


def edge_slice(path, rank, size) -> EdgeSlice:
    """Rank ``rank``'s edge range of the CSR, and all of beg_pos (O(N))."""
    beg_path, csr_path = mgg_paths(path)
    for p in (beg_path, csr_path):
        if os.path.getsize(p) % 8:
            raise err(p, "byte offset 0", "file size is not a multiple of 8 (int64 entries)")
    e = os.path.getsize(csr_path) // 8
    n1 = os.path.getsize(beg_path) // 8
    require(
        8 * n1 * 3 + 24 * (e // size + 1),
        f"beg_pos int64 [{n1:,}] (all of it) and this rank's {e // size:,} edges",
        beg_path,
    )
    beg = np.fromfile(beg_path, "<i8")
    check_indptr(beg_path, beg, e, "beg_pos")
    a, b = edge_range(e, rank, size)
    csr = np.fromfile(csr_path, "<i8", count=b - a, offset=8 * a)
    src, dst = csr_slice(csr_path, beg, csr, a, b, lambda i: f"element {i} (byte offset {8 * i})")
    return EdgeSlice(src, dst, None, beg.size - 1, 0, False, beg_path, f"edge {a}")


def _is_prefix(path: str) -> bool:
    return not os.path.exists(path) and os.path.exists(path + BEG_SUFFIX)


FORMAT = Format(
    "mgg",
    "MGG binary CSR",
    read_mgg_bin,
    (BEG_SUFFIX, CSR_SUFFIX),
    detect=_is_prefix,
    write=write_files,
    files=mgg_paths,
    written="*_beg_pos.bin (MGG binary CSR)",
    holds=frozenset(),
    edge_slice=edge_slice,
    sliced="the MGG binary CSR",
)
