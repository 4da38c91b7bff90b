"""Slices of a graph file for the distributed partitioner: rank r of P reads only its
share, O(N + E/P) memory.

- plain-text edge lists: byte ranges; a rank owns the lines that start in its range
  (gzip has no random access: it is refused with the way out);
- the MGG binary CSR and npz archives: an edge range of ``indices`` (plus all of
  ``indptr``, O(N)), read by offset from the file or from the archive member's stream.
"""

from __future__ import annotations

import os
import re
import zipfile
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ...memory import require
from ..core import GraphError
from ..dataset import MASKS, NodeRows, check_split, default_split, given_split
from . import _format
from ._common import BOM, MAX_ID, err, stem
from .edgelist import _CHUNK_BYTES, _LineError, _parse_chunk, _peek, _Spec
from .mgg_bin import _mgg_paths

__all__ = ["EdgeSlice", "NodeRows", "read_edge_slice", "read_node_rows"]

TAKE_BYTES = 1 << 26  # a block of node rows read by id (an order's) from an npz member


class EdgeSlice(NamedTuple):
    """One rank's contiguous slice of a graph's edges u -> v, in the file's order.

    src, dst int64 [e]; weights float32 [e] or None; num_nodes N when the file says it (a
    CSR), else None (then max id + 1 over all ranks, at least ``min_nodes``);
    symmetric: the file declares the graph undirected (checked by the partitioner);
    source: the file named in errors; offset: where the slice's first edge is;
    header_nodes: an edge list's ``# Nodes: N`` seen before the slice's first edge (it
    counts only before the file's first edge).
    """

    src: np.ndarray
    dst: np.ndarray
    weights: np.ndarray | None
    num_nodes: int | None
    min_nodes: int
    symmetric: bool
    source: str
    offset: str = ""
    header_nodes: int | None = None


def read_edge_slice(path, rank: int, size: int) -> EdgeSlice:
    """Rank ``rank``'s share of the edges of ``path`` (edge list, MGG binary or npz)."""
    path = os.fspath(path)
    fmt = _format(path)
    if fmt == "npz":
        return _npz_slice(path, rank, size)
    if fmt == "mgg":
        return _mgg_slice(path, rank, size)
    if fmt == "edgelist":
        return _edgelist_slice(path, rank, size)
    raise GraphError(
        f"{path}: --distributed reads edge lists, the MGG binary CSR and .npz; convert this "
        "file first (mgg convert)"
    )


# ---- edge lists: byte ranges --------------------------------------------------------------
def _line_start(f, pos: int) -> int:
    """The first line start at or after byte ``pos``."""
    if pos == 0:
        return 0
    f.seek(pos - 1)
    while True:
        block = f.read(1 << 16)
        if not block:
            return f.tell()
        i = block.find(b"\n")
        if i >= 0:
            return pos - 1 + i + 1
        pos += len(block)


def _edgelist_slice(path, rank, size) -> EdgeSlice:
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise err(
                path,
                "byte offset 0",
                "a gzip edge list has no random access, so ranks cannot read byte ranges "
                "of it: decompress it first (gunzip -k), or partition it in one process",
            )
    total = os.path.getsize(path)
    spec = _Spec(None, "#%", None, False)
    src, dst, ws = [], [], []
    first_edge = None
    with open(path, "rb") as f:
        a = _line_start(f, rank * total // size)
        b = _line_start(f, (rank + 1) * total // size)
        f.seek(a)
        pos = a
        while pos < b:
            block = f.read(min(_CHUNK_BYTES, b - pos))
            if not block:
                break
            if pos + len(block) < b and not block.endswith(b"\n"):
                block += f.readline()
            start = pos
            pos += len(block)
            if start == 0 and block.startswith(BOM):
                block = b" " * len(BOM) + block[len(BOM) :]
            if not block.endswith(b"\n"):
                block += b"\n"
            try:
                if spec.ncol is None:
                    if not _peek(spec, block, 0, path):
                        continue
                    first_edge = start
                part = _parse_chunk(spec, block)
            except _LineError as e:
                line = _line_number(path, start, e.rel)
                first = _line_number(path, first_edge, spec.ncol_line)
                problem = re.sub(r"as on line \d+", f"as on line {first}", e.problem)
                raise err(path, f"line {line}", problem) from None
            except GraphError as e:  # _peek's column count, with a chunk-relative line
                line = _line_number(path, start, _rel_line(str(e)))
                raise err(path, f"line {line}", str(e).split(": ", 2)[-1]) from None
            src.append(part.src.astype(np.int64))
            dst.append(part.dst.astype(np.int64))
            if part.w is not None:
                ws.append(part.w)
    s = np.concatenate(src) if src else np.empty(0, np.int64)
    d = np.concatenate(dst) if dst else np.empty(0, np.int64)
    hi = max(int(s.max(initial=-1)), int(d.max(initial=-1))) + 1
    if hi > MAX_ID:
        raise err(path, f"byte offset {first_edge}", "node ids are too large")
    require(
        24 * hi,
        f"node id {hi - 1:,} makes {hi:,} nodes, whose per-node counts",
        path,
        "node ids index the CSR's rows: number the nodes 0..N-1",
    )
    w = np.concatenate(ws) if spec.ncol == 3 else None
    where = f"line at byte offset {first_edge}" if first_edge is not None else ""
    return EdgeSlice(s, d, w, None, hi, False, path, where, spec.header_nodes)


def _rel_line(message: str) -> int:
    try:
        return int(message.split("line ", 1)[1].split(":", 1)[0])
    except (IndexError, ValueError):
        return 0


def _line_number(path, start: int, rel: int) -> int:
    """1-based line number of line ``rel`` (0-based) of the block at byte ``start``."""
    count = 0
    with open(path, "rb") as f:
        left = start
        while left > 0:
            block = f.read(min(left, 1 << 24))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count + rel + 1


# ---- CSR files: edge ranges ---------------------------------------------------------------
def _edge_range(num_edges: int, rank: int, size: int) -> tuple[int, int]:
    return rank * num_edges // size, (rank + 1) * num_edges // size


def _check_indptr(path, indptr, num_edges, what="indptr") -> None:
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


def _slice_of(path, indptr, indices, a, b, where) -> tuple[np.ndarray, np.ndarray]:
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


def _mgg_slice(path, rank, size) -> EdgeSlice:
    beg_path, csr_path = _mgg_paths(path)
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
    _check_indptr(beg_path, beg, e, "beg_pos")
    a, b = _edge_range(e, rank, size)
    csr = np.fromfile(csr_path, "<i8", count=b - a, offset=8 * a)
    src, dst = _slice_of(csr_path, beg, csr, a, b, lambda i: f"element {i} (byte offset {8 * i})")
    return EdgeSlice(src, dst, None, beg.size - 1, 0, False, beg_path, f"edge {a}")


class _Member:
    """An .npy member of an npz archive, read by element ranges from its stream;
    ``fortran``: a Fortran-ordered member is taken too (``flat`` reads it in memory
    order)."""

    def __init__(self, z: zipfile.ZipFile, path: str, key: str, fortran: bool = False):
        self.path, self.key = path, key
        try:
            self.f = z.open(key + ".npy")
            version = np.lib.format.read_magic(self.f)
            reader = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            self.shape, self.fortran, self.dtype = reader(self.f)
        except (KeyError, ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise err(path, f"key {key!r}", f"cannot be read ({e})") from e
        if (self.fortran and not fortran and len(self.shape) > 1) or self.dtype.hasobject:
            raise err(path, f"key {key!r}", "expected a C-ordered numeric array")
        self.start = self.f.tell()

    def flat(self, a: int, b: int) -> np.ndarray:
        """Elements a..b-1 in the order the file holds them."""
        size = self.dtype.itemsize
        try:
            self.f.seek(self.start + a * size)
            data = self.f.read((b - a) * size)
        except (OSError, zipfile.BadZipFile, EOFError) as e:
            raise err(self.path, f"key {self.key!r}", f"cannot be read ({e})") from e
        if len(data) != (b - a) * size:
            raise err(self.path, f"key {self.key!r}", "truncated")
        return np.frombuffer(data, self.dtype)

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows a..b-1 (along the first axis)."""
        row = int(np.prod(self.shape[1:], dtype=np.int64))
        return self.flat(a * row, b * row).reshape((b - a, *self.shape[1:]))

    def all(self) -> np.ndarray:
        return self.rows(0, self.shape[0] if self.shape else 1)

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (any order), read forward once in blocks of about TAKE_BYTES
        (a compressed member has no random access), holding one block at a time."""
        row = max(1, int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize)
        out = np.empty((ids.size, *self.shape[1:]), self.dtype)
        for at, a, b in _blocks(np.sort(ids), np.argsort(ids, kind="stable"), TAKE_BYTES // row):
            out[at] = self.rows(a, b)[ids[at] - a]
        return out


def _blocks(sorted_ids, order, rows: int):
    """(positions in the caller's ids, first row, end row) of each block of at most
    ``rows`` rows that holds any of the ids, in increasing row order."""
    rows, i = max(1, rows), 0
    while i < sorted_ids.size:
        a = int(sorted_ids[i])
        j = int(np.searchsorted(sorted_ids, a + rows, "left"))
        yield order[i:j], a, int(sorted_ids[j - 1]) + 1
        i = j


def _csr_take(ptr, ind, data, ids):
    """Rows ``ids`` of the CSR (``ptr`` int64 [n+1] in memory; ``ind``, ``data``
    _Members), read forward in blocks of about TAKE_BYTES: (data, indices, indptr)."""
    lengths = ptr[ids + 1] - ptr[ids]
    out_ptr = np.zeros(ids.size + 1, np.int64)
    np.cumsum(lengths, out=out_ptr[1:])
    out_ind = np.empty(int(out_ptr[-1]), ind.dtype)
    out_data = np.empty(int(out_ptr[-1]), data.dtype)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    ends = ptr[sorted_ids + 1]
    i, per = 0, max(1, TAKE_BYTES // (ind.dtype.itemsize + data.dtype.itemsize))
    while i < ids.size:  # rows whose elements span at most ``per`` (or one row)
        first = int(ptr[sorted_ids[i]])
        j = max(i + 1, int(np.searchsorted(ends, first + per, "right")))
        a, b = first, int(ptr[sorted_ids[j - 1] + 1])
        block_ind, block_data = ind.rows(a, b), data.rows(a, b)
        for k in order[i:j]:
            r = ids[k]
            lo, hi = int(ptr[r]) - a, int(ptr[r + 1]) - a
            out_ind[out_ptr[k] : out_ptr[k + 1]] = block_ind[lo:hi]
            out_data[out_ptr[k] : out_ptr[k + 1]] = block_data[lo:hi]
        i = j
    return out_data, out_ind, out_ptr


def _npz_open(path):
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise err(path, "byte offset 0", f"not a readable .npz archive ({e})") from e


def _npz_meta(z, path) -> dict:
    if "meta.npy" not in z.namelist():
        return {}
    from .npz import _npz_meta as parse

    return parse(path, _Member(z, path, "meta").all().reshape(()))


def _npz_slice(path, rank, size) -> EdgeSlice:
    with _npz_open(path) as z:
        names = set(z.namelist())
        for k in ("indptr", "indices"):
            if k + ".npy" not in names:
                raise err(path, f"key {k!r}", "missing")
        meta = _npz_meta(z, path)
        ind = _Member(z, path, "indices")
        if len(ind.shape) != 1 or ind.dtype.kind not in "iu":
            raise err(path, "key 'indices'", f"expected a 1-D integer array, got {ind.dtype}")
        ptr = _Member(z, path, "indptr")
        n1, e = int(np.prod(ptr.shape)), ind.shape[0]
        require(
            8 * n1 * 3 + 24 * (e // size + 1),
            f"key 'indptr' {ptr.dtype} {ptr.shape} (all of it) and this rank's "
            f"{e // size:,} of {e:,} edges",
            path,
            "check the array shapes the file declares",
        )
        indptr = ptr.all().astype(np.int64)
        _check_indptr(path, indptr, ind.shape[0], "key 'indptr'")
        a, b = _edge_range(ind.shape[0], rank, size)
        src, dst = _slice_of(path, indptr, ind.rows(a, b), a, b, lambda i: f"key 'indices'[{i}]")
        w = None
        if "weights.npy" in names:
            wm = _Member(z, path, "weights")
            if wm.shape != ind.shape:
                raise err(path, "key 'weights'", f"shape {wm.shape}, expected {ind.shape}")
            w = wm.rows(a, b).astype(np.float32)
            if not np.isfinite(w).all():
                raise err(path, "key 'weights'", "edge weights must be finite")
    sym = meta.get("directed") is False
    return EdgeSlice(src, dst, w, indptr.size - 1, 0, sym, path, f"edge {a}")


def read_node_rows(path, lb: int, ub: int, seed: int = 0, ids=None) -> NodeRows:
    """Rows lb..ub-1 of the node data of an npz archive (other formats hold none), or,
    under a node order, the rows of the original nodes ``ids`` (int [ub - lb]). A dataset
    with labels but no split gets make_split's (seeded, over all labels: O(N))."""
    path = os.fspath(path)
    if ids is not None:
        ids = np.asarray(ids, np.int64)
    take = slice(lb, ub) if ids is None else ids
    if _format(path) != "npz":
        return NodeRows(None, None, None, None, stem(path), "", ids)
    with _npz_open(path) as z:
        names = {n[:-4] for n in z.namelist() if n.endswith(".npy")}
        meta = _npz_meta(z, path)
        n = _Member(z, path, "indptr").shape[0] - 1
        require(24 * n, f"the node data of {n:,} nodes (labels, split)", path)
        x = None
        if "x" in names:
            xm = _Member(z, path, "x")
            if len(xm.shape) != 2 or xm.shape[0] != n:
                raise err(path, "key 'x'", f"shape {xm.shape}, expected ({n}, F)")
            x = (xm.rows(lb, ub) if ids is None else xm.take(ids)).astype(np.float32)
        elif "x_indptr" in names:
            shape = _Member(z, path, "x_shape").all()
            ptr = _Member(z, path, "x_indptr").all().astype(np.int64)
            ind, data = _Member(z, path, "x_indices"), _Member(z, path, "x_data")
            _check_indptr(path, ptr, ind.shape[0], "key 'x_indptr'")
            if ids is None:
                a, b = int(ptr[lb]), int(ptr[ub])
                csr = (data.rows(a, b), ind.rows(a, b), ptr[lb : ub + 1] - a)
            else:
                csr = _csr_take(ptr, ind, data, ids)
            x = sp.csr_matrix((csr[0].astype(np.float32), *csr[1:]), shape=(ub - lb, int(shape[1])))
        if x is not None:
            values = x.data if sp.issparse(x) else x
            if not np.isfinite(values).all():
                raise err(path, "key 'x'", "features must be finite float32 (NaN or inf found)")
        y = masks = None
        num_classes = meta.get("num_classes")
        notes = ""
        if "y" in names:
            ym = _Member(z, path, "y")
            multilabel = len(ym.shape) == 2
            y_all = (ym.rows(lb, ub) if ids is None else ym.take(ids)) if multilabel else ym.all()
            if ym.shape[0] != n or len(ym.shape) > 2 or ym.dtype.kind not in "biuf":
                raise err(path, "key 'y'", f"expected labels [{n}] or [{n}, T], got {ym.shape}")
            if multilabel:
                if ((y_all != 0) & (y_all != 1)).any():
                    raise err(path, "key 'y'", "multi-label targets must be 0 or 1")
                num_classes = int(ym.shape[1])
            elif y_all.dtype.kind not in "iu":
                raise err(path, "key 'y'", f"labels must be integers, got {y_all.dtype}")
            elif n and y_all.min() < 0:
                raise err(path, "key 'y'", f"labels must be >= 0, found {y_all.min()}")
            if not isinstance(num_classes, int):
                num_classes = int(y_all.max()) + 1 if n else 0
            y = y_all.astype(np.int8) if multilabel else y_all[take].astype(np.int64)
            if multilabel and "train_mask" not in names:
                raise err(path, "key 'train_mask'", "multi-label targets need a split")
            if set(MASKS) & names:
                masks = tuple(_mask_rows(z, path, k, n, take) for k in MASKS)
                where = lb if ids is None else ids
                check_split(path, dict(zip(MASKS, masks, strict=True)), where, whole=False)
                masks, notes = given_split(masks, ub - lb)
            else:
                what = f"key 'y': {num_classes:,} classes' split"
                masks, notes = default_split(y_all, num_classes, take, seed, path, what)
    name = meta.get("name") if isinstance(meta.get("name"), str) else stem(path)
    return NodeRows(x, y, masks, num_classes, name, notes, ids)


def _mask_rows(z, path, key: str, n: int, take):
    """Rows ``take`` (a slice, or ids) of the npz's bool [n] mask ``key`` (None when
    absent)."""
    if key + ".npy" not in z.namelist():
        return None
    m = _Member(z, path, key)
    if m.shape != (n,) or m.dtype != bool:
        raise err(path, f"key {key!r}", f"masks must be bool [{n}], got {m.dtype} {m.shape}")
    return m.rows(take.start, take.stop) if isinstance(take, slice) else m.take(take)


def source_checksum(path) -> dict:
    """A cheap identity of a source file (or of the files of a folder): sizes and blake2b
    of each file's first and last MiB."""
    import hashlib

    path = os.fspath(path)
    if os.path.isdir(path):  # an OGB directory: every file in it
        files = sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    else:
        files = list(_mgg_paths(path)) if _format(path) == "mgg" else [path]
    h = hashlib.blake2b(digest_size=16)
    total = 0
    for p in files:
        s = os.path.getsize(p)
        total += s
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if s > 1 << 20:
                f.seek(max(s - (1 << 20), 1 << 20))
                h.update(f.read())
        h.update(f"{os.path.relpath(p, path)}:{s}".encode())
    return {"path": os.path.abspath(path), "bytes": total, "blake2b_head_tail": h.hexdigest()}
