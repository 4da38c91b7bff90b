"""``papers100m[:scale=S]``: a stand-in with ogbn-papers100M's shape, generated in slices.

At scale 1 it has OGB's counts: 111,059,956 nodes, about 1,615,685,872 undirected edges
(3.2 billion CSR entries), 128 features, 172 classes, 1,207,179 / 125,265 / 214,338
train / valid / test nodes and the rest unlabeled. Every count but the classes' and the
features' scales with S.

The model is planted_partition's (a degree-corrected block model: power-law node weights
of exponent 2.5, an edge u-v drawn with u in proportion to its weight, v in u's class with
probability ``p_in``) with a fixed number of draws, so that any range of draws is a slice
of the graph: rank r of P draws only its range (:meth:`Papers.draws`), and every node's
class, weight, features and split come from a hash of its id (:meth:`Papers.rows` gives
the rows of any ids). A rank holds O(N) node weights and its draws, never the graph.
One process (:meth:`Papers.dataset`) builds the graph of all draws: self loops dropped,
both directions added, duplicates merged, rows sorted (mgg.graph.csr, each round's new
draws merged into the last's); mgg.partition.distributed builds the same rows from the
slices. Its features are drawn when a job asks for its rows, in the job's dtype
(PapersDataset). The kernels, parallel, are mgg.graph.sampling's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..hashing import key64
from ..memory import csr_bytes, require
from ..precision import BF16, row_dtype
from .core import Graph, index_dtype
from .csr import build_csr_emptying, dynamic, merge_rows
from .dataset import Dataset, NodeRows
from .facts import facts
from .generators import CENTROID_NORM, threshold_u32
from .sampling import (
    class_blocks,
    class_order,
    classes_of,
    classes_of_range,
    draw_edges,
    draw_features,
    draw_weights,
    gather_rows,
    guide_table,
)

__all__ = ["PAPERS100M", "DrawnFeatures", "Papers", "PapersDataset", "parse_papers"]

NAME = "papers100m"
PAPERS100M = {  # ogbn-papers100M (OGB's node property prediction table)
    "nodes": 111_059_956,
    "edges": 1_615_685_872,  # undirected
    "features": 128,
    "classes": 172,
    "split": (1_207_179, 125_265, 214_338),
}
KEYS = ("scale", "seed", "features", "p_in", "noise")
# The first number of draws per wanted undirected edge; duplicates and self loops are
# merged away (a heavy tail repeats its hubs' pairs: 0.78 of the draws kept at scale
# 0.0005, 0.93 at 0.01), so more() draws again, more, until the graph has its entries.
OVERSAMPLE = 1.04
ROUNDS = 6
GUIDE_PER_NODE = 4  # the sampler's guide buckets per node: a search reads cum 1 in 4 draws
# Papers.dataset's peak per draw: a draw's (src, dst), then its two entries' (row, value)
# in the CSR's bucket sort (mgg.graph.csr); measured 26 B per draw, the per-node arrays
# included, at scale 0.05 (dataset() asks for 24 per draw of most_draws, 1.3x as many)
DRAW_BYTES = 4 * 2 + 2 * (4 + 4)
# a rank's share in generated_slice: its draws, both directions, exchanged, and the CSR's
SLICE_DRAW_BYTES = 112
# per node, while sampling: weight, its prefix sum, order, class, the guide
NODE_BYTES = 8 + 8 + 4 + 2 + 4 * GUIDE_PER_NODE
GRAPH_NODE_BYTES = 3 * 8 + 8 + 3  # row pointers (two rounds' and the merged), labels, masks
_SALT_CLASS, _SALT_WEIGHT, _SALT_X, _SALT_EDGE, _SALT_SPLIT = 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Papers:
    """The spec of one papers100M-shaped graph: N nodes, ``entries`` wanted CSR entries,
    ``num_draws`` undirected draws first (more() says how many next).

    ``labeled``: (train, valid, test) node counts; ``features`` 0 means no x.
    """

    scale: float
    seed: int
    num_nodes: int
    entries: int
    num_draws: int
    classes: int
    features: int
    labeled: tuple[int, int, int]
    p_in: float = 0.8
    noise: float = 2.0

    @property
    def name(self) -> str:
        return NAME if self.scale == 1 else f"{NAME}-s{self.scale:g}"

    @property
    def spec(self) -> str:
        return f"{NAME}:scale={self.scale:g},seed={self.seed}"

    @property
    def most_draws(self) -> int:
        """About the most draws more() asks for (what the memory checks count)."""
        return self.entries * 2 // 3

    def key(self, salt: int) -> np.uint64:
        return key64(self.seed, 0x9A9E5, salt)

    def more(self, draws: int, entries: int, rounds: int) -> int | None:
        """How many draws the graph takes next after ``draws`` gave ``entries`` distinct
        CSR entries in round ``rounds`` (1, 2, ...); None: these. The graph is draws
        0..D-1 for the first D that gives ``self.entries`` (within a few %, above), so
        one process and P ranks, which see the same counts, take the same D."""
        if entries >= self.entries or rounds >= ROUNDS or entries == 0:
            return None
        # the later draws repeat more pairs than the first: 1.3 > 1 overshoots a little
        return int(draws * (self.entries / entries) ** 1.3) + 1

    def labels(self, ids) -> np.ndarray:
        """int64 [len(ids)]: the class of each node (a hash of its id)."""
        ids = np.ascontiguousarray(ids, np.int64)
        out = np.empty(ids.size, np.int64)
        classes_of(ids, self.key(_SALT_CLASS), self.classes, out)
        return out

    def sampler(self) -> _Sampler:
        """What drawing an edge needs, O(N): every node's weight, in class order, and a
        guide to their prefix sums."""
        n = self.num_nodes
        require(NODE_BYTES * n, f"the node weights of {n:,} nodes", self.spec)
        y = np.empty(n, np.int16)
        classes_of_range(self.key(_SALT_CLASS), self.classes, y)
        order = np.empty(n, index_dtype(n))
        starts = np.zeros(self.classes + 1, np.int64)
        class_order(y, self.classes, class_blocks(n), order, starts)
        del y
        theta = np.empty(n, np.float64)
        avg_degree = self.entries / n
        draw_weights(self.key(_SALT_WEIGHT), theta)
        np.minimum(theta, max(theta.mean() * n / 4.0 / max(avg_degree, 1e-9), 1.0), out=theta)
        cum = np.empty(n, np.float64)
        gather_rows(theta, order, cum)
        del theta
        np.cumsum(cum, out=cum)
        edges = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], 0.0)  # mass below each start
        mass_lo = edges[:-1]
        mass = edges[1:] - mass_lo
        guide = np.empty(GUIDE_PER_NODE * n + 1, np.int32)
        scale = (guide.size - 1) / cum[-1]
        guide_table(cum, scale, guide)
        return _Sampler(cum, order, starts, mass_lo, mass, guide, scale)

    def require_slice(self, size: int) -> None:
        """ResourceError, with the numbers, when a rank of ``size`` cannot hold its share:
        the node weights, O(N) counts and its draws in both directions, exchanged."""
        n, per_rank = self.num_nodes, -(-self.most_draws // size)
        need = NODE_BYTES * n + csr_bytes(n, 0, build=False) + SLICE_DRAW_BYTES * per_rank
        what = f"{n:,} nodes and {per_rank:,} of {self.most_draws:,} drawn edges per rank"
        require(need, what, self.spec, f"choose a smaller scale or more ranks than {size}")

    @dynamic
    def draws(self, lo: int, hi: int, sampler: _Sampler | None = None):
        """(src, dst) [hi - lo] of draws lo..hi-1, one direction, self loops included."""
        s = sampler or self.sampler()
        dt = index_dtype(self.num_nodes)
        src, dst = np.empty(hi - lo, dt), np.empty(hi - lo, dt)
        t_in = threshold_u32(self.p_in if self.classes > 1 else 1.0)
        key = self.key(_SALT_EDGE)
        draw_edges(
            src, dst, key, t_in, s.cum, s.order, s.starts, s.mass_lo, s.mass, s.guide, s.scale, lo
        )
        return src, dst

    def rows(self, lb: int, ub: int, ids=None, dtype=np.float32) -> NodeRows:
        """The node data of nodes lb..ub-1, or of the original nodes ``ids``; features in
        ``dtype`` (float32 or bfloat16, drawn straight into it)."""
        given = None if ids is None else np.asarray(ids, np.int64)
        ids = np.arange(lb, ub, dtype=np.int64) if given is None else given
        y = self.labels(ids)
        x = self.x(ids, y, dtype) if self.features else None
        return NodeRows(x, y, self.masks(ids), self.classes, self.name, "", given)

    def source(self) -> dict:
        """Where a sharded dataset of it came from (as mgg.graph.specs.dataset_source)."""
        return {"spec": self.spec, "scale": None, "seed": self.seed}

    @dynamic
    def x(self, ids, y=None, dtype=np.float32) -> np.ndarray:
        """[len(ids), F] centroid[class] + N(0, noise^2), from a hash of (id, j): float32,
        or bfloat16 (those float32 values rounded to nearest even, no float32 copy)."""
        ids = np.ascontiguousarray(ids, np.int64)
        y = self.labels(ids) if y is None else y
        d = row_dtype(dtype)
        bf16 = d == BF16
        out = np.empty((ids.size, self.features), BF16 if bf16 else np.float32)
        args = (ids, y, self.centroids(), np.float32(self.noise), self.key(_SALT_X))
        draw_features(*args, out.view(np.uint16) if bf16 else out, bf16)
        return out if bf16 or d == np.float32 else out.astype(d)

    def centroids(self) -> np.ndarray:
        """float32 [C, F]: class centroids of norm CENTROID_NORM."""
        rng = np.random.default_rng([self.seed, 0xFEA7, 7])
        cent = rng.standard_normal((self.classes, self.features))
        cent *= CENTROID_NORM / np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
        return cent.astype(np.float32)

    def masks(self, ids) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(train, valid, test) bool [len(ids)]: exactly ``labeled`` nodes each, spread
        over the ids by a seeded affine permutation s(v) = (a v + b) mod N."""
        n = self.num_nodes
        rng = np.random.default_rng([self.seed, 0x5A1, _SALT_SPLIT])
        a = int(rng.integers(n // 3, max(2 * n // 3, n // 3 + 1))) | 1
        while math.gcd(a, n) != 1:
            a += 1
        s = (np.asarray(ids, np.int64) * a + int(rng.integers(0, n))) % n
        tr, va, te = np.cumsum(self.labeled)
        return s < tr, (s >= tr) & (s < va), (s >= va) & (s < te)

    def dataset(self) -> PapersDataset:
        """The whole graph in one process (what the slices add up to); its features are
        drawn when asked for (PapersDataset.rows: in the job's dtype)."""
        n = self.num_nodes
        need = DRAW_BYTES * self.most_draws + (NODE_BYTES + GRAPH_NODE_BYTES) * n
        what = f"{n:,} nodes and {self.most_draws:,} drawn edges"
        require(
            need,
            what,
            self.spec,
            "choose a smaller scale, or partition it --distributed over several ranks",
        )
        indptr, indices, used = self.csr()
        graph = Graph(indptr, indices, None, n, symmetric=True, check=False)
        ids = np.arange(n, dtype=np.int64)
        y, masks = self.labels(ids), self.masks(ids)
        del ids
        meta = {"generator": NAME, "params": {**self.params(), "draws": used}}
        meta["paper"] = PAPERS100M
        x = DrawnFeatures(self) if self.features else None
        return PapersDataset(self.name, graph, x, y, *masks, self.classes, meta=meta)

    def csr(self, times: dict | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """(indptr int64 [N+1], indices [E], D): the graph of draws 0..D-1, D the first
        count more() accepts, self loops dropped, both directions, duplicates merged, rows
        sorted. Each round draws only what the last did not and merges it in. ``times``:
        seconds of the steps (sampler, draws, csr) added there."""
        clock = _Clock(times)
        sampler = clock("sampler", self.sampler)
        done, draws, rounds, rows = 0, self.num_draws, 0, None
        while draws is not None:
            edges = list(clock("draws", self.draws, done, draws, sampler))
            part = clock("csr", build_csr_emptying, edges, self.num_nodes, True)[:2]
            rows = part if rows is None else clock("csr", merge_rows, rows, part)
            del part
            done, rounds = draws, rounds + 1
            draws = self.more(done, rows[1].size, rounds)
        return rows[0], rows[1], done

    def facts(self) -> dict:
        """What mgg.memory's estimates need, without drawing anything."""
        return facts(
            self.num_nodes,
            self.entries,
            features=self.features,
            classes=self.classes,
            labeled=sum(self.labeled),
            name=self.name,
        )

    def params(self) -> dict:
        return {
            "scale": self.scale,
            "seed": self.seed,
            "nodes": self.num_nodes,
            "entries_wanted": self.entries,
            "features": self.features,
            "classes": self.classes,
            "labeled": list(self.labeled),
            "p_in": self.p_in,
            "noise": self.noise,
        }


@dataclass(frozen=True)
class _Sampler:
    """cum float64 [N]: prefix sums of the weights in class order; order [N]: the node at
    each position; starts int64 [C+1]: each class's first position; mass_lo, mass float64
    [C]: the weight below each class and in it; guide int32 [K+1]: guide[b] = the
    positions whose prefix sum falls in a bucket below b (sampling._bucket: ``scale``
    buckets per unit of weight), so that a search reads one or two entries of cum."""

    cum: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    mass_lo: np.ndarray
    mass: np.ndarray
    guide: np.ndarray
    scale: float


class _Clock:
    """fn(*args), its wall seconds added to times[step] (nothing without times)."""

    def __init__(self, times: dict | None):
        self.times = times

    def __call__(self, step: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        if self.times is not None:
            self.times[step] = self.times.get(step, 0.0) + time.perf_counter() - t0
        return out


class DrawnFeatures:
    """A papers100m's features [N, F] float32, drawn when indexed (``x[ids]``, ``x[lb:ub]``)
    or turned into an array (all N rows): what PapersDataset holds in place of them."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, gen: Papers):
        self.gen = gen
        self.shape = (gen.num_nodes, gen.features)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, take) -> np.ndarray:
        if isinstance(take, slice):
            return self.gen.x(np.arange(self.shape[0], dtype=np.int64)[take])
        return self.gen.x(np.asarray(take, np.int64).reshape(-1))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        x = self[:]
        return x if dtype is None else x.astype(dtype, copy=False)


@dataclass(repr=False)
class PapersDataset(Dataset):
    """papers100m's Dataset: the graph, labels and split held, the features
    (DrawnFeatures) drawn by :meth:`rows` for the rows a rank asks for, in its dtype."""

    def __post_init__(self):
        x, self.x = self.x, None  # checked where drawn: finite by construction
        super().__post_init__()
        self.x = x

    def rows(self, lb: int, ub: int, seed: int = 0, ids=None, dtype=np.float32) -> NodeRows:
        """Dataset.rows, the features drawn in ``dtype`` (float32 or bfloat16)."""
        take = slice(lb, ub) if ids is None else np.asarray(ids, np.int64)
        y = self.y[take]
        x = None
        if self.x is not None:
            ids_ = np.arange(lb, ub, dtype=np.int64) if ids is None else take
            x = self.x.gen.x(ids_, y, dtype)
        masks = tuple(m[take] for m in (self.train_mask, self.val_mask, self.test_mask))
        return NodeRows(x, y, masks, self.num_classes, self.name, "", None if ids is None else take)

    __repr__ = Dataset.__repr__


def parse_papers(kv: dict, spec: str, scale=None, seed: int = 0) -> Papers:
    """The Papers of ``papers100m:KEY=VALUE,...`` (``kv`` parsed; ``scale`` the --scale
    flag). InputError for a bad value."""
    if scale is not None and "scale" in kv:
        raise InputError(f"--scale {scale:g} and {spec!r} both give a scale: give one")
    s = float(kv.get("scale", 1.0 if scale is None else scale))
    if not 0 < s < math.inf:
        raise InputError(f"{spec}: the scale must be a finite number > 0, got {s:g}")
    n = max(2, round(PAPERS100M["nodes"] * s))
    if n >= 2**31:
        raise InputError(f"{spec}: {n:,} nodes: the scale must keep the node count below 2^31")
    p_in, noise = float(kv.get("p_in", 0.8)), float(kv.get("noise", 2.0))
    if not 0 <= p_in <= 1 or not 0 <= noise < math.inf:
        raise InputError(f"{spec}: p_in must lie in [0, 1] and noise be >= 0")
    wanted = min(round(PAPERS100M["edges"] * s), n * (n - 1) // 20)
    labeled, left = [], n
    for count in PAPERS100M["split"]:
        labeled.append(min(max(1, round(count * s)), left))
        left -= labeled[-1]
    features = PAPERS100M["features"] if int(kv.get("features", 1)) else 0
    return Papers(
        scale=s,
        seed=int(kv.get("seed", seed)),
        num_nodes=n,
        entries=2 * wanted,
        num_draws=max(1, round(wanted * OVERSAMPLE)),
        classes=min(PAPERS100M["classes"], n),
        features=features,
        labeled=tuple(labeled),
        p_in=p_in,
        noise=noise,
    )
