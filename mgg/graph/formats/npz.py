"""The ``.npz`` dataset layout of ``shared/data`` (see its MANIFEST.md)."""

from __future__ import annotations

import json
import os
import zipfile
import zlib

import numpy as np
import scipy.sparse as sp

from ...memory import csr_bytes, require
from ..core import Graph, GraphError
from ..dataset import MASKS, Dataset, NodeRows, check_split, default_split, given_split
from ._common import (
    FLOAT32_MAX,
    check_indptr,
    csr_slice,
    edge_range,
    err,
    find_asymmetry,
    require_npz,
    stem,
)
from .base import NODE_DATA, WEIGHTS, EdgeSlice, Format
from .members import Member, open_zip, take_csr_rows

__all__ = ["FORMAT", "edge_slice", "node_rows", "npz_meta", "read_npz", "write_npz"]

_NODE_KEYS = ("y", "train_mask", "val_mask", "test_mask")
_SPARSE_X = ("x_indptr", "x_indices", "x_data", "x_shape")


def read_npz(path) -> Dataset:
    """Read the ``shared/data`` npz layout into a Dataset (sparse features stay sparse).

    Keys: ``indptr`` int [N+1], ``indices`` int [E], optional ``weights`` float [E], ``x``
    float [N, F] or ``x_indptr/x_indices/x_data/x_shape`` (CSR), ``y`` int [N] (or 0/1
    [N, T] multi-label targets), bool [N] masks, ``meta`` (0-d JSON string).
    ``meta["directed"] is False`` marks the graph symmetric (checked).
    """
    path = os.fspath(path)
    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise err(path, "byte offset 0", f"not a readable .npz archive ({e})") from e
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise err(path, "byte offset 0", "holds a single .npy array, not an .npz archive")
    with z:
        keys = set(z.files)
        shapes = require_npz(path, z)
        e = shapes.get("indices", ((0,),))[0]
        require(
            csr_bytes(0, int(e[0]) if len(e) == 1 else 0),
            "the graph's validation and build",
            path,
        )
        arrays = {k: _npz_get(path, z, k) for k in sorted(keys)}
    for k in ("indptr", "indices"):
        if k not in arrays:
            raise err(path, f"key {k!r}", f"missing (keys present: {sorted(keys)})")
    meta = _npz_meta(path, arrays.get("meta"))
    for k in ("indptr", "indices"):
        a = arrays[k]
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise err(path, f"key {k!r}", f"expected a 1-D integer array, got {a.dtype} {a.shape}")
    weights = arrays.get("weights")
    if weights is not None and (weights.dtype.kind not in "fiu" or weights.ndim != 1):
        raise err(
            path,
            "key 'weights'",
            f"expected a 1-D float array, got {weights.dtype} {weights.shape}",
        )
    try:
        g = Graph(arrays["indptr"], arrays["indices"], weights)
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from e
    n = g.num_nodes
    if meta.get("directed") is False:
        asym = find_asymmetry(g)
        if asym is not None:
            u, v = asym
            raise err(
                path,
                "key 'indices'",
                f"meta says the graph is undirected but edge {u}->{v} has no reverse edge {v}->{u}",
            )
        g.symmetric = True
    x = _npz_features(path, arrays, n)
    for k in _NODE_KEYS:
        a = arrays.get(k)
        multilabel = k == "y" and a is not None and a.ndim == 2 and a.shape[0] == n
        if a is not None and a.shape != (n,) and not multilabel:
            raise err(path, f"key {k!r}", f"shape {a.shape}, expected ({n},) (one per node)")
    if "y" in arrays and not np.issubdtype(arrays["y"].dtype, np.integer):
        raise err(path, "key 'y'", f"labels must be integers, got {arrays['y'].dtype}")
    for k in _NODE_KEYS[1:]:
        if k in arrays and arrays[k].dtype != bool:
            raise err(path, f"key {k!r}", f"masks must be bool, got {arrays[k].dtype}")
    name = meta.get("name") if isinstance(meta.get("name"), str) else stem(path)
    num_classes = meta.get("num_classes")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool):
        num_classes = None
    try:
        return Dataset(
            name, g, x, *(arrays.get(k) for k in _NODE_KEYS), num_classes=num_classes, meta=meta
        )
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from e


def _npz_get(path, z, key):
    try:
        return z[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise err(path, f"key {key!r}", f"cannot be read ({e})") from e


def _npz_meta(path, a) -> dict:
    if a is None:
        return {}
    if a.ndim != 0 or a.dtype.kind not in "US":
        raise err(path, "key 'meta'", f"expected a 0-d JSON string, got {a.dtype} {a.shape}")
    text = a.item()
    try:
        meta = json.loads(text.decode() if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError) as e:
        raise err(path, "key 'meta'", f"not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise err(path, "key 'meta'", f"expected a JSON object, got {type(meta).__name__}")
    return meta


def _npz_features(path, arrays, n):
    sparse_keys = [k for k in _SPARSE_X if k in arrays]
    if "x" in arrays:
        if sparse_keys:
            raise err(path, "key 'x'", f"both dense 'x' and sparse {sparse_keys} are present")
        x = arrays["x"]
        if x.ndim != 2 or x.shape[0] != n or x.dtype.kind not in "fiub":
            raise err(
                path, "key 'x'", f"expected numeric features [{n}, F], got {x.dtype} {x.shape}"
            )
        if x.dtype.kind == "f":
            bad = ~np.isfinite(x) if x.dtype.itemsize <= 4 else ~(np.abs(x) <= FLOAT32_MAX)
            if bad.any():
                r, c = (int(i) for i in np.argwhere(bad)[0])
                raise err(
                    path, "key 'x'", f"x[{r}, {c}] is {x[r, c]}; features must be finite float32"
                )
        return x
    if not sparse_keys:
        return None
    missing = [k for k in _SPARSE_X if k not in arrays]
    if missing:
        raise err(
            path, f"key {missing[0]!r}", f"missing; sparse features need all of {list(_SPARSE_X)}"
        )
    ptr, ind, data, shape = (arrays[k] for k in _SPARSE_X)
    for k, a in zip(_SPARSE_X, (ptr, ind, data, shape), strict=True):
        kinds = "fiu" if k == "x_data" else "iu"
        if a.ndim != 1 or (a.dtype.kind not in kinds and a.size):
            raise err(
                path,
                f"key {k!r}",
                f"expected a 1-D {'numeric' if k == 'x_data' else 'integer'} array, got "
                f"{a.dtype} {a.shape}",
            )
    if shape.size != 2 or shape.min() < 0:
        raise err(path, "key 'x_shape'", f"expected [rows, cols] >= 0, got {shape.tolist()}")
    rows, cols = int(shape[0]), int(shape[1])
    if rows != n:
        raise err(path, "key 'x_shape'", f"{rows} feature rows, expected {n} (one per node)")
    if ptr.size != rows + 1:
        raise err(path, "key 'x_indptr'", f"{ptr.size} entries, expected x_shape[0]+1 = {rows + 1}")
    if ptr[0] != 0:
        raise err(path, "key 'x_indptr'", f"x_indptr[0] is {ptr[0]}, expected 0")
    dec = np.flatnonzero(np.diff(ptr) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise err(
            path,
            "key 'x_indptr'",
            f"not monotone: x_indptr[{i}] = {ptr[i]} < x_indptr[{i - 1}] = {ptr[i - 1]}",
        )
    if ptr[-1] != ind.size:
        raise err(
            path,
            "key 'x_indptr'",
            f"x_indptr[-1] is {ptr[-1]} but x_indices has {ind.size} entries",
        )
    if data.size != ind.size:
        raise err(path, "key 'x_data'", f"{data.size} entries but x_indices has {ind.size}")
    out = np.flatnonzero((ind < 0) | (ind >= cols))
    if out.size:
        i = int(out[0])
        raise err(path, "key 'x_indices'", f"x_indices[{i}] = {ind[i]} is outside [0, {cols})")
    bad = np.flatnonzero(~(np.abs(data) <= FLOAT32_MAX))
    if bad.size:
        i = int(bad[0])
        r = int(np.searchsorted(ptr, i, side="right")) - 1
        raise err(
            path,
            "key 'x_data'",
            f"x_data[{i}] (row {r}) is {data[i]}; features must be finite float32",
        )
    return sp.csr_matrix((data.astype(np.float32, copy=False), ind, ptr), shape=(rows, cols))


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"meta value of type {type(o).__name__} is not JSON serializable")


def npz_meta(meta, name, num_nodes, num_edges, num_classes, symmetric) -> str:
    """The ``meta`` member's JSON: the dataset's meta with name, num_nodes, num_edges,
    num_classes and ``directed`` (False only when the graph is marked symmetric)."""
    meta = dict(meta)
    meta.update(name=name, num_nodes=num_nodes, num_edges=num_edges)
    if num_classes is not None:
        meta["num_classes"] = int(num_classes)
    if symmetric:
        meta["directed"] = False
    elif symmetric is False:
        meta["directed"] = True
    elif meta.get("directed") is False:
        del meta["directed"]
    return json.dumps(meta, default=_json_default)


def write_npz(dataset: Dataset, path, compressed: bool = True) -> None:
    """Write a Dataset in the ``shared/data`` layout (sparse x as x_* CSR keys), deflated
    or, with ``compressed=False``, stored (ranks of the distributed partitioner then seek
    in it instead of decompressing up to their slice).

    ``meta`` gets name, num_nodes, num_edges, num_classes and ``directed`` (False only when
    the graph is marked symmetric).
    """
    path = os.fspath(path)
    g = dataset.graph
    arrays = {"indptr": g.indptr.astype(np.int64, copy=False), "indices": g.indices}
    if g.weights is not None:
        arrays["weights"] = g.weights
    x = dataset.x
    if x is not None and sp.issparse(x):
        x = sp.csr_matrix(x)
        arrays.update(
            x_indptr=x.indptr.astype(np.int64),
            x_indices=x.indices.astype(np.int32),
            x_data=x.data.astype(np.float32),
            x_shape=np.array(x.shape, dtype=np.int64),
        )
    elif x is not None:
        arrays["x"] = np.asarray(x, dtype=np.float32)
    for k in _NODE_KEYS:
        a = getattr(dataset, k)
        if a is not None:
            arrays[k] = a
    arrays["meta"] = np.array(
        npz_meta(
            dataset.meta, dataset.name, g.num_nodes, g.num_edges, dataset.num_classes, g.symmetric
        )
    )
    with open(path, "wb") as f:
        (np.savez_compressed if compressed else np.savez)(f, **arrays)


# ---- the distributed partitioner's slices: member streams -------------------------------
def _member_meta(z, path) -> dict:
    if "meta.npy" not in z.namelist():
        return {}
    return _npz_meta(path, Member(z, path, "meta").all().reshape(()))


def edge_slice(path, rank, size) -> EdgeSlice:
    """Rank ``rank``'s edge range of ``indices`` (and ``weights``), and all of ``indptr``
    (O(N)), read from the members' streams."""
    with open_zip(path) as z:
        names = set(z.namelist())
        for k in ("indptr", "indices"):
            if k + ".npy" not in names:
                raise err(path, f"key {k!r}", "missing")
        meta = _member_meta(z, path)
        ind = Member(z, path, "indices")
        if len(ind.shape) != 1 or ind.dtype.kind not in "iu":
            raise err(path, "key 'indices'", f"expected a 1-D integer array, got {ind.dtype}")
        ptr = Member(z, path, "indptr")
        n1, e = int(np.prod(ptr.shape)), ind.shape[0]
        require(
            8 * n1 * 3 + 24 * (e // size + 1),
            f"key 'indptr' {ptr.dtype} {ptr.shape} (all of it) and this rank's "
            f"{e // size:,} of {e:,} edges",
            path,
            "check the array shapes the file declares",
        )
        indptr = ptr.all().astype(np.int64)
        check_indptr(path, indptr, ind.shape[0], "key 'indptr'")
        a, b = edge_range(ind.shape[0], rank, size)
        src, dst = csr_slice(path, indptr, ind.rows(a, b), a, b, lambda i: f"key 'indices'[{i}]")
        w = None
        if "weights.npy" in names:
            wm = Member(z, path, "weights")
            if wm.shape != ind.shape:
                raise err(path, "key 'weights'", f"shape {wm.shape}, expected {ind.shape}")
            w = wm.rows(a, b).astype(np.float32)
            if not np.isfinite(w).all():
                raise err(path, "key 'weights'", "edge weights must be finite")
    sym = meta.get("directed") is False
    return EdgeSlice(src, dst, w, indptr.size - 1, 0, sym, path, f"edge {a}")


def node_rows(path, lb: int, ub: int, seed: int, ids) -> NodeRows:
    """Rows lb..ub-1 of the archive's node data, or, under a node order, the rows of the
    original nodes ``ids`` (int64 [ub - lb]). A dataset with labels but no split gets
    make_split's (seeded, over all labels: O(N))."""
    take = slice(lb, ub) if ids is None else ids
    with open_zip(path) as z:
        names = {n[:-4] for n in z.namelist() if n.endswith(".npy")}
        meta = _member_meta(z, path)
        n = Member(z, path, "indptr").shape[0] - 1
        require(24 * n, f"the node data of {n:,} nodes (labels, split)", path)
        x = None
        if "x" in names:
            xm = Member(z, path, "x")
            if len(xm.shape) != 2 or xm.shape[0] != n:
                raise err(path, "key 'x'", f"shape {xm.shape}, expected ({n}, F)")
            x = (xm.rows(lb, ub) if ids is None else xm.take(ids)).astype(np.float32)
        elif "x_indptr" in names:
            shape = Member(z, path, "x_shape").all()
            ptr = Member(z, path, "x_indptr").all().astype(np.int64)
            ind, data = Member(z, path, "x_indices"), Member(z, path, "x_data")
            check_indptr(path, ptr, ind.shape[0], "key 'x_indptr'")
            if ids is None:
                a, b = int(ptr[lb]), int(ptr[ub])
                csr = (data.rows(a, b), ind.rows(a, b), ptr[lb : ub + 1] - a)
            else:
                csr = take_csr_rows(ptr, ind, data, ids)
            x = sp.csr_matrix((csr[0].astype(np.float32), *csr[1:]), shape=(ub - lb, int(shape[1])))
        if x is not None:
            values = x.data if sp.issparse(x) else x
            if not np.isfinite(values).all():
                raise err(path, "key 'x'", "features must be finite float32 (NaN or inf found)")
        y = masks = None
        num_classes = meta.get("num_classes")
        notes = ""
        if "y" in names:
            ym = Member(z, path, "y")
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
    m = Member(z, path, key)
    if m.shape != (n,) or m.dtype != bool:
        raise err(path, f"key {key!r}", f"masks must be bool [{n}], got {m.dtype} {m.shape}")
    return m.rows(take.start, take.stop) if isinstance(take, slice) else m.take(take)


FORMAT = Format(
    "npz",
    "npz",
    read_npz,
    (".npz",),
    write=write_npz,
    written=".npz (everything)",
    holds=frozenset({WEIGHTS, NODE_DATA}),
    edge_slice=edge_slice,
    sliced=".npz",
    node_rows=node_rows,
)
