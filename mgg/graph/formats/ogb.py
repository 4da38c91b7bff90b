"""OGB node-property-prediction directories, read as OGB's loaders leave them on disk,
without the ``ogb`` package and without downloading anything.

``ROOT/raw/``: ``edge.csv.gz`` (``src,dst`` per line), ``num-node-list.csv.gz``,
``num-edge-list.csv.gz``, optional ``node-feat.csv.gz`` (N rows of F floats),
``node-label.csv.gz`` (N rows: a class, ``nan`` when unlabeled, or T columns of 0/1), optional
``edge-feat.csv.gz``; or the binary form of the big datasets: ``data.npz`` (``edge_index``
[2, E], ``num_nodes_list``, ``num_edges_list``, optional ``node_feat``, ``edge_feat``) and
``node-label.npz`` (``node_label``). ``ROOT/split/<name>/{train,valid,test}.csv.gz``: node ids.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from ...memory import csr_bytes, require
from ..core import Graph, GraphError
from ..dataset import Dataset
from ._common import err, open_binary, require_npz, show
from ._csv import read_csv_rows
from .base import NODE_DATA, Format
from .textlines import concat, parse_lines, read_node_ids

__all__ = ["FORMAT", "KNOWN", "OgbInfo", "is_ogb_dir", "ogb_info", "read_ogb"]


@dataclass(frozen=True)
class OgbInfo:
    """A row of OGB's nodeproppred/master.csv.

    task: "multiclass" (one class per node) or "multilabel" (num_tasks binary targets);
    num_classes: classes of the multiclass task (2 for binary tasks, as master.csv).
    """

    name: str
    add_inverse_edge: bool
    task: str
    num_tasks: int
    num_classes: int
    eval_metric: str
    split: str
    hetero: bool = False


KNOWN = {
    "arxiv": OgbInfo("ogbn-arxiv", False, "multiclass", 1, 40, "acc", "time"),
    "products": OgbInfo("ogbn-products", True, "multiclass", 1, 47, "acc", "sales_ranking"),
    "proteins": OgbInfo("ogbn-proteins", True, "multilabel", 112, 2, "rocauc", "species"),
    "papers100m": OgbInfo("ogbn-papers100M", False, "multiclass", 1, 172, "acc", "time"),
    "mag": OgbInfo("ogbn-mag", False, "multiclass", 1, 349, "acc", "time", hetero=True),
}
MARKERS = ("edge.csv.gz", "data.npz")  # what raw/ holds: the CSV or binary form
_HETERO_MARKERS = ("num-node-dict.csv.gz", "triplet-type-list.csv.gz", "edge_index_dict.npz")
_PARTS = ("train", "valid", "test")
EDGE_FEAT = ("auto", "mean", "skip")


def is_ogb_dir(path) -> bool:
    """A directory whose ``raw/`` holds an OGB graph (homogeneous or heterogeneous)."""
    raw = os.path.join(os.fspath(path), "raw")
    return os.path.isdir(raw) and any(
        os.path.isfile(os.path.join(raw, f)) for f in MARKERS + _HETERO_MARKERS
    )


def ogb_info(path) -> OgbInfo | None:
    """The master.csv row the directory's name picks (``ogbn_products``, ``products``,
    ``ogbn_products_pyg``, ``papers100M-bin``), else None."""
    name = os.path.basename(os.path.normpath(os.fspath(path))).lower().replace("-", "_")
    for suffix in ("_pyg", "_bin"):
        name = name.removesuffix(suffix)
    return KNOWN.get(name.removeprefix("ogbn_"))


def read_ogb(path, *, split=None, undirected=None, edge_feat="auto") -> Dataset:
    """Read an OGB node-property-prediction directory into a Dataset.

    The directory's name picks the dataset's row of :data:`KNOWN` (OGB's master.csv):
    ``add_inverse_edge`` datasets become symmetric graphs (each edge and its reverse,
    duplicates merged, marked symmetric); other names are directed (``undirected``
    overrides both). y: int64 [N] classes, or int8 [N, T] 0/1 targets for multi-label
    datasets (ogbn-proteins; an unknown name whose label file has T > 1 columns).
    Unlabeled nodes (NaN labels, as ogbn-papers100M) get label 0 and are left out of every
    mask. Masks come from ``split/<split>/{train,valid,test}.csv.gz`` (the dataset's split,
    else the only one present). ``edge_feat``: "mean" makes x [N, Fe] the mean of each
    node's edge features (OGB's recipe for ogbn-proteins), "auto" does so only when there
    are no node features, "skip" ignores them. Raises GraphError naming the file.
    """
    root, raw, info, binary = check_root(path, edge_feat)
    if binary:
        n, src, dst, x, efeat, fpath = _read_binary(raw, edge_feat)
    else:
        n = read_count(os.path.join(raw, "num-node-list.csv.gz"), "nodes")
        e = read_count(os.path.join(raw, "num-edge-list.csv.gz"), "edges")
        require(
            csr_bytes(n, 2 * e if undirected or info is None or info.add_inverse_edge else e)
            + 16 * n,
            f"raw/num-node-list.csv.gz and num-edge-list.csv.gz declare {n:,} nodes and "
            f"{e:,} edges, whose graph, labels and masks",
            root,
            "check the counts in raw/num-node-list.csv.gz and raw/num-edge-list.csv.gz",
        )
    y, num_classes, unlabeled, task, masks, split_name = node_data(root, raw, n, info, split)
    if not binary:
        src, dst = _read_edges(os.path.join(raw, "edge.csv.gz"), n, e)
        fpath = os.path.join(raw, "node-feat.csv.gz")
        x = _read_features(fpath, n) if os.path.isfile(fpath) else None
        fpath = os.path.join(raw, "edge-feat.csv.gz")
        efeat = None
        if os.path.isfile(fpath) and (edge_feat == "mean" or (edge_feat == "auto" and x is None)):
            efeat = _read_features(fpath, e, unit="edge")
    if undirected is None:
        undirected = info is not None and info.add_inverse_edge
    meta = ogb_meta(root, info, task, split_name, unlabeled)
    if efeat is not None and (edge_feat == "mean" or x is None):
        x = _edge_feature_mean(efeat, src, dst, n, undirected)
        meta["features"] = f"mean of the {efeat.shape[1]} edge features of each node ({fpath})"
    del efeat
    try:
        if undirected:
            g = Graph.from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]), n)
            del src, dst
            g = g.dedup()
            g.symmetric = True
        else:
            g = Graph.from_edges(src, dst, n)
            del src, dst
        return Dataset(
            info.name if info is not None else os.path.basename(root),
            g,
            x,
            y,
            *(masks if masks is not None else (None, None, None)),
            num_classes=num_classes,
            meta=meta,
        )
    except GraphError as e:
        if str(e).startswith(f"{root}:"):  # root is the dataset's name too
            raise
        raise GraphError(f"{root}: {e}") from e


def check_root(path, edge_feat):
    """(root, raw folder, its KNOWN row or None, whether it is the binary form) of an OGB
    directory read as a homogeneous graph; GraphError naming it when it is none."""
    root = os.path.normpath(os.fspath(path))
    raw = os.path.join(root, "raw")
    if edge_feat not in EDGE_FEAT:
        raise ValueError(f"edge_feat must be one of {', '.join(EDGE_FEAT)}, got {edge_feat!r}")
    info = ogb_info(root)
    hetero = [f for f in _HETERO_MARKERS if os.path.isfile(os.path.join(raw, f))]
    if hetero or (info is not None and info.hetero):
        what = info.name if info is not None and info.hetero else "this directory"
        found = f" (raw/{hetero[0]})" if hetero else ""
        raise GraphError(
            f"{root}: {what} is a heterogeneous OGB graph{found}: several node and edge "
            "types; mgg reads homogeneous graphs only (ogbn-arxiv, -products, -proteins, "
            "-papers100M)"
        )
    binary = os.path.isfile(os.path.join(raw, "data.npz"))
    if not binary and not os.path.isfile(os.path.join(raw, "edge.csv.gz")):
        raise GraphError(f"{root}: not an OGB directory: no raw/edge.csv.gz or raw/data.npz")
    return root, raw, info, binary


def node_data(root, raw, n, info, split):
    """(y, num_classes, unlabeled, task, masks, split's name): the labels and the split,
    unlabeled nodes left out of every mask."""
    y, num_classes, unlabeled, task = _read_labels(raw, n, info)
    masks, split_name = _read_split(root, n, info, split)
    if masks is not None and unlabeled is not None:
        masks = [m & ~unlabeled for m in masks]
    return y, num_classes, unlabeled, task, masks, split_name


def ogb_meta(root, info, task, split_name, unlabeled) -> dict:
    """The Dataset's meta: where it came from, its task, split and evaluation metric."""
    meta = {
        "source": "ogb",
        "path": root,
        "task": task,
        "split": split_name,
        "unlabeled_nodes": int(unlabeled.sum()) if unlabeled is not None else 0,
    }
    if info is not None:
        meta.update(ogb=asdict(info), eval_metric=info.eval_metric)
    else:
        meta["eval_metric"] = "rocauc" if task == "multilabel" else "acc"
    return meta


# ---- pieces ---------------------------------------------------------------------------------
def _missing(path, problem):
    return GraphError(f"{path}: missing: {problem}")


def read_count(path, what) -> int:
    """The single integer of num-node-list / num-edge-list (one graph per dataset)."""
    if not os.path.isfile(path):
        raise _missing(path, f"OGB keeps the number of {what} there, next to edge.csv.gz")
    try:
        with open_binary(path) as f:
            text = f.read()
    except (EOFError, OSError, zlib.error) as e:
        raise err(path, "byte offset 0", f"corrupt or truncated gzip stream ({e})") from e
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) != 1:
        raise err(
            path,
            f"line {max(len(lines), 1)}",
            f"{len(lines)} graphs: a node-property-prediction dataset holds one",
        )
    if not lines[0].isdigit():
        raise err(path, "line 1", f"{lines[0][:40]!r} is not a non-negative integer")
    if len(lines[0].lstrip(b"0")) > 18:
        raise err(path, "line 1", f"{show(lines[0])} ({len(lines[0]):,} digits) is too large")
    return int(lines[0])


def _read_edges(path, n, e):
    """(src, dst) int [E] in file order, ids checked against n and the count against e."""
    spec, parts, nlines = parse_lines(path, n, "", None)
    if spec.ncol == 3:
        raise err(path, f"line {spec.ncol_line}", "expected 2 columns 'src,dst', found 3")
    src = concat([p.src for p in parts], np.int32)
    dst = concat([p.dst for p in parts], np.int32)
    if src.size != e:
        raise err(
            path,
            f"line {max(nlines, 1)}",
            f"{src.size} edges, but num-edge-list.csv.gz says {e}",
        )
    return src, dst


def _read_features(path, rows, unit="node"):
    return check_finite(read_csv_rows(path, rows, unit=unit), path)


def check_finite(a, path, row0: int = 0, key: str | None = None):
    """``a`` [k, F] (rows row0.. of a CSV file, or of npz member ``key``), else GraphError
    at its first value that is not finite."""
    bad = ~np.isfinite(a)
    if not bad.any():
        return a
    r, c = (int(i) for i in np.argwhere(bad)[0])
    if key is None:
        raise err(
            path, f"line {row0 + r + 1}", f"column {c + 1} is {a[r, c]}: features must be finite"
        )
    raise err(path, f"key {key!r}", f"{key}[{row0 + r}, {c}] is {a[r, c]}: values must be finite")


def npz_counts(path, z) -> tuple[int, int]:
    """(nodes, edges) of data.npz's num_nodes_list and num_edges_list: one graph each."""
    counts = []
    for k in ("num_nodes_list", "num_edges_list"):
        if k not in z.files:
            raise err(path, f"key {k!r}", f"missing (keys present: {sorted(z.files)})")
        a = _npz_get(path, z, k)
        if a.size != 1 or a.dtype.kind not in "iu" or a.min() < 0:
            raise err(
                path, f"key {k!r}", f"expected one count (one graph), got {a.dtype} {a.shape}"
            )
        counts.append(int(a.ravel()[0]))
    return counts[0], counts[1]


def _read_binary(raw, edge_feat):
    """(n, src, dst, x, edge features or None, path) from raw/data.npz."""
    path = os.path.join(raw, "data.npz")
    z = load_npz(path)
    with z:
        keys = set(z.files)
        want = {"edge_index", "num_nodes_list", "num_edges_list", "node_feat"}
        if edge_feat != "skip":
            want.add("edge_feat")
        shapes = require_npz(path, z, want)
        ei = shapes.get("edge_index", ((0, 0),))[0]
        require(csr_bytes(0, 2 * ei[-1] if len(ei) == 2 else 0), "the graph's build", path)
        for k in ("edge_index", "num_nodes_list", "num_edges_list"):
            if k not in keys:
                raise err(path, f"key {k!r}", f"missing (keys present: {sorted(keys)})")
        n, e = npz_counts(path, z)
        ei = _npz_get(path, z, "edge_index")
        if ei.ndim != 2 or ei.shape[0] != 2 or (ei.size and ei.dtype.kind not in "iu"):
            raise err(
                path, "key 'edge_index'", f"expected integers [2, E], got {ei.dtype} {ei.shape}"
            )
        if ei.shape[1] != e:
            raise err(path, "key 'edge_index'", f"{ei.shape[1]} edges, but num_edges_list says {e}")
        if ei.size and (ei.min() < 0 or ei.max() >= n):
            out = np.flatnonzero(((ei < 0) | (ei >= n)).any(axis=0))
            j = int(out[0])
            r = 0 if not 0 <= ei[0, j] < n else 1
            raise err(
                path,
                "key 'edge_index'",
                f"edge_index[{r}, {j}] = {ei[r, j]} is outside [0, {n}) (num_nodes_list)",
            )
        src, dst = ei[0], ei[1]
        x = _npz_rows(path, z, "node_feat", n) if "node_feat" in keys else None
        want = edge_feat == "mean" or (edge_feat == "auto" and x is None)
        ef = _npz_rows(path, z, "edge_feat", e) if want and "edge_feat" in keys else None
    return n, src, dst, x, ef, path


def load_npz(path):
    """The NpzFile at ``path``; GraphError when it is no npz archive."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise err(path, "byte offset 0", f"not a readable .npz archive ({e})") from e
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise err(path, "byte offset 0", "holds a single .npy array, not an .npz archive")
    return z


def _npz_get(path, z, key):
    try:
        return z[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise err(path, f"key {key!r}", f"cannot be read ({e})") from e


def _npz_rows(path, z, key, rows):
    a = _npz_get(path, z, key)
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2 or a.shape[0] != rows or a.dtype.kind not in "fiub":
        raise err(path, f"key {key!r}", f"expected numbers [{rows}, F], got {a.dtype} {a.shape}")
    return check_finite(a.astype(np.float32, copy=False), path, key=key)


def _read_labels(raw, n, info):
    """(y, num_classes, unlabeled bool [N] or None, task) from node-label.npz / .csv.gz."""
    npz = os.path.join(raw, "node-label.npz")
    csv = os.path.join(raw, "node-label.csv.gz")
    if os.path.isfile(npz):
        path = npz
        with load_npz(npz) as z:
            require_npz(npz, z, {"node_label"}, extra=24 * n)
            if "node_label" not in z.files:
                raise err(npz, "key 'node_label'", f"missing (keys present: {sorted(z.files)})")
            lab = _npz_get(npz, z, "node_label")
        if lab.ndim == 1:
            lab = lab[:, None]
        if lab.ndim != 2 or lab.shape[0] != n or lab.dtype.kind not in "fiub":
            raise err(
                npz,
                "key 'node_label'",
                f"expected numbers [{n}, T] (num_nodes_list), got {lab.dtype} {lab.shape}",
            )

        def where(r):
            return f"key 'node_label', row {r}"

    elif os.path.isfile(csv):
        path = csv
        lab = read_csv_rows(csv, n, dtype=np.float64, allow_empty=True)

        def where(r):
            return f"line {r + 1}"

    else:
        return None, None, None, None
    lab = lab.astype(np.float64, copy=False)
    t = lab.shape[1]
    multi = info.task == "multilabel" if info is not None else t > 1
    if info is not None and t != info.num_tasks:
        raise err(
            path,
            where(0),
            f"{t} label columns, but {info.name} has {info.num_tasks} task(s)",
        )
    unlabeled = np.isnan(lab).any(axis=1)
    if multi:
        bad = ~unlabeled[:, None] & (lab != 0) & (lab != 1)
        if bad.any():
            r, c = (int(i) for i in np.argwhere(bad)[0])
            raise err(
                path,
                where(r),
                f"column {c + 1}: label {lab[r, c]:g} is not 0 or 1 (multi-label targets)",
            )
        y = np.where(unlabeled[:, None], 0, lab).astype(np.int8)
        num_classes = t
    else:
        col = lab[:, 0]
        bad = ~unlabeled & ~((col >= 0) & (col < 2**31) & (col == np.floor(col)))
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise err(path, where(r), f"label {col[r]:g} is not a non-negative integer class")
        y = np.where(unlabeled, 0, col).astype(np.int64)
        num_classes = info.num_classes if info is not None else int(y.max(initial=-1)) + 1
        over = np.flatnonzero(y >= num_classes)
        if over.size:
            r = int(over[0])
            raise err(
                path,
                where(r),
                f"label {y[r]} is out of range: {info.name} has {num_classes} classes",
            )
    task = "multilabel" if multi else "multiclass"
    return y, num_classes, (unlabeled if unlabeled.any() else None), task


def _read_split(root, n, info, split):
    """([train, val, test] bool [N] each, the split's name), or (None, None) without one."""
    sdir = os.path.join(root, "split")
    if not os.path.isdir(sdir):
        return None, None
    found = sorted(d for d in os.listdir(sdir) if os.path.isdir(os.path.join(sdir, d)))
    if split is None:
        if info is not None and info.split in found:
            split = info.split
        elif len(found) == 1:
            split = found[0]
        else:
            raise GraphError(
                f"{sdir}: {len(found)} split folders ({', '.join(found) or 'none'}): "
                f"choose one ({root}:split=NAME on the command line, split=NAME in Python)"
            )
    elif split not in found:
        raise GraphError(f"{sdir}: no split {split!r} (found: {', '.join(found) or 'none'})")
    masks = []
    for part in _PARTS:
        f = os.path.join(sdir, split, f"{part}.csv.gz")
        if not os.path.isfile(f):
            raise _missing(f, "an OGB split holds train.csv.gz, valid.csv.gz and test.csv.gz")
        m = np.zeros(n, bool)
        m[read_node_ids(f, n, comments="")] = True
        masks.append(m)
    return masks, split


def _edge_feature_mean(feat, src, dst, n, both):
    """float32 [N, Fe]: the mean feature of the edges into each node (and out of it when
    ``both``: each edge also stands for its reverse); 0 for isolated nodes."""
    deg = np.bincount(dst, minlength=n).astype(np.float64)
    if both:
        deg += np.bincount(src, minlength=n)
    x = np.empty((n, feat.shape[1]), np.float32)
    for j in range(feat.shape[1]):
        s = np.bincount(dst, weights=feat[:, j], minlength=n)
        if both:
            s += np.bincount(src, weights=feat[:, j], minlength=n)
        x[:, j] = s / np.maximum(deg, 1)
    return x


FORMAT = Format("ogb", "OGB directory", read_ogb, detect=is_ogb_dir, holds=frozenset({NODE_DATA}))
