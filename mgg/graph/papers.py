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
both directions added, duplicates merged, rows sorted; mgg.partition.distributed builds
the same rows from the slices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import InputError
from ..hashing import GOLDEN, key64, mix64
from ..memory import csr_bytes, facts, require
from .core import Graph, index_dtype
from .dataset import Dataset, NodeRows
from .generators import CENTROID_NORM, _planted_fill, _threshold, _uniform, build_csr

__all__ = ["PAPERS100M", "Papers", "parse_papers"]

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
DRAW_BYTES = 2 * 4 * 2 + 40  # a draw's (src, dst), both directions, and the CSR build
NODE_BYTES = 8 + 8 + 4 + 2  # per node, while sampling: weight, its prefix sum, order, class
_LO32 = np.uint64(0xFFFFFFFF)
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
        _classes(ids, self.key(_SALT_CLASS), self.classes, out)
        return out

    def sampler(self) -> _Sampler:
        """What drawing an edge needs, O(N): every node's weight, in class order."""
        n = self.num_nodes
        require(NODE_BYTES * n, f"the node weights of {n:,} nodes", self.spec)
        y = self.labels(np.arange(n, dtype=np.int64)).astype(np.int16)
        theta = np.empty(n, np.float64)
        avg_degree = self.entries / n
        _weights(self.key(_SALT_WEIGHT), theta)
        np.minimum(theta, max(theta.mean() * n / 4.0 / max(avg_degree, 1e-9), 1.0), out=theta)
        order = np.argsort(y, kind="stable").astype(index_dtype(n))
        cum = np.cumsum(theta[order])
        del theta
        starts = np.zeros(self.classes + 1, np.int64)
        np.cumsum(np.bincount(y, minlength=self.classes), out=starts[1:])
        edges = np.concatenate([[0.0], cum])
        mass_lo = edges[starts[:-1]]
        mass = edges[starts[1:]] - mass_lo
        return _Sampler(cum, order, y, starts, mass_lo, mass)

    def require_slice(self, size: int) -> None:
        """ResourceError, with the numbers, when a rank of ``size`` cannot hold its share:
        the node weights, O(N) counts and its draws in both directions, exchanged."""
        n, per_rank = self.num_nodes, -(-self.most_draws // size)
        need = NODE_BYTES * n + csr_bytes(n, 0, build=False) + 2 * DRAW_BYTES * per_rank
        what = f"{n:,} nodes and {per_rank:,} of {self.most_draws:,} drawn edges per rank"
        require(need, what, self.spec, f"choose a smaller scale or more ranks than {size}")

    def draws(self, lo: int, hi: int, sampler: _Sampler | None = None):
        """(src, dst) [hi - lo] of draws lo..hi-1, one direction, self loops included."""
        s = sampler or self.sampler()
        dt = index_dtype(self.num_nodes)
        src, dst = np.empty(hi - lo, dt), np.empty(hi - lo, dt)
        t_in = _threshold(self.p_in if self.classes > 1 else 1.0)
        key = self.key(_SALT_EDGE)
        _planted_fill(src, dst, key, t_in, s.cum, s.order, s.y, s.starts, s.mass_lo, s.mass, lo)
        return src, dst

    def rows(self, lb: int, ub: int, ids=None) -> NodeRows:
        """The node data of nodes lb..ub-1, or of the original nodes ``ids``."""
        given = None if ids is None else np.asarray(ids, np.int64)
        ids = np.arange(lb, ub, dtype=np.int64) if given is None else given
        y = self.labels(ids)
        x = self.x(ids, y) if self.features else None
        return NodeRows(x, y, self.masks(ids), self.classes, self.name, "", given)

    def source(self) -> dict:
        """Where a sharded dataset of it came from (as mgg.graph.specs.dataset_source)."""
        return {"spec": self.spec, "scale": None, "seed": self.seed}

    def x(self, ids, y=None) -> np.ndarray:
        """float32 [len(ids), F]: centroid[class] + N(0, noise^2), from a hash of (id, j)."""
        ids = np.ascontiguousarray(ids, np.int64)
        y = self.labels(ids) if y is None else y
        out = np.empty((ids.size, self.features), np.float32)
        _features(ids, y, self.centroids(), np.float32(self.noise), self.key(_SALT_X), out)
        return out

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

    def dataset(self) -> Dataset:
        """The whole graph in one process (what the slices add up to)."""
        n = self.num_nodes
        need = csr_bytes(n, 0) + DRAW_BYTES * self.most_draws + NODE_BYTES * n
        need += 4 * n * self.features
        what = f"{n:,} nodes, {self.most_draws:,} drawn edges and {self.features} features"
        require(
            need,
            what,
            self.spec,
            "choose a smaller scale, or partition it --distributed over several ranks",
        )
        sampler, draws, rounds = self.sampler(), self.num_draws, 0
        while draws is not None:
            src, dst = self.draws(0, draws, sampler)
            indptr, indices = build_csr(src, dst, n, True)
            del src, dst
            used, rounds = draws, rounds + 1
            draws = self.more(used, indices.size, rounds)
        del sampler
        graph = Graph(indptr, indices, None, n, symmetric=True, check=False)
        rows = self.rows(0, n)
        meta = {"generator": NAME, "params": {**self.params(), "draws": used}}
        meta["paper"] = PAPERS100M
        return Dataset(self.name, graph, rows.x, rows.y, *rows.masks, self.classes, meta=meta)

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
    cum: np.ndarray
    order: np.ndarray
    y: np.ndarray
    starts: np.ndarray
    mass_lo: np.ndarray
    mass: np.ndarray


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


@numba.njit(parallel=True, cache=True)
def _classes(ids, key, classes, out):
    for i in numba.prange(ids.size):
        out[i] = np.int64(mix64(key + np.uint64(ids[i]) * GOLDEN) % np.uint64(classes))


@numba.njit(parallel=True, cache=True)
def _weights(key, out):
    """Pareto weights of tail exponent 1.5 (degrees of exponent 2.5), node i's from a hash
    of i."""
    for i in numba.prange(out.size):
        u = _uniform(mix64(key + np.uint64(i) * GOLDEN))
        out[i] = (1.0 - u) ** (-1.0 / 1.5)


@numba.njit(parallel=True, cache=True)
def _features(ids, y, cent, noise, key, out):
    f = out.shape[1]
    for i in numba.prange(ids.size):
        base = np.uint64(ids[i]) * np.uint64(f)
        c = y[i]
        for j in range(f):
            h = mix64(key + (base + np.uint64(j)) * GOLDEN)
            u1 = (np.float64(h >> np.uint64(32)) + 0.5) * (1.0 / 4294967296.0)
            u2 = (np.float64(h & _LO32) + 0.5) * (1.0 / 4294967296.0)
            z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
            out[i, j] = cent[c, j] + noise * np.float32(z)
