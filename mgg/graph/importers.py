"""Datasets from what users hold in Python: a PyG ``Data``, an ``edge_index``, a scipy matrix,
or two arrays of edge endpoints. Tensors are accepted wherever arrays are (duck-typed:
neither torch nor torch_geometric is imported).

Every importer validates its input and raises GraphError naming the argument and the
problem; each returns a Dataset whose graph is marked symmetric when it is (checked).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from .core import Graph, GraphError
from .dataset import MASKS, Dataset
from .formats._common import find_asymmetry

__all__ = ["from_arrays", "from_edge_index", "from_pyg", "from_scipy"]


def from_arrays(
    src,
    dst,
    num_nodes: int | None = None,
    *,
    x=None,
    y=None,
    train_mask=None,
    val_mask=None,
    test_mask=None,
    weights=None,
    undirected: bool = False,
    num_classes: int | None = None,
    name: str = "arrays",
) -> Dataset:
    """A Dataset from edge endpoints ``src``, ``dst`` int [E] (edge u -> v).

    num_nodes: default the rows of x (else of y), else max id + 1. x: float [N, F] (or
    scipy sparse); y: int [N] classes, or 0/1 [N, T] multi-label targets ([N, 1] is taken
    as [N]; float labels with NaN mark unlabeled nodes: label 0, left out of every mask);
    masks: bool [N] or int node ids; weights: float [E]. ``undirected`` adds every reverse
    edge (duplicates merged; an edge listed both ways must carry one weight).
    """
    src = _ids(src, "src")
    dst = _ids(dst, "dst")
    if src.shape != dst.shape:
        raise GraphError(f"src and dst differ in length: {src.size} and {dst.size}")
    return _build(
        name,
        src,
        dst,
        num_nodes,
        ("src", "dst"),
        source="src, dst",
        x=x,
        y=y,
        masks=(train_mask, val_mask, test_mask),
        weights=weights,
        undirected=undirected,
        num_classes=num_classes,
    )


def from_edge_index(
    edge_index,
    num_nodes: int | None = None,
    *,
    x=None,
    y=None,
    train_mask=None,
    val_mask=None,
    test_mask=None,
    weights=None,
    undirected: bool = False,
    num_classes: int | None = None,
    name: str = "edge_index",
) -> Dataset:
    """A Dataset from ``edge_index`` int [2, E] (row 0 sources, row 1 targets, as PyG's
    source-to-target flow); the rest as :func:`from_arrays`."""
    ei = _array(edge_index, "edge_index")
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise GraphError(f"edge_index has shape {ei.shape}, expected (2, E)")
    ei = _ids(ei, "edge_index")
    return _build(
        name,
        ei[0],
        ei[1],
        num_nodes,
        ("edge_index[0]", "edge_index[1]"),
        source="edge_index",
        x=x,
        y=y,
        masks=(train_mask, val_mask, test_mask),
        weights=weights,
        undirected=undirected,
        num_classes=num_classes,
    )


def from_scipy(
    matrix,
    *,
    x=None,
    y=None,
    train_mask=None,
    val_mask=None,
    test_mask=None,
    undirected: bool = False,
    num_classes: int | None = None,
    name: str = "scipy",
) -> Dataset:
    """A Dataset from a square scipy sparse matrix A [N, N] with A[v, u] != 0 for each edge
    u -> v (as Graph.from_scipy; A @ X aggregates; explicitly stored zeros are not edges).
    Stored values other than all ones become edge weights; the rest as
    :func:`from_arrays`."""
    if not sp.issparse(matrix):
        raise GraphError(f"matrix must be a scipy sparse matrix, got {type(matrix).__name__}")
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise GraphError(f"matrix must be square, got shape {matrix.shape}")
    coo = sp.coo_matrix(matrix)
    data = np.asarray(coo.data)
    if data.dtype.kind not in "biuf" or not np.isfinite(data).all():
        raise GraphError("matrix holds values that are not finite numbers")
    edge = data != 0
    data, col, row = data[edge], coo.col[edge], coo.row[edge]
    weights = None if np.all(data == 1) else data
    return _build(
        name,
        col,
        row,
        matrix.shape[0],
        ("matrix columns", "matrix rows"),
        source="matrix",
        x=x,
        y=y,
        masks=(train_mask, val_mask, test_mask),
        weights=weights,
        undirected=undirected,
        num_classes=num_classes,
    )


def from_pyg(data, *, name: str = "pyg", undirected: bool = False) -> Dataset:
    """A Dataset from a torch_geometric ``Data`` (duck-typed): ``edge_index`` [2, E]
    (source -> target), optional ``num_nodes``, ``x``, ``y``, ``train_mask``,
    ``val_mask``, ``test_mask``, and ``edge_weight`` or a one-column ``edge_attr`` as edge
    weights (wider ``edge_attr`` is dropped with a warning)."""
    if getattr(data, "edge_index", None) is None:
        raise GraphError(f"data has no edge_index (got {type(data).__name__})")
    weights = getattr(data, "edge_weight", None)
    attr = getattr(data, "edge_attr", None)
    if weights is None and attr is not None:
        a = _array(attr, "data.edge_attr")
        if a.ndim == 1 or (a.ndim == 2 and a.shape[1] == 1):
            weights = a.reshape(-1)
        else:
            warnings.warn(
                f"data.edge_attr has shape {a.shape}: a Graph holds one weight per edge, "
                "so the edge features are dropped",
                stacklevel=2,
            )
    n = _explicit_num_nodes(data)
    masks = tuple(getattr(data, k, None) for k in MASKS)
    ds = from_edge_index(
        data.edge_index,
        n,
        x=getattr(data, "x", None),
        y=getattr(data, "y", None),
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        weights=weights,
        undirected=undirected,
        name=name,
    )
    ds.meta["source"] = "pyg"
    return ds


# ---- validation -----------------------------------------------------------------------------
def _array(a, what: str) -> np.ndarray:
    """numpy view of an array-like or a (CPU or GPU) torch tensor."""
    if hasattr(a, "detach") and hasattr(a, "cpu"):
        a = a.detach().cpu().numpy()
    try:
        return np.asarray(a)
    except (TypeError, ValueError) as e:
        raise GraphError(f"{what} is not an array ({type(a).__name__}): {e}") from None


def _ids(a, what: str) -> np.ndarray:
    a = _array(a, what)
    if what != "edge_index" and a.ndim != 1:
        raise GraphError(f"{what} has shape {a.shape}, expected a 1-D array [E]")
    if a.size and (a.dtype.kind not in "iu"):
        raise GraphError(f"{what} must hold integer node ids, got {a.dtype}")
    return a


def _explicit_num_nodes(data):
    """data.num_nodes when set on it (PyG infers it otherwise, which we do ourselves)."""
    store = getattr(data, "_store", None)
    n = store.get("num_nodes") if store is not None and hasattr(store, "get") else None
    if n is None and store is None:
        n = getattr(data, "num_nodes", None)
    return None if n is None else int(n)


def _count(a, what) -> int:
    if sp.issparse(a):
        return a.shape[0]
    a = _array(a, what)
    if a.ndim == 0:
        raise GraphError(f"{what} must be an array with one row per node, got a scalar")
    return a.shape[0]


def _build(
    name, src, dst, num_nodes, names, *, source, x, y, masks, weights, undirected, num_classes
):
    """The Dataset; ``names``: the arrays of ``src`` and ``dst`` in errors, ``source``: the
    argument they came from."""
    if num_nodes is None:
        rows = [_count(a, k) for k, a in (("x", x), ("y", y)) if a is not None]
        num_nodes = rows[0] if rows else max(src.max(initial=-1), dst.max(initial=-1)) + 1
    n = int(num_nodes)
    if n < 0:
        raise GraphError(f"num_nodes must be >= 0, got {n}")
    for what, a in zip(names, (src, dst), strict=True):
        bad = np.flatnonzero((a < 0) | (a >= n)) if a.size else []
        if len(bad):
            i = int(bad[0])
            raise GraphError(f"{what}[{i}] = {a[i]} is outside [0, num_nodes = {n})")
    if weights is not None:
        weights = _array(weights, "weights")
        if weights.shape != src.shape:
            raise GraphError(f"weights has shape {weights.shape}, expected ({src.size},)")
        if weights.dtype.kind not in "biuf" or not np.isfinite(weights).all():
            raise GraphError("weights must be finite numbers")
    # the graph first: its size is checked against memory before anything of N rows
    g = Graph.from_edges(src, dst, n, weights, source=source)
    x = _features(x, n)
    y, unlabeled = _labels(y, n)
    masks = [_mask(m, k, n) for m, k in zip(masks, MASKS, strict=True)]
    if unlabeled is not None:
        masks = [None if m is None else m & ~unlabeled for m in masks]
    if undirected:
        g = _undirected(g)
    else:
        g.symmetric = find_asymmetry(g) is None
    ds = Dataset(name, g, x, y, *masks, num_classes=num_classes)
    if unlabeled is not None:
        ds.meta["unlabeled_nodes"] = int(unlabeled.sum())
    return ds


def _features(x, n):
    if x is None:
        return None
    if sp.issparse(x):
        values = x.data
    else:
        x = _array(x, "x")
        if x.ndim != 2 or x.dtype.kind not in "biuf":
            raise GraphError(f"x must be numeric [N, F], got {x.dtype} {x.shape}")
        values = x
    if x.shape[0] != n:
        raise GraphError(f"x has {x.shape[0]} rows, expected num_nodes = {n}")
    bad = ~np.isfinite(values)
    if bad.any():
        if sp.issparse(x):
            raise GraphError("x holds NaN or inf: features must be finite")
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise GraphError(f"x[{r}, {c}] is {values[r, c]}: features must be finite")
    return x


def _labels(y, n):
    """(y int64 [N] or 0/1 [N, T], unlabeled bool [N] or None)."""
    if y is None:
        return None, None
    y = _array(y, "y")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim not in (1, 2) or y.shape[0] != n or y.dtype.kind not in "biuf":
        raise GraphError(f"y must be int [{n}] or 0/1 [{n}, T], got {y.dtype} {y.shape}")
    unlabeled = None
    if y.dtype.kind == "f":
        nan = np.isnan(y) if y.ndim == 1 else np.isnan(y).any(axis=1)
        if nan.any():
            unlabeled = nan
            y = np.where(nan if y.ndim == 1 else nan[:, None], 0, y)
    if y.ndim == 2:
        bad = (y != 0) & (y != 1)
        if bad.any():
            r, c = (int(i) for i in np.argwhere(bad)[0])
            raise GraphError(f"y[{r}, {c}] is {y[r, c]}: multi-label targets must be 0 or 1")
        return y.astype(np.int8), unlabeled
    if y.dtype.kind == "f":
        bad = (y != np.floor(y)) | ~np.isfinite(y)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise GraphError(f"y[{i}] is {y[i]}: class labels must be integers")
    if y.size and y.min() < 0:
        i = int(np.argmin(y))
        raise GraphError(f"y[{i}] is {y[i]}: class labels must be >= 0")
    return y.astype(np.int64), unlabeled


def _mask(m, what, n):
    if m is None:
        return None
    m = _array(m, what)
    if m.dtype.kind == "b":
        if m.shape != (n,):
            raise GraphError(f"{what} has shape {m.shape}, expected bool [{n}] (one per node)")
        return m
    if m.ndim != 1 or (m.size and m.dtype.kind not in "iu"):
        raise GraphError(f"{what} must be bool [{n}] or int node ids, got {m.dtype} {m.shape}")
    bad = np.flatnonzero((m < 0) | (m >= n))
    if bad.size:
        i = int(bad[0])
        raise GraphError(f"{what}[{i}] = {m[i]} is outside [0, num_nodes = {n})")
    out = np.zeros(n, bool)
    out[m] = True
    return out


def _undirected(g: Graph) -> Graph:
    """g plus every reverse edge, duplicates merged; a weighted edge listed both ways (or
    twice) must carry one weight."""
    h, clash = g.symmetrize_weighted()
    if clash is not None:
        u, v, wa, wb = clash
        u, v = sorted((u, v))
        raise GraphError(f"weights: the undirected edge {u}-{v} has two weights, {wa:g} and {wb:g}")
    return h
