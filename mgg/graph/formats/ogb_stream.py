"""An OGB directory into ``.npz`` or the MGG binary CSR in bounded memory: O(N) plus a
chunk, never O(E), so papers100M-class edge files convert on a machine with less memory
than their graph.

Pass 1 reads the edges for each row's entry count (and the means of the edge features);
pass 2 reads them again and appends each CSR entry (row = dst, col = src; and the reverse
for ``add_inverse_edge`` datasets) to the scratch file of its row range, the ranges cut so
that one holds at most ``chunk`` entries. Each range is then sorted by row in memory,
stably (a directed row keeps the file's order, as :func:`read_ogb`), its rows merged
when undirected, and appended to the output's indices. Feature rows stream block by
block. The result equals ``write_graph(read_ogb(...))``'s; the output is written under a
temporary name and renamed, the scratch files live beside it (swept after a killed job).
"""

from __future__ import annotations

import os
import shutil
import zipfile

import numba
import numpy as np

from ...atomic import atomic_write, sweep, temp_path
from ...memory import available_bytes, require
from ...progress import progress
from ..core import counting_sort, dedup_sorted, index_dtype, sort_csr_rows
from ..dataset import MASKS
from ._common import err, open_binary
from ._csv import csv_row_blocks
from .members import Member
from .mgg_bin import mgg_paths
from .npz import npz_meta
from .ogb import check_finite, check_root, load_npz, node_data, npz_counts, ogb_meta, read_count
from .textlines import CHUNK_BYTES, LineSpec, edge_chunks, num_workers

__all__ = ["CHUNK", "convert_ogb"]

CHUNK = 1 << 25  # at most, CSR entries sorted in memory at once
MIN_CHUNK = 1 << 16
ENTRY_BYTES = 48  # per entry sorted: the pair, keys, the sort's output, what is kept
PARSE_BYTES = 5 * CHUNK_BYTES  # per block in flight: its text, ids, edges and ranges
MAX_RANGES = 512  # scratch files open at once
_BLOCK = 1 << 22  # elements of a binary member read at once


def convert_ogb(
    root, out, *, split=None, undirected=None, edge_feat="auto", chunk=None, show=None
) -> dict:
    """Convert the OGB directory ``root`` to ``out`` (``.npz``, stored uncompressed so that
    the ranks of ``mgg partition --distributed`` seek in it, or ``*_beg_pos.bin``, which
    keeps the graph only), reading the edges twice and holding O(N) + ``chunk`` entries.

    ``split``, ``undirected``, ``edge_feat``: as :func:`read_ogb`. Returns what was
    written: num_nodes, num_edges, ranges (the row ranges sorted one at a time), chunk,
    dropped (what the output format cannot hold). GraphError naming the file on bad input;
    nothing is left at ``out`` then, nor any scratch file.
    """
    from . import write_format

    root, raw, info, binary = check_root(root, edge_feat)
    out = os.fspath(out)
    fmt = write_format(out)
    if fmt not in ("npz", "mgg"):
        raise ValueError(f"{out}: convert_ogb writes .npz or *_beg_pos.bin, not {fmt}")
    edges = _Edges(raw, binary)
    n, e = edges.n, edges.e
    if undirected is None:
        undirected = info is not None and info.add_inverse_edge
    entries = 2 * e if undirected else e
    idt = index_dtype(n)
    feats = _features(raw, binary, "node", n)
    efeats = None
    if edge_feat == "mean" or (edge_feat == "auto" and feats is None):
        efeats = _features(raw, binary, "edge", e)
    fe = efeats.cols if efeats is not None else 0
    fixed = 8 * (n + 1) * 3 + 24 * n + 8 * n * fe + PARSE_BYTES * (num_workers() + 1)
    if chunk is None:  # what memory leaves, within [MIN_CHUNK, CHUNK]
        chunk = min(CHUNK, max(MIN_CHUNK, (available_bytes() - fixed) // ENTRY_BYTES))
    chunk = max(int(chunk), -(-entries // MAX_RANGES), 1)
    require(
        fixed + chunk * ENTRY_BYTES,
        f"{n:,} nodes' row counts, labels and split (O(N)), the parser's blocks and "
        f"{chunk:,} CSR entries sorted at a time",
        root,
        "convert on a machine with more memory: the O(N) part cannot shrink",
    )
    y, num_classes, unlabeled, task, masks, split_name = node_data(root, raw, n, info, split)

    counts = np.zeros(n, np.int64)
    esum = np.zeros((n, fe), np.float64) if efeats is not None else None
    batches = edges.chunks() if efeats is None else _aligned(edges.chunks(), efeats.blocks())
    for batch in progress(batches, desc="ogb: rows", unit="chunk", enable=show):
        src, dst = batch[0], batch[1]
        _count(dst, counts)
        if undirected:
            _count(src, counts)
        if esum is not None:
            _add_rows(esum, dst, batch[2])
            if undirected:
                _add_rows(esum, src, batch[2])
    x = None
    if efeats is not None:
        x = (esum / np.maximum(counts, 1)[:, None]).astype(np.float32)
        del esum

    folder = os.path.dirname(os.path.abspath(out))
    sweep(folder)
    scratch = temp_path(os.path.join(folder, os.path.basename(out) + ".scratch"))
    os.mkdir(scratch)
    try:
        starts = _ranges(counts, chunk)
        _bucket(edges, starts, undirected, idt, scratch, show)
        degrees = counts if not undirected else np.empty(n, np.int64)
        indices = os.path.join(scratch, "indices")
        with open(indices, "wb") as f:
            for k in progress(range(len(starts) - 1), desc="ogb: sort", enable=show):
                a, b = int(starts[k]), int(starts[k + 1])
                f.write(memoryview(_sort_range(scratch, k, a, b, undirected, idt, degrees)))
                os.unlink(os.path.join(scratch, f"{k}"))
        del counts
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(degrees, out=indptr[1:])
        del degrees
        num_edges = int(indptr[-1])
        meta = ogb_meta(root, info, task, split_name, unlabeled)
        if efeats is not None:
            meta["features"] = f"mean of the {fe} edge features of each node ({efeats.path})"
        if x is None:
            x = feats
        node = dict(zip(MASKS, masks or (None,) * 3, strict=True), y=y)
        if fmt == "npz":
            name = info.name if info is not None else os.path.basename(root)
            meta = npz_meta(meta, name, n, num_edges, num_classes, undirected)
            _write_npz(out, indptr, indices, idt, x, node, meta, show)
            dropped = []
        else:
            _write_mgg(out, indptr, indices, idt)
            held = {"features": x, "labels": y, "split masks": masks}
            dropped = [what for what, v in held.items() if v is not None]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "num_nodes": n,
        "num_edges": num_edges,
        "ranges": len(starts) - 1,
        "chunk": chunk,
        "dropped": dropped,
    }


# ---- the edges, read as often as asked --------------------------------------------------
class _Edges:
    """The edges of raw/edge.csv.gz or raw/data.npz's edge_index: n, e, and ``chunks()``,
    a fresh pass over (src, dst) int [k] each call, ids and the count checked."""

    def __init__(self, raw, binary):
        self.binary = binary
        if binary:
            self.path = os.path.join(raw, "data.npz")
            with load_npz(self.path) as z:
                self.n, self.e = npz_counts(self.path, z)
        else:
            self.path = os.path.join(raw, "edge.csv.gz")
            self.n = read_count(os.path.join(raw, "num-node-list.csv.gz"), "nodes")
            self.e = read_count(os.path.join(raw, "num-edge-list.csv.gz"), "edges")

    def chunks(self):
        return self._npz() if self.binary else self._csv()

    def _csv(self):
        spec = LineSpec(self.n, "", None, False)
        seen = 0
        for part in edge_chunks(spec, self.path):
            if spec.ncol == 3:
                raise err(
                    self.path, f"line {spec.ncol_line}", "expected 2 columns 'src,dst', found 3"
                )
            seen += part.src.size
            if seen > self.e:
                break
            yield part.src, part.dst
        if seen != self.e:
            raise err(
                self.path,
                f"line {max(spec.lines, 1)}",
                f"{'more than ' if seen > self.e else ''}{seen} edges, but "
                f"num-edge-list.csv.gz says {self.e}",
            )

    def _npz(self):
        path, n, e = self.path, self.n, self.e
        with zipfile.ZipFile(path) as z:
            if "edge_index.npy" not in z.namelist():
                raise err(path, "key 'edge_index'", "missing")
            rows = Member(z, path, "edge_index", fortran=True)
            if len(rows.shape) != 2 or rows.shape[0] != 2 or rows.dtype.kind not in "iu":
                raise err(
                    path,
                    "key 'edge_index'",
                    f"expected integers [2, E], got {rows.dtype} {rows.shape}",
                )
            if rows.shape[1] != e:
                raise err(
                    path, "key 'edge_index'", f"{rows.shape[1]} edges, but num_edges_list says {e}"
                )
            cols = None if rows.fortran else Member(z, path, "edge_index")
            dt = index_dtype(n)
            for i in range(0, e, _BLOCK):
                j = min(e, i + _BLOCK)
                if rows.fortran:  # pairs side by side
                    pairs = rows.flat(2 * i, 2 * j).reshape(-1, 2)
                    src, dst = pairs[:, 0], pairs[:, 1]
                else:
                    src, dst = rows.flat(i, j), cols.flat(e + i, e + j)
                bad = np.flatnonzero((src < 0) | (src >= n) | (dst < 0) | (dst >= n))
                if bad.size:
                    k = int(bad[0])
                    r, v = (0, src[k]) if not 0 <= src[k] < n else (1, dst[k])
                    raise err(
                        path,
                        "key 'edge_index'",
                        f"edge_index[{r}, {i + k}] = {v} is outside [0, {n}) (num_nodes_list)",
                    )
                yield src.astype(dt), dst.astype(dt)


class _Rows:
    """Rows of node-feat / edge-feat (csv.gz or a data.npz member), block by block as
    float32 [k, cols], checked finite; ``blocks()`` is a fresh pass each call."""

    def __init__(self, path, key, rows, cols, unit):
        self.path, self.key, self.rows, self.cols, self.unit = path, key, rows, cols, unit

    def blocks(self):
        if self.key is None:
            row = 0
            for block in csv_row_blocks(self.path, self.rows, unit=self.unit):
                yield check_finite(block, self.path, row)
                row += len(block)
            return
        with zipfile.ZipFile(self.path) as z:
            m = Member(z, self.path, self.key)
            step = max(1, _BLOCK // max(1, self.cols))
            for i in range(0, self.rows, step):
                block = m.rows(i, min(self.rows, i + step)).reshape(-1, self.cols)
                yield check_finite(block.astype(np.float32), self.path, i, self.key)


def _features(raw, binary, unit, rows) -> _Rows | None:
    """node (or edge) features of the directory, None without them; the width checked."""
    if binary:
        path = os.path.join(raw, "data.npz")
        key = f"{unit}_feat"
        with zipfile.ZipFile(path) as z:
            if f"{key}.npy" not in z.namelist():
                return None
            m = Member(z, path, key)
        if len(m.shape) not in (1, 2) or m.shape[0] != rows or m.dtype.kind not in "fiub":
            raise err(
                path, f"key {key!r}", f"expected numbers [{rows}, F], got {m.dtype} {m.shape}"
            )
        return _Rows(path, key, rows, m.shape[1] if len(m.shape) == 2 else 1, unit)
    path = os.path.join(raw, f"{unit}-feat.csv.gz")
    if not os.path.isfile(path):
        return None
    with open_binary(path) as f:
        first = f.readline()
    return _Rows(path, None, rows, first.count(b",") + 1 if first.strip() else 0, unit)


def _aligned(edges, rows):
    """(src, dst, rows of the same edges) from an edge pass and a feature pass."""
    it = iter(rows)
    left = np.empty((0, 0), np.float32)
    for src, dst in edges:
        parts, have = [], 0
        while have < src.size:
            if not len(left):
                left = next(it)  # the feature pass raises first when its file is short
            take = min(src.size - have, len(left))
            parts.append(left[:take])
            left, have = left[take:], have + take
        yield src, dst, (np.concatenate(parts) if parts else np.empty((0, left.shape[1])))
    for _ in it:  # the rest: the pass checks the file's row count
        pass


# ---- the sort, range by range -----------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def _count(rows, counts):
    for r in rows:
        counts[r] += 1


@numba.njit(cache=True, nogil=True)
def _add_rows(acc, rows, values):
    for i in range(rows.size):
        acc[rows[i]] += values[i]


def _ranges(counts, chunk: int) -> np.ndarray:
    """Row starts [R + 1] of ranges of whole rows, each of at most ``chunk`` entries (a
    row of more is a range of its own)."""
    ptr = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    starts, a, n = [0], 0, counts.size
    while a < n:
        b = int(np.searchsorted(ptr, ptr[a] + chunk, "right")) - 1
        a = min(n, max(a + 1, b))
        starts.append(a)
    return np.asarray(starts if n else [0, 0], np.int64)


def _bucket(edges, starts, undirected, idt, scratch, show):
    """Append each entry (row, col) to the scratch file of its row's range, in file
    order."""
    files = [open(os.path.join(scratch, f"{k}"), "wb") for k in range(len(starts) - 1)]
    try:
        for src, dst in progress(edges.chunks(), desc="ogb: ranges", unit="chunk", enable=show):
            ends = np.zeros(len(files) + 1, np.int64)
            _range_counts(starts, dst, ends[1:])
            if undirected:
                _range_counts(starts, src, ends[1:])
            np.cumsum(ends, out=ends)
            pairs = np.empty((int(ends[-1]), 2), idt)
            at = ends[:-1].copy()
            _place(starts, dst, src, at, pairs)
            if undirected:
                _place(starts, src, dst, at, pairs)
            for k in np.flatnonzero(np.diff(ends)):
                files[k].write(memoryview(pairs[ends[k] : ends[k + 1]]))
    finally:
        for f in files:
            f.close()


@numba.njit(cache=True, nogil=True)
def _range_of(starts, r):
    lo, hi = 0, starts.size - 1  # starts[lo] <= r < starts[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if starts[mid] <= r:
            lo = mid
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True)
def _range_counts(starts, rows, counts):
    for r in rows:
        counts[_range_of(starts, r)] += 1


@numba.njit(cache=True, nogil=True)
def _place(starts, rows, cols, at, pairs):
    for i in range(rows.size):
        k = _range_of(starts, rows[i])
        pairs[at[k], 0] = rows[i]
        pairs[at[k], 1] = cols[i]
        at[k] += 1


def _sort_range(scratch, k, a, b, undirected, idt, degrees) -> np.ndarray:
    """Range k (rows a..b-1) sorted: its indices in CSR order (merged when undirected,
    each row's degree then set in ``degrees``)."""
    pairs = np.fromfile(os.path.join(scratch, f"{k}"), idt).reshape(-1, 2)
    ptr, ind, _ = counting_sort(pairs[:, 0].astype(np.int64) - a, pairs[:, 1].copy(), b - a, None)
    del pairs
    if not undirected:
        return ind
    none = np.empty(0, np.float32)
    sort_csr_rows(ptr, ind, none, False)
    keep, _ = dedup_sorted(ptr, ind, none, False)
    kept = np.zeros(ind.size + 1, np.int64)
    np.cumsum(keep, out=kept[1:])
    degrees[a:b] = kept[ptr[1:]] - kept[ptr[:-1]]
    return ind[keep.astype(bool)]


# ---- the outputs ------------------------------------------------------------------------
def _write_npz(out, indptr, indices, idt, x, node, meta, show):
    """A stored .npz of read_npz's layout, its big members streamed."""
    e = os.path.getsize(indices) // idt.itemsize
    with atomic_write(out) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        _member(z, "indptr", indptr)
        with open(indices, "rb") as f, z.open("indices.npy", "w", force_zip64=True) as m:
            _header(m, idt, (e,))
            shutil.copyfileobj(f, m, 1 << 20)
        if isinstance(x, _Rows):
            with z.open("x.npy", "w", force_zip64=True) as m:
                _header(m, np.dtype(np.float32), (x.rows, x.cols))
                for block in progress(x.blocks(), desc="ogb: features", unit="block", enable=show):
                    m.write(memoryview(np.ascontiguousarray(block)))
        elif x is not None:
            _member(z, "x", x)
        for k, v in node.items():
            if v is not None:
                _member(z, k, v)
        _member(z, "meta", np.array(meta))


def _header(f, dtype, shape):
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )


def _member(z, key, a):
    with z.open(f"{key}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.asarray(a), allow_pickle=False)


def _write_mgg(out, indptr, indices, idt):
    beg, csr = mgg_paths(out)
    with atomic_write(beg, csr) as (tb, tc):
        indptr.astype("<i8").tofile(tb)
        with open(indices, "rb") as f, open(tc, "wb") as o:
            while block := f.read(_BLOCK * idt.itemsize):
                o.write(memoryview(np.frombuffer(block, idt).astype("<i8")))
