"""Helpers shared by the format modules: errors, file opening, names, symmetry checks,
CSR files sliced by edge ranges."""

from __future__ import annotations

import gzip
import os
from collections import Counter
from pathlib import Path

import numpy as np

from ...memory import format_bytes, require
from ..core import Graph, GraphError

WRITE_ROWS = 1 << 20
MAX_ID = 10**18
FLOAT32_MAX = float(np.finfo(np.float32).max)
DIGITS_WS = b"0123456789 \t\r\n"
BOM = b"\xef\xbb\xbf"
BEG_SUFFIX = "_beg_pos.bin"
CSR_SUFFIX = "_csr.bin"


def err(path, where: str, problem: str) -> GraphError:
    return GraphError(f"{path}: {where}: {problem}")


def show(token: bytes) -> str:
    text = token[:40].decode("utf-8", "replace")
    return repr(text + ("..." if len(token) > 40 else ""))


def open_binary(path: str):
    """A binary reader of ``path``, transparently gunzipped when it starts with gzip magic."""
    f = open(path, "rb")
    if f.read(2) == b"\x1f\x8b":
        f.close()
        return gzip.open(path, "rb")
    f.seek(0)
    return f


def open_write(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "wb", compresslevel=6)
    return open(path, "wb")


def npy_header(f) -> tuple:
    """(shape, fortran_order, dtype) of the .npy array whose bytes ``f`` starts at, ``f``
    left at the array's first byte; ValueError or EOFError for a damaged header."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def npz_shapes(z) -> dict:
    """{key: (shape, dtype)} of an open NpzFile's members, from their .npy headers (nothing
    is loaded); members whose header cannot be read are left to np.load to report."""
    out = {}
    for key in z.files:
        try:
            with z.zip.open(key + ".npy") as f:
                shape, _, dtype = npy_header(f)
        except Exception:  # noqa: BLE001 - np.load names the problem when it loads it
            continue
        out[key] = (tuple(int(d) for d in shape), dtype)
    return out


def require_npz(path, z, keys=None, extra: int = 0) -> dict:
    """Check that the members ``keys`` (all by default) of an open NpzFile, as their headers
    declare them, plus ``extra`` bytes fit in memory before loading; returns npz_shapes."""
    shapes = npz_shapes(z)
    sizes = {
        k: int(np.prod(s, dtype=object)) * d.itemsize
        for k, (s, d) in shapes.items()
        if keys is None or k in keys
    }
    if sizes:
        big = max(sizes, key=sizes.get)
        shape, dtype = shapes[big]
        require(
            sum(sizes.values()) + extra,
            f"key {big!r} declares {dtype} {shape} ({format_bytes(sizes[big])}), and "
            f"loading the {len(sizes)} array(s)",
            path,
            "check the array shapes the file declares",
        )
    return shapes


def stem(path: str) -> str:
    name = os.path.basename(os.fspath(path))
    for suffix in (".gz", BEG_SUFFIX, CSR_SUFFIX):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path(name).stem if "." in name else name


# ---- CSR files sliced by edge ranges (the distributed partitioner's) --------------------
def edge_range(num_edges: int, rank: int, size: int) -> tuple[int, int]:
    """Rank ``rank``'s edges [a, b) of ``num_edges``."""
    return rank * num_edges // size, (rank + 1) * num_edges // size


def check_indptr(path, indptr, num_edges, what="indptr") -> None:
    """GraphError at the first entry of ``indptr`` that is not a CSR's over ``num_edges``."""
    if indptr.size == 0:
        raise err(path, what, "empty; it needs N+1 >= 1 entries")
    if indptr[0] != 0:
        raise err(path, f"{what}[0]", f"is {indptr[0]}, expected 0")
    dec = np.flatnonzero(np.diff(indptr) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise err(path, f"{what}[{i}]", f"not monotone: {indptr[i]} < {indptr[i - 1]}")
    if indptr[-1] != num_edges:
        raise err(path, f"{what}[-1]", f"is {indptr[-1]} but there are {num_edges} edges")


def csr_slice(path, indptr, indices, a, b, where) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) int64 of the CSR's entries a..b-1 (``indices``), ids checked (``where(i)``
    names entry i)."""
    n = indptr.size - 1
    out = np.flatnonzero((indices < 0) | (indices >= n))
    if out.size:
        i = a + int(out[0])
        raise err(path, where(i), f"node id {indices[out[0]]} is outside [0, {n})")
    r0 = int(np.searchsorted(indptr, a, side="right")) - 1
    r1 = int(np.searchsorted(indptr, b, side="left"))
    counts = np.diff(np.clip(indptr[r0 : r1 + 1], a, b))
    dst = np.repeat(np.arange(r0, r0 + counts.size, dtype=np.int64), counts)
    return indices.astype(np.int64), dst


def _rows_sorted(g: Graph) -> bool:
    if g.num_edges < 2:
        return True
    desc = np.diff(g.indices.astype(np.int64)) < 0
    starts = g.indptr[1:-1]
    starts = starts[(starts > 0) & (starts < g.num_edges)]
    desc[starts - 1] = False
    return not desc.any()


def _canonical_rows(g: Graph) -> Graph:
    """g with each row ordered by (source, weight)."""
    rows = np.repeat(np.arange(g.num_nodes), g.in_degrees())
    order = np.lexsort((g.weights, g.indices, rows))
    return Graph(g.indptr, g.indices[order], g.weights[order], g.num_nodes, check=False)


def find_asymmetry(g: Graph):
    """None when g equals its transpose (weights included), else (u, v): u->v lacks a twin."""
    s = g if _rows_sorted(g) else g.sort_rows()
    t = Graph(g.indptr, g.indices, g.weights, g.num_nodes, check=False).transpose()
    ds, dt = np.diff(s.indptr), np.diff(t.indptr)
    if not np.array_equal(ds, dt):
        v = int(np.flatnonzero(ds != dt)[0])
    else:
        if g.weights is not None and not (
            np.array_equal(s.indices, t.indices) and np.array_equal(s.weights, t.weights)
        ):
            s, t = _canonical_rows(s), _canonical_rows(t)
        differ = s.indices != t.indices
        if g.weights is not None:
            differ |= s.weights != t.weights
        if not differ.any():
            return None
        v = int(np.searchsorted(s.indptr, int(np.flatnonzero(differ)[0]), side="right")) - 1

    def row(h):
        a, b = h.indptr[v], h.indptr[v + 1]
        ws = h.weights[a:b].tolist() if h.weights is not None else [None] * int(b - a)
        return Counter(zip(h.indices[a:b].tolist(), ws, strict=True))

    rs, rt = row(s), row(t)
    extra = rs - rt
    if extra:
        return int(min(extra, key=lambda k: k[0])[0]), v
    return v, int(min(rt - rs, key=lambda k: k[0])[0])
