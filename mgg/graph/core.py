"""The graph data model: a CSR of in-edges, three plain arrays validated once.

Row ``v`` of the CSR lists the sources ``u`` of the edges ``u -> v``, so aggregation
``out[v] = sum_u w_uv * x[u]`` reads one row per destination node.
"""

from __future__ import annotations

import numba
import numpy as np

from ..errors import GraphError
from ..memory import csr_bytes, require

INT32_MAX = np.iinfo(np.int32).max
IDS_HINT = "node ids index the CSR's rows, so N = max id + 1: number the nodes 0..N-1"


def index_dtype(num_nodes: int) -> np.dtype:
    """int32 while node ids fit, else int64."""
    return np.dtype(np.int32) if num_nodes <= INT32_MAX else np.dtype(np.int64)


class Graph:
    """CSR of in-edges.

    indptr  int64 [N+1]     row pointer; row v holds the sources of edges u->v
    indices int32|int64 [E] source ids (int64 only when N exceeds int32)
    weights float32 [E]     optional edge weights
    symmetric               True when the graph is known to equal its transpose
                            (weights included); None when unknown
    kind                    what job_graph made of it (GRAPH_KINDS): 'as_is' unless
                            its loops or weights were set for a model
    norm    float32 [N]     optional: the factors of weights that are norm[u] * norm[v]
                            (gcn_norm of an unweighted graph: D^-1/2), which plans keep in
                            place of the weights; kept by permute, by nothing that changes
                            edges
    """

    __slots__ = ("indptr", "indices", "weights", "num_nodes", "symmetric", "kind", "norm")

    def __init__(
        self,
        indptr,
        indices,
        weights=None,
        num_nodes=None,
        *,
        symmetric=None,
        check=True,
        kind="as_is",
        norm=None,
    ):
        indptr = np.asarray(indptr)
        indices = np.asarray(indices)
        if indptr.ndim != 1 or indptr.size < 1:
            raise GraphError(f"indptr must be a non-empty 1-D array, got shape {indptr.shape}")
        if num_nodes is None:
            num_nodes = indptr.size - 1
        num_nodes = int(num_nodes)
        if check:
            _check_csr(indptr, indices, num_nodes)
        self.indptr = indptr.astype(np.int64, copy=False)
        self.indices = indices.astype(index_dtype(num_nodes), copy=False)
        self.num_nodes = num_nodes
        if weights is not None:
            weights = np.asarray(weights)
            if weights.shape != indices.shape:
                raise GraphError(
                    f"weights has shape {weights.shape}, expected {indices.shape} (one per edge)"
                )
            weights = weights.astype(np.float32, copy=False)
            if check and not np.isfinite(weights).all():
                bad = int(np.flatnonzero(~np.isfinite(weights))[0])
                raise GraphError(f"weights[{bad}] is {weights[bad]}: edge weights must be finite")
        self.weights = weights
        self.symmetric = symmetric
        self.kind = kind
        self.norm = norm

    # ---- basic facts -------------------------------------------------------------------
    @property
    def num_edges(self) -> int:
        return int(self.indices.size)

    def in_degrees(self) -> np.ndarray:
        """int64 [N]: number of in-edges of each node (row lengths)."""
        return np.diff(self.indptr)

    def out_degrees(self) -> np.ndarray:
        """int64 [N]: number of out-edges of each node."""
        return np.bincount(self.indices, minlength=self.num_nodes).astype(np.int64)

    def max_in_degree(self) -> int:
        return int(self.in_degrees().max()) if self.num_nodes else 0

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) int arrays [E] in CSR order."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=self.indices.dtype), self.in_degrees())
        return self.indices, dst

    def __repr__(self) -> str:
        w = ", weighted" if self.weights is not None else ""
        s = ", symmetric" if self.symmetric else ""
        return f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}{w}{s})"

    # ---- constructors ------------------------------------------------------------------
    @classmethod
    def from_edges(cls, src, dst, num_nodes=None, weights=None, *, source="from_edges") -> Graph:
        """Build from edge arrays u->v (any order; duplicates and self loops kept). The
        CSR's size is checked against memory first (ResourceError naming ``source``)."""
        src = np.asarray(src)
        dst = np.asarray(dst)
        if src.shape != dst.shape or src.ndim != 1:
            raise GraphError(
                f"src and dst must be 1-D of equal length, got {src.shape} and {dst.shape}"
            )
        for name, a in (("src", src), ("dst", dst)):
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise GraphError(f"{name} must hold integers, got {a.dtype}")
        ids = int(max(src.max(initial=-1), dst.max(initial=-1))) + 1  # N the ids make
        num_nodes = ids if num_nodes is None else int(num_nodes)
        if num_nodes < 0:
            raise GraphError(f"num_nodes must be >= 0, got {num_nodes}")
        for name, a in (("src", src), ("dst", dst)):
            if a.size and (a.min() < 0 or a.max() >= num_nodes):
                bad = int(np.flatnonzero((a < 0) | (a >= num_nodes))[0])
                raise GraphError(f"{name}[{bad}] = {a[bad]} is outside [0, {num_nodes})")
        if weights is not None:
            weights = np.asarray(weights, dtype=np.float32)
            if weights.shape != src.shape:
                raise GraphError(f"weights has shape {weights.shape}, expected {src.shape}")
        require(
            csr_bytes(num_nodes, src.size, weights is not None),
            f"a graph of {num_nodes:,} nodes and {src.size:,} edges (its CSR and the build)",
            source,
            *([IDS_HINT] if num_nodes == ids else []),
        )
        idt = index_dtype(num_nodes)
        indptr, indices, w = counting_sort(
            dst.astype(np.int64, copy=False), src.astype(idt, copy=False), num_nodes, weights
        )
        return cls(indptr, indices, w, num_nodes, check=False)

    @classmethod
    def from_scipy(cls, m, *, source="from_scipy") -> Graph:
        """From a square scipy sparse matrix A with A[v, u] != 0 for each edge u->v
        (explicitly stored zeros are not edges)."""
        if m.shape[0] != m.shape[1]:
            raise GraphError(f"adjacency must be square, got {m.shape}")
        require(
            csr_bytes(m.shape[0], m.nnz, build=False),
            f"a graph of {m.shape[0]:,} nodes and {m.nnz:,} edges (its CSR)",
            source,
        )
        m = m.tocsr()
        if m.nnz and not np.all(m.data):
            m = m.copy()  # not the caller's matrix
            m.eliminate_zeros()
        data = np.asarray(m.data, dtype=np.float32)
        weights = None if np.all(data == 1) else data
        return cls(m.indptr.astype(np.int64), m.indices, weights, m.shape[0])

    def to_scipy(self):
        """scipy.sparse.csr_matrix A [N, N] with A[v, u] = w_uv, so A @ X aggregates."""
        import scipy.sparse as sp

        data = self.weights if self.weights is not None else np.ones(self.num_edges, np.float32)
        return sp.csr_matrix(
            (data, self.indices, self.indptr), shape=(self.num_nodes, self.num_nodes)
        )

    # ---- operations (each returns a new Graph) -----------------------------------------
    def transpose(self) -> Graph:
        """The graph with every edge reversed; rows come out sorted."""
        if self.symmetric:
            return self
        indptr, indices, w = _transpose_csr(self.indptr, self.indices, self.num_nodes, self.weights)
        return Graph(indptr, indices, w, self.num_nodes, check=False)

    def sort_rows(self) -> Graph:
        """Same edges with each row's sources in ascending order."""
        indices = self.indices.copy()
        w = None if self.weights is None else self.weights.copy()
        sort_csr_rows(
            self.indptr, indices, w if w is not None else np.empty(0, np.float32), w is not None
        )
        return Graph(self.indptr, indices, w, self.num_nodes, symmetric=self.symmetric, check=False)

    def permute(self, perm, rank=None) -> Graph:
        """The graph with original node ``perm[i]`` renamed i (perm int [N], a permutation:
        new id -> original id; ``rank``: its inverse, if known); each row's sources come out
        sorted, weights with them (and the norm their factors)."""
        perm = np.asarray(perm, np.int64)
        rank = inverse(perm) if rank is None else rank
        indptr = np.zeros(self.num_nodes + 1, np.int64)
        np.cumsum(self.in_degrees()[perm], out=indptr[1:])
        indices = np.empty_like(self.indices)
        has_w = self.weights is not None
        w_in = self.weights if has_w else np.empty(0, np.float32)
        w = np.empty(self.num_edges if has_w else 0, np.float32)
        _permute_rows(self.indptr, self.indices, w_in, perm, rank, indptr, indices, w, has_w)
        sort_csr_rows(indptr, indices, w, has_w)
        return Graph(
            indptr, indices, w if has_w else None, self.num_nodes,
            symmetric=self.symmetric, check=False,
            norm=None if self.norm is None else self.norm[perm],
        )  # fmt: skip

    def dedup(self) -> Graph:
        """Sort rows and merge duplicate edges (their weights are summed)."""
        s = self.sort_rows()
        has_w = s.weights is not None
        w = s.weights if has_w else np.empty(0, np.float32)
        keep, new_w = dedup_sorted(s.indptr, s.indices, w, has_w)
        return s._filter(keep.astype(bool), new_w if has_w else None)

    def remove_self_loops(self) -> Graph:
        src, dst = self.edges()
        keep = src != dst
        return self._filter(keep)

    def add_self_loops(self, fill: float = 1.0) -> Graph:
        """Add one loop v->v to every node (existing loops stay: call remove first)."""
        n = self.num_nodes
        deg = self.in_degrees()
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(deg + 1, out=indptr[1:])
        loop_pos = indptr[1:] - 1  # the loop is the last entry of each row
        mask = np.ones(indptr[-1], bool)
        mask[loop_pos] = False
        indices = np.empty(indptr[-1], self.indices.dtype)
        indices[mask] = self.indices
        indices[loop_pos] = np.arange(n)
        w = None
        if self.weights is not None:
            w = np.empty(indptr[-1], np.float32)
            w[mask] = self.weights
            w[loop_pos] = fill
        elif fill != 1.0:
            w = np.ones(indptr[-1], np.float32)
            w[loop_pos] = fill
        return Graph(indptr, indices, w, n, symmetric=self.symmetric, check=False)

    def symmetrize(self) -> Graph:
        """Union of the graph and its transpose, without duplicates; weights are dropped."""
        t = self.transpose()
        src = np.concatenate([self.indices, t.indices])
        dst = np.concatenate([self.edges()[1], t.edges()[1]])
        g = Graph.from_edges(src, dst, self.num_nodes).dedup()
        g.symmetric = True
        return g

    def symmetrize_weighted(self) -> tuple[Graph, tuple | None]:
        """(union of the graph and its transpose keeping weights, duplicates merged, marked
        symmetric; the first clash (u, v, w1, w2) of an edge listed with two weights, or
        None). An unweighted graph is ``symmetrize()``'s."""
        if self.weights is None:
            return self.symmetrize(), None
        src, dst = self.edges()
        both = Graph.from_edges(
            np.concatenate([src, dst]),
            np.concatenate([dst, src]),
            self.num_nodes,
            np.concatenate([self.weights, self.weights]),
        ).sort_rows()
        s, d = both.edges()
        w = both.weights
        dup = np.zeros(both.num_edges, bool)
        dup[1:] = (s[1:] == s[:-1]) & (d[1:] == d[:-1])
        clash = np.flatnonzero(dup[1:] & (w[1:] != w[:-1])) + 1
        if clash.size:
            e = int(clash[0])
            return both, (int(s[e]), int(d[e]), float(w[e - 1]), float(w[e]))
        g = both._filter(~dup)
        g.symmetric = True
        return g, None

    def gcn_norm(self) -> Graph:
        """A+I with weights D^-1/2 (A+I) D^-1/2 (Kipf & Welling; D = in-degree of A+I),
        and, for a graph without weights, ``norm`` = D^-1/2 (float32 [N]): then an edge
        u -> v weighs norm[u] · norm[v] in float32, as plans make it.

        Existing self loops are replaced by one loop of weight 1 per node.
        """
        g = self.remove_self_loops().add_self_loops()
        w = g.weights if g.weights is not None else np.ones(g.num_edges, np.float32)
        src, dst = g.edges()
        check_gcn_weights(int((w < 0).sum()), g.num_edges)
        deg = np.bincount(dst, weights=w, minlength=g.num_nodes)
        dinv = np.where(deg > 0, 1.0 / np.sqrt(np.where(deg > 0, deg, 1.0)), 0.0)
        if g.weights is None:  # the weights factor: the float32 products plans make
            norm = dinv.astype(np.float32)
            weights = norm[src] * norm[dst]
        else:
            norm, weights = None, (dinv[src] * w * dinv[dst]).astype(np.float32)
        return Graph(
            g.indptr,
            g.indices,
            weights,
            g.num_nodes,
            symmetric=self.symmetric,
            check=False,
            kind="gcn_norm",
            norm=norm,
        )

    def _filter(self, keep: np.ndarray, weights=None) -> Graph:
        """Keep the edges where ``keep`` [E] is True (weights from ``weights`` if given)."""
        kept = np.zeros(self.num_edges + 1, np.int64)
        np.cumsum(keep, out=kept[1:])
        indptr = kept[self.indptr]
        w = self.weights if weights is None else weights
        return Graph(
            indptr,
            self.indices[keep],
            None if w is None else w[keep],
            self.num_nodes,
            symmetric=self.symmetric,
            check=False,
        )


GRAPH_KINDS = ("gcn_norm", "self_loops", "no_self_loops", "as_is")


def inverse(perm: np.ndarray, dtype=np.int64) -> np.ndarray:
    """dtype [N]: the inverse of the permutation ``perm`` [N] (rank[perm[i]] = i)."""
    rank = np.empty(perm.size, dtype)
    rank[perm] = np.arange(perm.size, dtype=dtype)
    return rank


def check_gcn_weights(negative: int, num_edges: int) -> None:
    """GraphError when ``negative`` of the ``num_edges`` edge weights are < 0: GCN's
    D^-1/2 (A+I) D^-1/2 needs a non-negative A (degrees would be <= 0)."""
    if negative:
        raise GraphError(
            f"{negative:,} of {num_edges:,} edge weights are negative: GCN's normalization "
            "needs weights >= 0 (train a model that takes the graph as given, e.g. "
            "--model sage, or shift the weights)"
        )


def job_graph(graph: Graph, kind: str) -> Graph:
    """The graph a model's layers expect: 'gcn_norm' (self loops, symmetric weights),
    'self_loops' (one per node), 'no_self_loops' or 'as_is'."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"unknown graph kind {kind!r}; choose one of {', '.join(GRAPH_KINDS)}")
    if kind == "gcn_norm":
        return graph.gcn_norm()
    if kind == "as_is":
        return graph
    out = graph.remove_self_loops()
    if kind == "self_loops":
        out = out.add_self_loops()
    out.kind = kind
    return out


# ---- validation -------------------------------------------------------------------------
def _check_csr(indptr: np.ndarray, indices: np.ndarray, num_nodes: int) -> None:
    if not np.issubdtype(indptr.dtype, np.integer):
        raise GraphError(f"indptr must hold integers, got {indptr.dtype}")
    if indices.ndim != 1:
        raise GraphError(f"indices must be 1-D, got shape {indices.shape}")
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
        raise GraphError(f"indices must hold integers, got {indices.dtype}")
    if num_nodes < 0:
        raise GraphError(f"num_nodes must be >= 0, got {num_nodes}")
    if indptr.size != num_nodes + 1:
        raise GraphError(
            f"indptr has {indptr.size} entries, expected num_nodes+1 = {num_nodes + 1}"
        )
    if indptr[0] != 0:
        raise GraphError(f"indptr[0] is {indptr[0]}, expected 0")
    d = np.diff(indptr)
    if d.size and d.min() < 0:
        bad = int(np.argmax(d < 0))
        raise GraphError(
            f"indptr is not monotone: indptr[{bad + 1}] = {indptr[bad + 1]} < "
            f"indptr[{bad}] = {indptr[bad]}"
        )
    if indptr[-1] != indices.size:
        raise GraphError(f"indptr[-1] is {indptr[-1]} but there are {indices.size} indices")
    if indices.size:
        lo, hi = indices.min(), indices.max()
        if lo < 0 or hi >= num_nodes:
            bad = int(np.flatnonzero((indices < 0) | (indices >= num_nodes))[0])
            raise GraphError(f"indices[{bad}] = {indices[bad]} is outside [0, {num_nodes})")


# ---- numba kernels ----------------------------------------------------------------------
def counting_sort(keys, values, n, weights):
    """Group values by key: (indptr [n+1], values sorted stably by key, weights)."""
    counts = np.bincount(keys, minlength=n) if keys.size else np.zeros(n, np.int64)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    out = np.empty_like(values)
    has_w = weights is not None
    w_in = weights if has_w else np.empty(0, np.float32)
    w_out = np.empty(values.size if has_w else 0, np.float32)
    _scatter(keys, values, w_in, indptr[:-1].copy(), out, w_out, has_w)
    return indptr, out, (w_out if has_w else None)


@numba.njit(cache=True, nogil=True)
def _scatter(keys, values, w_in, pos, out, w_out, has_w):
    for i in range(keys.size):
        k = keys[i]
        p = pos[k]
        out[p] = values[i]
        if has_w:
            w_out[p] = w_in[i]
        pos[k] = p + 1


def _transpose_csr(indptr, indices, n, weights):
    counts = np.bincount(indices, minlength=n) if indices.size else np.zeros(n, np.int64)
    t_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=t_indptr[1:])
    t_indices = np.empty(indices.size, indices.dtype)
    has_w = weights is not None
    w_in = weights if has_w else np.empty(0, np.float32)
    w_out = np.empty(indices.size if has_w else 0, np.float32)
    _transpose_fill(indptr, indices, w_in, t_indptr[:-1].copy(), t_indices, w_out, has_w)
    return t_indptr, t_indices, (w_out if has_w else None)


@numba.njit(cache=True, nogil=True)
def _transpose_fill(indptr, indices, w_in, pos, t_indices, w_out, has_w):
    for v in range(indptr.size - 1):
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            p = pos[u]
            t_indices[p] = v
            if has_w:
                w_out[p] = w_in[e]
            pos[u] = p + 1


@numba.njit(cache=True, parallel=True)
def _permute_rows(indptr, indices, w_in, perm, rank, new_ptr, new_indices, w_out, has_w):
    for v in numba.prange(perm.size):
        a, b, o = indptr[perm[v]], indptr[perm[v] + 1], new_ptr[v]
        for e in range(a, b):
            new_indices[o + e - a] = rank[indices[e]]
            if has_w:
                w_out[o + e - a] = w_in[e]


@numba.njit(cache=True, parallel=True)
def sort_csr_rows(indptr, indices, weights, has_w):
    for v in numba.prange(indptr.size - 1):
        a, b = indptr[v], indptr[v + 1]
        if b - a < 2:
            continue
        order = np.argsort(indices[a:b], kind="mergesort")
        indices[a:b] = indices[a:b][order]
        if has_w:
            weights[a:b] = weights[a:b][order]


@numba.njit(cache=True)
def dedup_sorted(indptr, indices, weights, has_w):
    keep = np.zeros(indices.size, np.int64)
    new_w = weights.copy()
    for v in range(indptr.size - 1):
        last = -1
        for e in range(indptr[v], indptr[v + 1]):
            if e > indptr[v] and indices[e] == indices[e - 1]:
                if has_w:
                    new_w[last] += weights[e]
            else:
                keep[e] = 1
                last = e
    return keep, new_w
