"""A graph with what training needs (features, labels, split masks), and the seeded
policies that fill them in when a dataset lacks them: make_split, random_features.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..memory import require
from .core import Graph, GraphError

# what a job (mgg.prepare) gives a graph without features, and the footprint model counts:
FEATURELESS_IDENTITY_MAX = 200_000  # one-hot node ids up to this many nodes, else
FEATURELESS_WIDTH = 64  # this many seeded random features

__all__ = [
    "MASKS",
    "Dataset",
    "NodeRows",
    "check_split",
    "default_split",
    "given_split",
    "make_split",
    "random_features",
]

MASKS = ("train_mask", "val_mask", "test_mask")


class NodeRows(NamedTuple):
    """Rows lb..ub-1 of a dataset's node data (n = ub - lb): x float32 [n, F] or CSR,
    y labels [n], masks (train, val, test) bool [n] each; None where absent.
    num_classes and name are the whole dataset's; notes say what was filled in; ids
    int64 [n] the original node ids of the rows under a node order (None: lb..ub-1)."""

    x: np.ndarray | sp.csr_matrix | None
    y: np.ndarray | None
    masks: tuple | None
    num_classes: int | None
    name: str
    notes: str = ""
    ids: np.ndarray | None = None

    def node_ids(self, lb: int, ub: int) -> np.ndarray:
        """int64 [ub - lb]: the original id of each row (rows of new ids lb..ub-1)."""
        if self.ids is None:
            return np.arange(lb, ub, dtype=np.int64)
        return np.asarray(self.ids, np.int64)


@dataclass
class Dataset:
    """graph plus optional node data.

    x           float32 [N, F] dense, or scipy.sparse.csr_matrix [N, F] (kept sparse)
    y           int64 [N] class labels, or int8 [N, T] 0/1 targets of T binary tasks
                (multi-label, as ogbn-proteins; any 0/1 numeric or bool input is stored int8)
    *_mask      bool [N] split masks
    num_classes number of classes (max label + 1 when not given); T for multi-label y
    meta        free-form provenance (source, licence, generator parameters)
    """

    name: str
    graph: Graph
    x: np.ndarray | sp.csr_matrix | None = None
    y: np.ndarray | None = None
    train_mask: np.ndarray | None = None
    val_mask: np.ndarray | None = None
    test_mask: np.ndarray | None = None
    num_classes: int | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        n = self.graph.num_nodes
        if self.x is not None:
            if self.x.ndim != 2 or self.x.shape[0] != n:
                raise GraphError(
                    f"{self.name}: features have shape {self.x.shape}, expected ({n}, F)"
                )
            if sp.issparse(self.x):
                self.x = sp.csr_matrix(self.x, dtype=np.float32)
                bad = ~np.isfinite(self.x.data)
            else:
                self.x = np.asarray(self.x, dtype=np.float32)
                bad = ~np.isfinite(self.x)
            if bad.any():
                raise GraphError(f"{self.name}: features contain NaN or inf")
            if self.x.shape[1] == 0:
                raise GraphError(
                    f"{self.name}: features have 0 columns: give at least one, or none "
                    "(then mgg makes them)"
                )
        if self.y is not None and np.ndim(self.y) == 2:
            self._check_multilabel(n)
        elif self.y is not None:
            self.y = np.asarray(self.y)
            if self.y.shape != (n,) or not np.issubdtype(self.y.dtype, np.integer):
                raise GraphError(
                    f"{self.name}: labels must be integer [{n}], got {self.y.dtype} {self.y.shape}"
                )
            self.y = self.y.astype(np.int64, copy=False)
            if n and self.y.min() < 0:
                raise GraphError(f"{self.name}: labels must be >= 0, found {self.y.min()}")
            if self.num_classes is None:
                self.num_classes = int(self.y.max()) + 1 if n else 0
            elif n and self.y.max() >= self.num_classes:
                raise GraphError(
                    f"{self.name}: label {self.y.max()} >= num_classes {self.num_classes}"
                )
        for k in MASKS:
            m = getattr(self, k)
            if m is not None:
                m = np.asarray(m)
                if m.shape != (n,) or m.dtype != bool:
                    raise GraphError(
                        f"{self.name}: {k} must be bool [{n}], got {m.dtype} {m.shape}"
                    )
                setattr(self, k, m)
        check_split(self.name, {k: getattr(self, k) for k in MASKS})

    def rows(self, lb: int, ub: int, seed: int = 0, ids=None) -> NodeRows:
        """This dataset's node data for nodes lb..ub-1, or, under a node order, for the
        original nodes ``ids`` (int [ub - lb]); labeled datasets without a split get
        make_split's (20 train, 30 val per class, seeded, over the original ids)."""
        take = slice(lb, ub) if ids is None else np.asarray(ids, np.int64)
        notes, masks = "", None
        if self.y is not None:
            if self.train_mask is None:
                if self.multilabel:
                    raise GraphError(
                        f"{self.name}: multi-label targets need a split: give train, val "
                        "and test masks"
                    )
                what = f"labels up to {self.num_classes - 1:,}"
                masks, notes = default_split(self.y, self.num_classes, take, seed, self.name, what)
            else:
                given = (getattr(self, k) for k in MASKS)
                masks, notes = given_split([None if m is None else m[take] for m in given], ub - lb)
        return NodeRows(
            None if self.x is None else self.x[take],
            None if self.y is None else self.y[take],
            masks,
            self.num_classes,
            self.name,
            notes,
            ids if ids is None else take,
        )

    def _check_multilabel(self, n: int) -> None:
        y = np.asarray(self.y)
        if y.shape[0] != n or y.dtype.kind not in "biuf":
            raise GraphError(
                f"{self.name}: multi-label targets must be numeric [{n}, T], "
                f"got {y.dtype} {y.shape}"
            )
        bad = (y != 0) & (y != 1)
        if bad.any():
            r, c = (int(i) for i in np.argwhere(bad)[0])
            raise GraphError(
                f"{self.name}: multi-label targets must be 0 or 1, y[{r}, {c}] is {y[r, c]}"
            )
        self.y = y.astype(np.int8, copy=False)
        if self.num_classes is None:
            self.num_classes = int(y.shape[1])
        elif self.num_classes != y.shape[1]:
            raise GraphError(
                f"{self.name}: num_classes {self.num_classes} but y has {y.shape[1]} tasks"
            )

    @property
    def multilabel(self) -> bool:
        """True when y holds T binary targets per node ([N, T]) rather than one class."""
        return self.y is not None and self.y.ndim == 2

    @property
    def num_features(self) -> int | None:
        return None if self.x is None else int(self.x.shape[1])

    def __repr__(self) -> str:
        f = (
            f", features={self.x.shape[1]}{' sparse' if sp.issparse(self.x) else ''}"
            if self.x is not None
            else ""
        )
        c = f", {'tasks' if self.multilabel else 'classes'}={self.num_classes}"
        c = c if self.num_classes else ""
        return f"Dataset({self.name!r}, {self.graph}{f}{c})"


def check_split(name: str, masks: dict, offset=0, whole: bool = True) -> None:
    """GraphError unless the given ``masks`` (MASKS -> bool [n] or None) are a split: a
    train mask (that selects a node, when ``whole`` says these are all the rows) and
    pairwise disjoint masks. ``offset``: the global id of row 0, or the ids of the rows
    (int [n]), for the message."""
    given = {k: m for k, m in masks.items() if m is not None}
    if not given:
        return
    if given.get("train_mask") is None:
        raise GraphError(f"{name}: {' and '.join(given)} given without a train_mask")
    if whole:
        check_train_selects(name, int(given["train_mask"].any()))
    keys = list(given)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            both = given[a] & given[b]
            if both.any():
                first = int(np.argmax(both))
                node = offset[first] if np.ndim(offset) else offset + first
                raise GraphError(
                    f"{name}: {a} and {b} share {int(both.sum()):,} nodes (the first is node "
                    f"{node}): the splits must be disjoint"
                )


def default_split(y, num_classes: int, take, seed: int, source, what: str):
    """(the rows ``take`` (a slice or ids) of make_split's masks, the note saying so) for
    labels ``y`` [N] with no split of their own; ``what`` names the labels in a
    ResourceError (make_split counts per class)."""
    require(24 * num_classes, what, source)
    masks = tuple(m[take] for m in make_split(y, int(num_classes), 20, 30, seed=seed))
    return masks, "split: 20 train / 30 val per class (seeded), the rest test"


def given_split(masks, n: int) -> tuple[tuple, str]:
    """(a given split's rows, MASKS order, an absent mask as n empty rows; the note naming
    the absent ones, whose metrics are then null)."""
    missing = [k.split("_")[0] for k, m in zip(MASKS, masks, strict=True) if m is None]
    notes = f"no {' or '.join(missing)} mask: its metric is null" if missing else ""
    return tuple(np.zeros(n, bool) if m is None else m for m in masks), notes


def check_train_selects(name: str, count: int) -> None:
    """GraphError when the train mask selects ``count`` == 0 nodes (of the whole dataset)."""
    if not count:
        raise GraphError(f"{name}: the train mask selects no node: nothing to learn from")


def random_features(
    seed: int, lb: int, ub: int, dim: int, block: int = 4096, ids=None
) -> np.ndarray:
    """Rows lb..ub-1 of a deterministic random float32 [N, dim] matrix, the same whatever
    the split: block b of ``block`` rows comes from its own seeded generator. ``ids``
    (int [ub - lb]): the rows of those original ids instead (a node order's; each block
    they touch is generated once)."""
    if ids is not None:
        ids = np.asarray(ids, np.int64)
        out = np.empty((ids.size, dim), np.float32)
        order = np.argsort(ids, kind="stable")
        blocks = ids[order] // block
        starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]]) if ids.size else []
        for a, z in zip(starts, [*starts[1:], ids.size][: len(starts)], strict=True):
            b = int(blocks[a])
            rows = np.random.default_rng([seed, b]).standard_normal((block, dim), np.float32)
            out[order[a:z]] = rows[ids[order[a:z]] - b * block]
        return out
    out = np.empty((ub - lb, dim), np.float32)
    for b in range(lb // block, -(-ub // block)):
        rows = np.random.default_rng([seed, b]).standard_normal((block, dim), np.float32)
        a, z = max(lb, b * block), min(ub, (b + 1) * block)
        out[a - lb : z - lb] = rows[a - b * block : z - b * block]
    return out


def make_split(
    y, num_classes: int, train_per_class: int = 20, val_per_class: int = 30, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded per-class split: bool masks (train, val, test), each [N], disjoint, covering.

    In every class, nodes in random order go ``train_per_class`` to train, the next
    ``val_per_class`` to val and the rest to test (a class with fewer nodes fills train,
    then val, and leaves test empty). Labels outside [0, num_classes) raise ValueError.
    """
    y = np.asarray(y)
    n = y.size
    if n and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), found [{y.min()}, {y.max()}]")
    rng = np.random.default_rng([seed, 0x5E1, 7])
    shuffled = rng.permutation(n)
    order = shuffled[np.argsort(y[shuffled], kind="stable")]
    starts = np.zeros(num_classes + 1, np.int64)
    np.cumsum(np.bincount(y, minlength=num_classes), out=starts[1:])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - starts[y[order]]
    train = rank < train_per_class
    val = (rank >= train_per_class) & (rank < train_per_class + val_per_class)
    return train, val, ~(train | val)
