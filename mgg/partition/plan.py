"""PartitionPlan: everything one rank needs to aggregate its nodes, built once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import numba
import numpy as np

from ..graph.core import GRAPH_KINDS, Graph, job_graph
from ..knobs import DEFAULTS, check_value
from ..progress import progress
from .edge_split import RankEdges, column_slice, edge_split
from .neighbor_split import neighbor_split
from .node_split import node_split


@dataclass(frozen=True, eq=False)
class PartitionPlan:
    """One rank's share of the graph (n = ub - lb local nodes, P ranks).

    bounds          int64 [P+1]  node ranges of all ranks
    local_*         local CSR: in-edges whose source lives on this rank (row u - lb)
    remote_*        remote CSR: in-edges from peers; remote_slot indexes the halo
    halo_pe/row     int32 [H]    the distinct remote rows, in order of first use
    lnp_ptr/node    LNP: local neighbor partitions of at most ps entries
    rnp_ptr/node    RNP: remote neighbor partitions
    norm, halo_norm float32 [n], [H] or None: where the weights factor (Graph.norm:
                    GCN's D^-1/2), the factors of this rank's rows and of its halo's, in
                    place of the weights: a local edge u -> v weighs norm[u] · norm[v], a
                    remote one halo_norm[slot] · norm[v] (what a GPU computes; the CPU
                    kernels read the weights gcn_weights makes)
    transposed      the plan of the transposed graph over the same bounds (backward)
    """

    rank: int
    bounds: np.ndarray
    ps: int
    num_edges: int
    local_indptr: np.ndarray
    local_indices: np.ndarray
    local_weights: np.ndarray | None
    remote_indptr: np.ndarray
    remote_slot: np.ndarray
    remote_weights: np.ndarray | None
    halo_pe: np.ndarray
    halo_row: np.ndarray
    lnp_ptr: np.ndarray
    lnp_node: np.ndarray
    rnp_ptr: np.ndarray
    rnp_node: np.ndarray
    symmetric: bool = False
    norm: np.ndarray | None = None
    halo_norm: np.ndarray | None = None
    _transposed: PartitionPlan | None = field(default=None, repr=False)

    # ---- sizes ---------------------------------------------------------------------------
    @property
    def num_ranks(self) -> int:
        return self.bounds.size - 1

    @property
    def num_nodes(self) -> int:
        return int(self.bounds[-1])

    @property
    def lb(self) -> int:
        return int(self.bounds[self.rank])

    @property
    def ub(self) -> int:
        return int(self.bounds[self.rank + 1])

    @property
    def num_local_nodes(self) -> int:
        return self.ub - self.lb

    @property
    def max_local_nodes(self) -> int:
        """Rows of the largest rank: the symmetric allocation size."""
        return int(np.diff(self.bounds).max())

    @property
    def num_local_edges(self) -> int:
        return int(self.local_indices.size)

    @property
    def num_remote_edges(self) -> int:
        return int(self.remote_slot.size)

    @property
    def num_halo(self) -> int:
        return int(self.halo_pe.size)

    @property
    def has_weights(self) -> bool:
        """Whether op 'gcn' has weights here: stored, or their factors (norm)."""
        return self.local_weights is not None or self.norm is not None

    def gcn_weights(self, which: str) -> np.ndarray | None:
        """float32 [E]: op 'gcn''s weights of the 'local' or 'remote' edges as the CPU
        kernels read them, stored, or made from the factors once (a weight streamed per
        edge beats a factor gathered per edge: 1.3-1.45x at D = 16 on the CPU, where rows
        are one cache line); None without weights."""
        if self.norm is None:
            return self.local_weights if which == "local" else self.remote_weights
        if "_made_weights" not in self.__dict__:
            ld, rd = self.edge_dst()
            local = self.norm[self.local_indices] * self.norm[ld]
            self.__dict__["_made_weights"] = local, self.halo_norm[self.remote_slot] * self.norm[rd]
        return self.__dict__["_made_weights"][which == "remote"]

    def edge_weights(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(local [El], remote [Er]) float32: every edge's weight (gcn_weights); None
        without weights."""
        if not self.has_weights:
            return None
        return self.gcn_weights("local"), self.gcn_weights("remote")

    @property
    def remote_pe(self) -> np.ndarray:
        """int32 [Er] peer holding each remote source."""
        return self.halo_pe[self.remote_slot]

    @property
    def remote_row(self) -> np.ndarray:
        """int32 [Er] row of each remote source on its peer (u - lb_pe)."""
        return self.halo_row[self.remote_slot]

    @property
    def halo_nodes(self) -> np.ndarray:
        """int64 [H] global id of each halo row (the node a halo slot holds)."""
        return self.bounds[self.halo_pe].astype(np.int64) + self.halo_row

    @property
    def widest_row(self) -> int:
        """Most local, or most remote, neighbors of one node: the ps that makes each
        node's neighbors one partition."""
        return int(
            max(
                np.diff(self.local_indptr).max(initial=0),
                np.diff(self.remote_indptr).max(initial=0),
            )
        )

    @property
    def transposed(self) -> PartitionPlan:
        if self.symmetric:
            return self
        if self._transposed is None:
            raise ValueError("this plan was built with transposed=False")
        return self._transposed

    def edge_dst(self) -> tuple[np.ndarray, np.ndarray]:
        """(local, remote): int64 [El], [Er] the local row of each edge's destination."""
        n = np.arange(self.num_local_nodes, dtype=np.int64)
        return (
            np.repeat(n, np.diff(self.local_indptr)),
            np.repeat(n, np.diff(self.remote_indptr)),
        )

    def edge_slots(self) -> np.ndarray:
        """int64 [El + Er]: the row each edge reads, local edges then remote, of this rank's
        rows followed by its halo ([n + H]: a local source u, a remote one n + its slot)."""
        n = self.num_local_nodes
        return np.concatenate(
            [self.local_indices.astype(np.int64), n + self.remote_slot.astype(np.int64)]
        )

    def global_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(local src, local dst, remote src, remote dst): int64 [El], [El], [Er], [Er]
        global node ids of each edge src -> dst, in the plan's edge order."""
        ld, rd = self.edge_dst()
        ls = self.local_indices.astype(np.int64) + self.lb
        rs = self.halo_nodes[self.remote_slot]
        return ls, ld + self.lb, rs, rd + self.lb

    def edge_keys(self, transposed: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(local, remote): int64 [El], [Er] the key dst·N + src of each edge, global ids,
        in the plan's edge order. ``transposed``: this is a plan of the transposed graph,
        whose edge u -> v is the forward edge v -> u (so the keys match the forward's)."""
        n = self.num_nodes
        ls, ld, rs, rd = self.global_edges()
        if transposed:
            return ls * n + ld, rs * n + rd
        return ld * n + ls, rd * n + rs

    def in_degrees(self) -> np.ndarray:
        """int64 [n]: in-degree of each local node (local plus remote entries); made once
        (a plan is immutable: every aggregation of a step reads it)."""
        if "_in_degrees" not in self.__dict__:
            deg = np.diff(self.local_indptr) + np.diff(self.remote_indptr)
            self.__dict__["_in_degrees"] = deg.astype(np.int64, copy=False)
            self.__dict__["_isolated"] = int(np.count_nonzero(deg == 0))
        return self.__dict__["_in_degrees"]

    @property
    def num_isolated(self) -> int:
        """Local nodes without an in-edge."""
        self.in_degrees()
        return self.__dict__["_isolated"]

    # ---- derived plans -------------------------------------------------------------------
    def with_ps(self, ps: int) -> PartitionPlan:
        """The same plan cut into neighbor partitions of size ``ps`` (CSRs are shared)."""
        if ps == self.ps:
            return self
        lnp_ptr, lnp_node = neighbor_split(self.local_indptr, ps)
        rnp_ptr, rnp_node = neighbor_split(self.remote_indptr, ps)
        t = None
        if not self.symmetric and self._transposed is not None:
            t = self._transposed.with_ps(ps)
        return replace(
            self,
            ps=int(ps),
            lnp_ptr=_frozen(lnp_ptr),
            lnp_node=_frozen(lnp_node),
            rnp_ptr=_frozen(rnp_ptr),
            rnp_node=_frozen(rnp_node),
            _transposed=t,
        )

    def restricted(self, rows) -> PartitionPlan:
        """This plan with the in-edges of ``rows`` only (local row ids int [L], or a bool
        mask [n]): the other rows keep no edge, the halo only the rows the kept edges read
        (in order of first use), the same neighbor partitions for the kept rows. Its
        transposed plan is this plan's: an aggregation's backward pass over it, whose
        output gradient is zero on the other rows, is the full transposed aggregation of
        that gradient (the other rows add zeros)."""
        n = self.num_local_nodes
        keep = np.zeros(n, bool)
        keep[np.asarray(rows)] = True

        def cut(indptr, *arrays):
            deg = np.diff(indptr)
            ptr = np.zeros(n + 1, indptr.dtype)
            np.cumsum(np.where(keep, deg, 0), out=ptr[1:])
            mask = np.repeat(keep, deg)
            return _frozen(ptr), [None if a is None else _frozen(a[mask]) for a in arrays]

        lptr, (lidx, lw) = cut(self.local_indptr, self.local_indices, self.local_weights)
        rptr, (slot, rw) = cut(self.remote_indptr, self.remote_slot, self.remote_weights)
        used, first = np.unique(slot, return_index=True)
        old = used[np.argsort(first, kind="stable")]  # the slots read, in order of first use
        new = np.zeros(self.num_halo, self.remote_slot.dtype)
        new[old] = np.arange(old.size, dtype=new.dtype)
        lnp_ptr, lnp_node = neighbor_split(lptr, self.ps)
        rnp_ptr, rnp_node = neighbor_split(rptr, self.ps)
        return PartitionPlan(
            rank=self.rank,
            bounds=self.bounds,
            ps=self.ps,
            num_edges=self.num_edges,
            local_indptr=lptr,
            local_indices=lidx,
            local_weights=lw,
            remote_indptr=rptr,
            remote_slot=_frozen(new[slot]),
            remote_weights=rw,
            halo_pe=_frozen(self.halo_pe[old]),
            halo_row=_frozen(self.halo_row[old]),
            lnp_ptr=_frozen(lnp_ptr),
            lnp_node=_frozen(lnp_node),
            rnp_ptr=_frozen(rnp_ptr),
            rnp_node=_frozen(rnp_node),
            symmetric=False,
            norm=self.norm,
            halo_norm=None if self.halo_norm is None else _frozen(self.halo_norm[old]),
            _transposed=self.transposed,
        )

    # ---- facts ---------------------------------------------------------------------------
    def halo_rows_per_peer(self) -> np.ndarray:
        """int64 [P]: distinct rows this rank fetches from each peer."""
        return np.bincount(self.halo_pe, minlength=self.num_ranks).astype(np.int64)

    def stats(self) -> dict:
        return {
            "rank": self.rank,
            "ps": self.ps,
            "digest": self.digest(),
            "lb": self.lb,
            "ub": self.ub,
            "nodes": self.num_local_nodes,
            "local_edges": self.num_local_edges,
            "remote_edges": self.num_remote_edges,
            "halo_rows": self.num_halo,
            "halo_rows_per_peer": self.halo_rows_per_peer().tolist(),
            "lnp": int(self.lnp_node.size),
            "rnp": int(self.rnp_node.size),
        }

    def fingerprint(self) -> str:
        """What every rank's plan must agree on: bounds, ps, global edge count, weights."""
        h = hashlib.sha1(np.ascontiguousarray(self.bounds).tobytes())
        h.update(f"{self.ps}:{self.num_edges}:{self.has_weights}:{self.symmetric}".encode())
        return h.hexdigest()[:16]

    def arrays(self) -> dict[str, np.ndarray]:
        """This rank's arrays by name, the transposed plan's prefixed ``t.`` (what a shard
        stores and ``digest`` hashes); absent weights are left out."""
        out = {k: getattr(self, k) for k in PLAN_ARRAYS if getattr(self, k) is not None}
        if not self.symmetric and self._transposed is not None:
            out.update({f"t.{k}": v for k, v in self._transposed.arrays().items()})
        return out

    def digest(self) -> str:
        """Content hash of this rank's plan (every array, dtype and shape included): equal
        digests mean bit-identical plans, however they were built. Computed once (the
        plan is immutable)."""
        if "_digest" in self.__dict__:
            return self.__dict__["_digest"]
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.rank}:{self.ps}:{self.num_edges}:{self.symmetric}".encode())
        h.update(np.ascontiguousarray(self.bounds).tobytes())
        for name, a in sorted(self.arrays().items()):
            h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
            h.update(np.ascontiguousarray(a).data)
        self.__dict__["_digest"] = h.hexdigest()
        return self.__dict__["_digest"]


PLAN_ARRAYS = (
    "local_indptr",
    "local_indices",
    "local_weights",
    "remote_indptr",
    "remote_slot",
    "remote_weights",
    "halo_pe",
    "halo_row",
    "lnp_ptr",
    "lnp_node",
    "rnp_ptr",
    "rnp_node",
    "norm",
    "halo_norm",
)
OPTIONAL_ARRAYS = ("local_weights", "remote_weights", "norm", "halo_norm")


def plan_from_arrays(rank, bounds, ps, num_edges, symmetric, arrays: dict) -> PartitionPlan:
    """The inverse of ``PartitionPlan.arrays``: a plan (and its transposed plan) over
    ``arrays`` as given (memory maps stay memory maps)."""
    missing = [k for k in PLAN_ARRAYS if k not in OPTIONAL_ARRAYS and k not in arrays]
    if missing:
        raise ValueError(f"plan arrays missing: {', '.join(missing)}")

    def one(prefix, sym):
        kw = {k: _frozen(arrays.get(prefix + k)) for k in PLAN_ARRAYS}
        return PartitionPlan(rank, _frozen(bounds), int(ps), int(num_edges), symmetric=sym, **kw)

    fwd = one("", bool(symmetric))
    if symmetric or "t.local_indptr" not in arrays:
        return fwd
    return replace(fwd, _transposed=one("t.", False))


def build_plan(
    graph: Graph,
    num_ranks: int,
    ps: int = DEFAULTS.ps,
    *,
    rank: int | None = None,
    split: str = DEFAULTS.split,
    transposed: bool = True,
    progress_bar=None,
    bounds=None,
):
    """Partition ``graph`` for ``num_ranks`` ranks.

    Returns a list of P PartitionPlans, or the one plan of ``rank`` when given (what an
    SPMD rank builds: only its own share, O(E) reads and O(E/P) writes). ``split``: how
    nodes are cut into ranks (node_split), unless ``bounds`` [P+1] gives the node ranges
    (another graph's over the same nodes: mgg.distgraph.DistGraph.derive).
    ``transposed`` also builds the plans of the transposed graph (for backward passes);
    a graph flagged symmetric reuses the forward plan.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"build_plan needs a Graph, got {type(graph).__name__}")
    ps = check_value("ps", ps)
    if bounds is None:
        bounds = node_split(graph.indptr, num_ranks, split)
    p = bounds.size - 1
    if rank is not None and not 0 <= rank < p:
        raise ValueError(f"rank {rank} is outside [0, {p})")
    ranks = range(p) if rank is None else [rank]
    symmetric = bool(graph.symmetric)
    need_t = transposed and not symmetric
    gt = graph.transpose() if need_t and rank is None else None
    bar = progress(
        total=len(ranks) * (2 if need_t else 1),
        desc="partition",
        enable=progress_bar
        if progress_bar is not None
        else (None if graph.num_edges > 10_000_000 else False),
    )
    plans = []
    mark = np.full(graph.num_nodes, -1, np.int32)  # scratch shared by every split
    with bar:
        for r in ranks:
            lb, ub = int(bounds[r]), int(bounds[r + 1])
            rows = _row_slice(graph, lb, ub)
            norm = graph.norm
            fwd = rank_plan(r, bounds, ps, graph.num_edges, symmetric, mark, *rows, norm=norm)
            bar.update()
            t = None
            if need_t:
                rows = (
                    _row_slice(gt, lb, ub)
                    if gt is not None
                    else column_slice(graph.indptr, graph.indices, graph.weights, lb, ub)
                )
                t = rank_plan(r, bounds, ps, graph.num_edges, False, mark, *rows, norm=norm)
                bar.update()
            plans.append(replace(fwd, _transposed=t) if t is not None else fwd)
    return plans if rank is None else plans[0]


def job_plan(
    graph: Graph,
    kind: str,
    num_ranks: int,
    ps: int = DEFAULTS.ps,
    *,
    rank: int | None = None,
    split: str = DEFAULTS.split,
    transposed: bool = True,
):
    """``build_plan(job_graph(graph, kind), ...)``, equal bit for bit, without building
    the job's graph where it need not: an unweighted graph's rows split with their loops
    dropped, and for 'self_loops' and 'gcn_norm' one added (edge_split's ``loops``), GCN's
    weights kept as their factors D^-1/2 (the plans' norm). That graph (its CSR, weights
    and their temporaries: about 30 bytes per entry) is built only for a weighted graph,
    or a directed one whose transposed plans are wanted."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"unknown graph kind {kind!r}; choose one of {', '.join(GRAPH_KINDS)}")
    lean = graph.weights is None and graph.norm is None and (graph.symmetric or not transposed)
    if kind == "as_is" or not lean:
        return build_plan(
            job_graph(graph, kind), num_ranks, ps, rank=rank, split=split, transposed=transposed
        )
    ps = check_value("ps", ps)
    n = graph.num_nodes
    loops = "drop" if kind == "no_self_loops" else "last"
    deg = np.diff(graph.indptr) - _loops_per_row(graph.indptr, graph.indices)
    if loops == "last":
        deg += 1
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    norm = None
    if kind == "gcn_norm":  # Graph.gcn_norm's, on its float64 degrees
        d = deg.astype(np.float64)
        norm = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0).astype(np.float32)
    del deg
    bounds = node_split(indptr, num_ranks, split)
    num_edges = int(indptr[-1])
    del indptr
    p = bounds.size - 1
    if rank is not None and not 0 <= rank < p:
        raise ValueError(f"rank {rank} is outside [0, {p})")
    symmetric = bool(graph.symmetric)
    mark = np.full(n, -1, np.int32)
    plans = []
    for r in range(p) if rank is None else [rank]:
        rows = _row_slice(graph, int(bounds[r]), int(bounds[r + 1]))
        args = (r, bounds, ps, num_edges, symmetric, mark, *rows)
        plans.append(rank_plan(*args, norm=norm, loops=loops))
    return plans if rank is None else plans[0]


@numba.njit(cache=True, parallel=True)
def _loops_per_row(indptr, indices):
    out = np.zeros(indptr.size - 1, np.int64)
    for v in numba.prange(indptr.size - 1):
        for e in range(indptr[v], indptr[v + 1]):
            out[v] += indices[e] == v
    return out


def plan_stats(plans: list, plan_seconds: float | None = None) -> dict:
    """Whole-partition facts from all P plans, or from their ``stats()`` dicts (what
    `mgg partition` reports; a distributed run gathers the dicts)."""
    st = [q if isinstance(q, dict) else q.stats() for q in plans]
    edges = np.array([q["local_edges"] + q["remote_edges"] for q in st], np.int64)
    remote = int(sum(q["remote_edges"] for q in st))
    halo = int(sum(q["halo_rows"] for q in st))
    e = int(edges.sum())
    out = {
        "num_nodes": st[-1]["ub"],
        "num_edges": e,
        "np": len(st),
        "ps": st[0]["ps"],
        "nodes_per_rank": [q["nodes"] for q in st],
        "edges_per_rank": edges.tolist(),
        "imbalance": float(edges.max() / edges.mean()) if e else 1.0,
        "remote_edges": remote,
        "remote_fraction": remote / e if e else 0.0,
        "halo_rows": halo,
        "dedup_saving": remote / halo if halo else 1.0,
        "halo_rows_per_rank": [q["halo_rows"] for q in st],
        "halo_rows_per_peer": [q["halo_rows_per_peer"] for q in st],
        "lnp": int(sum(q["lnp"] for q in st)),
        "rnp": int(sum(q["rnp"] for q in st)),
        "digests": [q["digest"] for q in st],
    }
    if plan_seconds is not None:
        out["plan_seconds"] = plan_seconds
    return out


def _row_slice(g: Graph, lb: int, ub: int):
    a, b = int(g.indptr[lb]), int(g.indptr[ub])
    w = None if g.weights is None else g.weights[a:b]
    return g.indptr[lb : ub + 1] - a, g.indices[a:b], w


def rank_plan(
    rank, bounds, ps, num_edges, symmetric, mark, indptr, indices, weights, norm=None, loops="as_is"
):
    """Rank ``rank``'s plan of its rows' in-edges; ``norm``: every node's factor of the
    weights, float [N] (Graph.norm), which the plan then keeps in place of them, or None;
    ``loops``: what becomes of the rows' self loops (edge_split's)."""
    split = None if norm is not None else weights  # the weights' factors, not the weights
    re: RankEdges = edge_split(indptr, indices, split, bounds, rank, mark, loops=loops)
    lnp_ptr, lnp_node = neighbor_split(re.local_indptr, ps)
    rnp_ptr, rnp_node = neighbor_split(re.remote_indptr, ps)
    plan = PartitionPlan(
        rank=rank,
        bounds=_frozen(bounds),
        ps=int(ps),
        num_edges=num_edges,
        lnp_ptr=_frozen(lnp_ptr),
        lnp_node=_frozen(lnp_node),
        rnp_ptr=_frozen(rnp_ptr),
        rnp_node=_frozen(rnp_node),
        symmetric=symmetric,
        **{k: _frozen(v) for k, v in re._asdict().items()},
    )
    if norm is None:
        return plan
    own = np.array(norm[plan.lb : plan.ub], np.float32)  # a copy: not a view of the graph's
    halo = np.asarray(norm[plan.halo_nodes], np.float32)
    return replace(plan, norm=_frozen(own), halo_norm=_frozen(halo))


def _frozen(a):
    if a is not None:
        a.setflags(write=False)
    return a
