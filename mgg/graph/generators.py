"""Synthetic graphs: Graph500 R-MAT, a planted partition, and stand-ins for MGG's datasets.

Every generator is deterministic for a given seed, whatever the number of threads: random
numbers come from a counter-based stream (SplitMix64 at position ``edge * words + word``),
so any edge can be drawn by any thread. Generated edges go through one CSR builder that
drops self loops, merges duplicates and sorts every row.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

import numba
import numpy as np

from ..errors import InputError
from ..hashing import GOLDEN, mix64
from ..memory import csr_bytes, require
from .core import Graph, index_dtype, inverse
from .csr import build_csr, build_csr_emptying
from .dataset import Dataset, make_split

MAX_NODES = 2**62  # nodes or edges a generator may be asked for: an int64 id holds them

__all__ = [
    "build_csr",
    "rmat",
    "rmat_n",
    "planted_partition",
    "StandinSpec",
    "STANDINS",
    "standin",
    "standin_edge_cap",
    "standin_size",
]

_LO32 = np.uint64(0xFFFFFFFF)
_CHUNK = 1 << 22
_MAX_OVERSAMPLE = 64.0
CENTROID_NORM = 2.0
"""Norm of the class centroids of the labelled generators (noise is N(0, 1) per entry)."""
STANDIN_HOMOPHILY = 0.6
"""Fraction of a stand-in's generated edges rewired to stay inside the source's class."""
STANDIN_MAX_DENSITY = 0.05
"""A stand-in's edges are capped at this fraction of the n*(n-1) possible ones."""


# ---- random numbers ---------------------------------------------------------------------
def _stream_key(seed: int, salt: int) -> np.uint64:
    """A 64-bit key per (seed, purpose); streams with different keys are independent."""
    s = np.random.SeedSequence([int(seed) & (2**64 - 1), salt])
    return np.uint64(s.generate_state(1, np.uint64)[0])


def threshold_u32(p: float) -> np.uint64:
    return np.uint64(min(max(int(p * 2.0**32), 0), 2**32))


# ---- R-MAT edge generation ----------------------------------------------------------------
@numba.njit(inline="always")
def _words_per_edge(scale):
    return (scale + 1) // 2 + 1


@numba.njit(parallel=True, cache=True)
def _rmat_fill(e0, src, dst, scale, ta, tab, tabc, key, perm, n):
    words = _words_per_edge(scale)
    for t in numba.prange(src.size):
        base = np.uint64(e0 + t) * np.uint64(words)
        u = 0
        v = 0
        r = np.uint64(0)
        for lvl in range(scale):
            if lvl % 2 == 0:
                r = mix64(key + (base + np.uint64(lvl // 2 + 1)) * GOLDEN)
                x = r & _LO32
            else:
                x = r >> np.uint64(32)
            bu = np.int64(x >= tab)
            bv = np.int64(x >= ta) - bu + np.int64(x >= tabc)
            u = (u << 1) | bu
            v = (v << 1) | bv
        u = perm[u]
        v = perm[v]
        if u >= n:
            u -= n
        if v >= n:
            v -= n
        src[t] = u
        dst[t] = v


@numba.njit(parallel=True, cache=True)
def _rewire_fill(e0, src, dst, scale, key, threshold, order, pos, num_classes):
    words = _words_per_edge(scale)
    n = order.size
    for t in numba.prange(src.size):
        r = mix64(key + np.uint64(e0 + t) * np.uint64(words) * GOLDEN)
        if (r & _LO32) < threshold:
            pv = pos[dst[t]]
            j = pv - pv % num_classes + pos[src[t]] % num_classes
            if j >= n:
                j -= num_classes
            if j >= 0:
                dst[t] = order[j]


@dataclass(frozen=True)
class _Rewire:
    """Homophilous rewiring: nodes are grouped in blocks of C along ``order``; the node at
    position i of ``order`` has class i % C; a rewired edge u->v goes to v's block-mate with
    u's class instead."""

    prob: float
    order: np.ndarray
    pos: np.ndarray
    num_classes: int

    @classmethod
    def make(cls, n: int, num_classes: int, prob: float, seed: int) -> _Rewire:
        rng = np.random.default_rng([seed, 0x5EED, 3])
        order = rng.permutation(n).astype(index_dtype(n))
        return cls(prob, order, inverse(order, order.dtype), num_classes)

    def labels(self) -> np.ndarray:
        """int64 [N]: the class of every node."""
        return (self.pos % self.num_classes).astype(np.int64)


def _rmat_edges(num_draws, scale, n, a, b, c, seed, permute, rewire=None, progress=None):
    """(src, dst) [num_draws] of the seeded R-MAT stream mapped into [0, n)."""
    _check_abc(a, b, c)
    dt = index_dtype(max(n, 2**scale))
    if permute:
        perm = np.random.default_rng([seed, 0x5EED, 1]).permutation(2**scale).astype(dt)
    else:
        perm = np.arange(2**scale, dtype=dt)
    key = _stream_key(seed, 2)
    ta, tab, tabc = threshold_u32(a), threshold_u32(a + b), threshold_u32(a + b + c)
    src = np.empty(num_draws, index_dtype(n))
    dst = np.empty(num_draws, index_dtype(n))
    from ..progress import progress as bar

    with bar(total=num_draws, desc="rmat", enable=progress, unit="edge") as pb:
        for e0 in range(0, num_draws, _CHUNK):
            e1 = min(e0 + _CHUNK, num_draws)
            _rmat_fill(e0, src[e0:e1], dst[e0:e1], scale, ta, tab, tabc, key, perm, n)
            if rewire is not None and rewire.num_classes > 1:
                _rewire_fill(
                    e0,
                    src[e0:e1],
                    dst[e0:e1],
                    scale,
                    key,
                    threshold_u32(rewire.prob),
                    rewire.order,
                    rewire.pos,
                    rewire.num_classes,
                )
            pb.update(e1 - e0)
    return src, dst


def _check_abc(a, b, c):
    if min(a, b, c) < 0 or a + b + c > 1 + 1e-12:
        raise ValueError(f"R-MAT needs a, b, c >= 0 with a+b+c <= 1, got {a}, {b}, {c}")


# ---- CSR building: mgg.graph.csr ---------------------------------------------------------
def _require(source: str, n: int, entries: float, features: int = 0) -> None:
    """ResourceError naming the spec when the graph (and features [n, F]) cannot fit:
    the drawn edges and the CSR build take about 40 bytes per entry."""
    require(
        csr_bytes(n, 0) + 40 * entries + 4 * n * features,
        f"{n:,} nodes and about {int(entries):,} edges"
        + (f" with {features} features" if features else ""),
        source,
        "choose a smaller scale",
    )


def _graph(indptr, indices, n, symmetric) -> Graph:
    return Graph(indptr, indices, None, n, symmetric=True if symmetric else None, check=False)


# ---- R-MAT --------------------------------------------------------------------------------
def rmat(
    scale: int,
    edge_factor: int = 16,
    *,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    seed: int = 0,
    symmetric: bool = True,
    permute: bool = True,
    progress: bool | None = None,
) -> Graph:
    """Graph500 R-MAT graph with N = 2**scale nodes from M = edge_factor * N drawn edges.

    Each edge picks one quadrant per level with probabilities (a, b, c, 1-a-b-c); vertex
    labels are shuffled by a seeded permutation (``permute``). Self loops are dropped and
    duplicates merged, so the result has fewer than M (or 2M when ``symmetric``) entries.
    ``symmetric`` adds every reverse edge (``graph.symmetric`` is True); otherwise the
    graph is directed (``graph.symmetric`` is None). indices are int32 while N fits.
    """
    if scale < 0 or edge_factor < 0:
        raise InputError(f"scale and edge_factor must be >= 0, got {scale}, {edge_factor}")
    n = 2**scale
    _require(f"rmat:scale={scale},ef={edge_factor}", n, edge_factor * n * (2 if symmetric else 1))
    edges = list(_rmat_edges(edge_factor * n, scale, n, a, b, c, seed, permute, progress=progress))
    indptr, indices, _ = build_csr_emptying(edges, n, symmetric)
    return _graph(indptr, indices, n, symmetric)


def rmat_n(
    num_nodes: int,
    num_edges: int,
    *,
    a: float = 0.57,
    b: float = 0.19,
    c: float = 0.19,
    seed: int = 0,
    symmetric: bool = True,
    progress: bool | None = None,
) -> Graph:
    """R-MAT graph with any node count and about ``num_edges`` distinct entries.

    Edges are drawn over the next power of two 2**k >= num_nodes; after the random vertex
    permutation an id p >= num_nodes becomes p - num_nodes, so each node is one or two R-MAT
    vertices (folding keeps every node and every drawn edge). The stream of drawn edges is
    fixed by the seed; the graph is its shortest prefix that yields ``num_edges`` distinct
    entries (CSR entries: with ``symmetric`` an undirected edge counts twice), so the count
    is exact (+1 when symmetric and odd). The number of draws is sized with the closed-form
    expected number of distinct R-MAT pairs and redrawn larger when short. A request R-MAT
    cannot reach with 64x oversampling, or more than n*(n-1) entries, gives fewer edges and
    a warning.
    """
    return _rmat_n(num_nodes, num_edges, a, b, c, seed, symmetric, progress, None)


def _rmat_n(num_nodes, num_edges, a, b, c, seed, symmetric, progress, rewire) -> Graph:
    n = int(num_nodes)
    if n < 1 or num_edges < 0:
        raise ValueError(f"need num_nodes >= 1 and num_edges >= 0, got {num_nodes}, {num_edges}")
    target = int(num_edges)
    if target > n * (n - 1):
        warnings.warn(
            f"rmat_n: {target:,} entries requested but {n:,} nodes have only {n * (n - 1):,} pairs",
            stacklevel=3,
        )
        target = n * (n - 1)
    if target == 0:
        return _graph(np.zeros(n + 1, np.int64), np.empty(0, index_dtype(n)), n, symmetric)
    k = max(1, math.ceil(math.log2(n)))
    per_draw = 2 if symmetric else 1
    cap = int(max(_MAX_OVERSAMPLE * target / per_draw, 1024))
    draws = min(cap, int(_draws_for(target, k, a, b, c, symmetric) * 1.08) + 64)
    while True:
        edges = list(_rmat_edges(draws, k, n, a, b, c, seed, True, rewire, progress))
        indptr, indices, distinct = build_csr_emptying(edges, n, symmetric, target)
        if distinct >= target:
            break
        if draws >= cap:
            warnings.warn(
                f"rmat_n: {distinct:,} of {target:,} entries reached with "
                f"{draws:,} draws ({n:,} nodes)",
                stacklevel=3,
            )
            break
        ratio = distinct / max(_expected_entries(k, a, b, c, draws, symmetric), 1.0)
        need = _draws_for(target / max(ratio, 1e-3), k, a, b, c, symmetric)
        draws = min(cap, max(int(need * 1.05), int(draws * 1.1)) + 64)
    return _graph(indptr, indices, n, symmetric)


@functools.lru_cache(maxsize=8)
def _compositions(k: int):
    """Level-quadrant counts (na, nb, nc, nd) summing to k and their multiplicities."""
    na, nb, nc = np.meshgrid(np.arange(k + 1), np.arange(k + 1), np.arange(k + 1), indexing="ij")
    na, nb, nc = na.ravel(), nb.ravel(), nc.ravel()
    ok = na + nb + nc <= k
    na, nb, nc = na[ok], nb[ok], nc[ok]
    nd = k - na - nb - nc
    lg = np.vectorize(math.lgamma)
    logmult = math.lgamma(k + 1) - lg(na + 1) - lg(nb + 1) - lg(nc + 1) - lg(nd + 1)
    return na, nb, nc, nd, np.exp(logmult)


def _expected_entries(k, a, b, c, draws, symmetric) -> float:
    """Expected distinct non-loop entries after ``draws`` R-MAT draws over 2**k vertices."""
    d = max(1.0 - a - b - c, 0.0)
    na, nb, nc, nd, mult = _compositions(k)
    p = _power(a, na) * _power(b, nb) * _power(c, nc) * _power(d, nd)
    if symmetric:
        p = p + _power(a, na) * _power(b, nc) * _power(c, nb) * _power(d, nd)
    nonloop = (nb + nc) > 0
    return float(np.sum(mult[nonloop] * -np.expm1(-draws * p[nonloop])))


def _power(base: float, count: np.ndarray) -> np.ndarray:
    return np.where(count > 0, float(base) ** count.astype(np.float64), 1.0)


def _draws_for(target, k, a, b, c, symmetric) -> float:
    """Draws after which the expected distinct entries reach ``target`` (bisection)."""
    lo = target / (2 if symmetric else 1)
    hi = lo
    for _ in range(60):
        if _expected_entries(k, a, b, c, hi, symmetric) >= target:
            break
        lo, hi = hi, hi * 2
    else:
        return hi
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if _expected_entries(k, a, b, c, mid, symmetric) >= target:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1.002:
            break
    return hi


# ---- planted partition --------------------------------------------------------------------
def _class_features(y, num_classes, dim, noise, seed) -> np.ndarray:
    """float32 [N, dim]: class centroid (random direction, norm CENTROID_NORM) + noise."""
    rng = np.random.default_rng([seed, 0xFEA7, 5])
    cent = rng.standard_normal((num_classes, dim))
    cent *= CENTROID_NORM / np.maximum(np.linalg.norm(cent, axis=1, keepdims=True), 1e-12)
    cent = cent.astype(np.float32)
    x = rng.standard_normal((y.size, dim), dtype=np.float32)
    step = max(1, (1 << 22) // max(dim, 1))
    for lo in range(0, y.size, step):
        part = x[lo : lo + step]
        if noise != 1.0:
            part *= np.float32(noise)
        part += cent[y[lo : lo + step]]
    return x


def planted_partition(
    num_nodes: int,
    num_classes: int,
    *,
    avg_degree: float = 10,
    p_in: float = 0.8,
    num_features: int = 32,
    feature_noise: float = 1.0,
    seed: int = 0,
) -> Dataset:
    """Degree-corrected stochastic block model with learnable labels.

    Classes are balanced (sizes differ by at most one). Node weights follow a power law
    (exponent 2.5, capped so no expected degree exceeds N/4); each undirected edge picks
    u in proportion to its weight, then v in proportion to weight inside u's class with
    probability ``p_in``, else among the other classes. The graph is undirected, without
    self loops or duplicates, with N*avg_degree CSR entries (the shortest prefix of the
    seeded edge stream that has that many; fewer, with a warning, when classes are too
    small to hold them). x float32 [N, num_features] = centroid[y] + N(0,
    feature_noise^2) with centroids of norm 2 (None when num_features is 0); y int64 [N];
    masks from ``make_split`` (20 train / 30 val per class, the rest test).
    """
    n, nc = int(num_nodes), int(num_classes)
    if n < 1 or nc < 1 or nc > n:
        raise InputError(f"need 1 <= num_classes <= num_nodes, got {num_classes}, {num_nodes}")
    if not (0 <= avg_degree < math.inf):
        raise InputError(f"avg_degree must be a finite number >= 0, got {avg_degree}")
    _require(f"planted:nodes={n},classes={nc}", n, n * avg_degree, int(num_features))
    if not 0.0 <= p_in <= 1.0:
        raise ValueError(f"p_in must lie in [0, 1], got {p_in}")
    rng = np.random.default_rng([seed, 0x9A27, 4])
    y = rng.permutation(np.arange(n) % nc).astype(np.int64)
    theta = (1.0 - rng.random(n)) ** (-1.0 / 1.5)
    theta = np.minimum(theta, max(theta.mean() * n / 4.0 / max(avg_degree, 1e-9), 1.0))
    order = np.argsort(y, kind="stable").astype(index_dtype(n))
    cum = np.cumsum(theta[order])
    starts = np.zeros(nc + 1, np.int64)
    np.cumsum(np.bincount(y, minlength=nc), out=starts[1:])
    mass_lo = np.concatenate([[0.0], cum])[starts[:-1]]
    mass = np.concatenate([[0.0], cum])[starts[1:]] - mass_lo
    target = min(int(round(n * avg_degree)), n * (n - 1))
    dt = index_dtype(n)
    key = _stream_key(seed, 6)
    t_in = threshold_u32(p_in if nc > 1 else 1.0)
    draws, cap = int(target / 2 * 1.1) + 16, int(_MAX_OVERSAMPLE * target / 2) + 1024
    while True:
        edges = [np.empty(draws, dt), np.empty(draws, dt)]
        _planted_fill(*edges, key, t_in, cum, order, y, starts, mass_lo, mass, 0)
        indptr, indices, distinct = build_csr_emptying(edges, n, True, target)
        if distinct >= target:
            break
        if draws >= cap:
            warnings.warn(
                f"planted_partition: {distinct:,} of {target:,} entries reached", stacklevel=2
            )
            break
        draws = min(cap, int(draws * max(1.2, 1.05 * target / max(distinct, 1))))
    graph = _graph(indptr, indices, n, True)
    x = _class_features(y, nc, num_features, feature_noise, seed) if num_features else None
    train, val, test = make_split(y, nc, seed=seed)
    params = dict(
        num_nodes=n,
        num_classes=nc,
        avg_degree=avg_degree,
        p_in=p_in,
        num_features=num_features,
        feature_noise=feature_noise,
        seed=seed,
    )
    return Dataset(
        f"planted-n{n}-c{nc}",
        graph,
        x,
        y,
        train,
        val,
        test,
        nc,
        meta={"generator": "planted_partition", "params": params},
    )


@numba.njit(parallel=True, cache=True)
def _planted_fill(src, dst, key, t_in, cum, order, y, starts, mass_lo, mass, e0):
    """Draws e0.. of the stream into (src, dst)."""
    n = cum.size
    total = cum[n - 1]
    for t in numba.prange(src.size):
        base = np.uint64(e0 + t) * np.uint64(3)
        r0 = uniform_of(mix64(key + base * GOLDEN))
        r1 = mix64(key + (base + np.uint64(1)) * GOLDEN)
        r2 = uniform_of(mix64(key + (base + np.uint64(2)) * GOLDEN))
        u = order[min(np.searchsorted(cum, r0 * total, side="right"), n - 1)]
        c = y[u]
        if (r1 & _LO32) < t_in:
            lo, hi = starts[c], starts[c + 1] - 1
            p = mass_lo[c] + r2 * mass[c]
        else:
            lo, hi = 0, n - 1
            p = r2 * (total - mass[c])
            if p >= mass_lo[c]:
                p += mass[c]
        j = np.searchsorted(cum, p, side="right")
        src[t] = u
        dst[t] = order[min(max(j, lo), hi)]


@numba.njit(inline="always")
def uniform_of(r):
    """float64 in [0, 1) from the top 53 bits of r."""
    return np.float64(r >> np.uint64(11)) * (1.0 / 9007199254740992.0)


# ---- stand-ins ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StandinSpec:
    """Size of one of MGG's datasets (Table 3): edges count CSR entries."""

    nodes: int
    edges: int
    features: int
    classes: int
    directed: bool
    source: str


STANDINS: dict[str, StandinSpec] = {
    "reddit": StandinSpec(232_965, 114_615_892, 602, 41, False, "Reddit"),
    "enwiki": StandinSpec(4_203_323, 202_623_226, 96, 128, True, "enwiki-2013"),
    "products": StandinSpec(2_449_029, 61_859_140, 100, 64, False, "ogbn-products"),
    "proteins": StandinSpec(132_534, 39_561_252, 128, 112, False, "ogbn-proteins"),
    "orkut": StandinSpec(3_072_441, 117_185_083, 128, 32, False, "com-orkut"),
}


def standin(name: str, scale: float = 1.0, seed: int = 0, *, with_features: bool = True) -> Dataset:
    """A synthetic graph the size of one of MGG's datasets, scaled by ``scale``.

    nodes = max(2, round(N*scale)), edges = round(E*scale) CSR entries (average degree
    kept), at most ``standin_edge_cap(nodes)`` (5% of all pairs) for tiny scales where the
    degree would approach the node count. Structure: ``rmat_n`` (undirected, except
    enwiki) in which a fraction STANDIN_HOMOPHILY of the drawn edges u->v are redirected
    to the node of u's class in v's block (nodes are grouped at random into blocks of
    ``classes`` nodes, one per class), so edges mostly stay inside a class while degrees
    stay skewed. Labels y int64 [nodes] are balanced over [0, classes); x float32
    [nodes, dim] = centroid[y] + N(0, 1) (centroids of norm 2); masks from ``make_split``.
    The graph does not depend on ``with_features``; without it x, y and masks are None.
    """
    spec = _standin_spec(name)
    if not 0 < scale < math.inf:
        raise InputError(f"{name}:scale={scale}: the scale must be a finite number > 0")
    n, edges, wanted = standin_size(spec, scale)  # past int64 ids: refused first
    require(
        csr_bytes(spec.nodes * scale, 0, build=False),
        f"{spec.nodes * scale:,.0f} nodes",
        f"{name}:scale={scale}",
        "choose a smaller scale",
    )
    feats = spec.features if with_features else 0
    _require(f"{name}:scale={scale}", n, edges, feats)
    rewire = _Rewire.make(n, spec.classes, STANDIN_HOMOPHILY, seed)
    graph = _rmat_n(n, edges, 0.57, 0.19, 0.19, seed, not spec.directed, None, rewire)
    meta = {
        "generator": "standin",
        "standin_of": name,
        "source": spec.source,
        "paper": {
            "nodes": spec.nodes,
            "edges": spec.edges,
            "features": spec.features,
            "classes": spec.classes,
        },
        "params": {
            "scale": scale,
            "seed": seed,
            "nodes": n,
            "edges": edges,
            "edges_capped": edges < wanted,
            "rmat": {"a": 0.57, "b": 0.19, "c": 0.19},
            "homophily_rewire": STANDIN_HOMOPHILY,
            "directed": spec.directed,
            "with_features": with_features,
        },
    }
    if not with_features:
        return Dataset(name, graph, num_classes=spec.classes, meta=meta)
    y = rewire.labels()
    x = _class_features(y, spec.classes, spec.features, 1.0, seed)
    train, val, test = make_split(y, spec.classes, seed=seed)
    return Dataset(name, graph, x, y, train, val, test, spec.classes, meta=meta)


def standin_size(spec: StandinSpec, scale: float) -> tuple[int, int, int]:
    """(nodes, CSR entries, the entries before the cap) of a stand-in at ``scale``;
    InputError past MAX_NODES nodes or edges (no int64 id holds them: refused before any
    arithmetic on them overflows)."""
    if not spec.edges * scale < MAX_NODES:
        raise InputError(
            f"scale {scale:g}: a stand-in of {spec.nodes * scale:.3g} nodes and "
            f"{spec.edges * scale:.3g} edges; mgg holds at most {MAX_NODES:,} (int64 ids)"
        )
    n = max(2, round(spec.nodes * scale))
    wanted = round(spec.edges * scale)
    return n, min(wanted, standin_edge_cap(n)), wanted


def standin_edge_cap(n: int) -> int:
    """Most CSR entries a stand-in with n nodes gets: STANDIN_MAX_DENSITY of the n*(n-1)
    possible ones, but never fewer than 2*(n-1)."""
    return max(int(STANDIN_MAX_DENSITY * n * (n - 1)), 2 * (n - 1))


def _standin_spec(name: str) -> StandinSpec:
    try:
        return STANDINS[name]
    except KeyError:
        raise ValueError(
            f"unknown stand-in {name!r}; choose one of {', '.join(STANDINS)}"
        ) from None
