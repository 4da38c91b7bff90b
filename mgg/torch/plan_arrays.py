"""What the torch ops read of a graph's plan besides its rows: index arrays built from the
plan once, on first use, and kept on the job's device (numpy or cupy), in one named place
per DistGraph (``g.plan_arrays``)."""

from __future__ import annotations

import functools

import numpy as np


class PlanArrays:
    """One graph's plan as the torch ops read it, each array built on first use. Edges
    come in ``edge_index(g)``'s order: the rank's local edges, then its remote ones."""

    def __init__(self, plan, xp, rows=None):
        self.plan, self.xp, self._rows = plan, xp, rows
        self._inverse_in_degrees: dict = {}
        # GCN's Â over the plan's edges: (improved, add_self_loops) -> (norm [E] tensor,
        # the self term [n] or None), computed by mgg.torch.layers.gcn.gcn_adjacency
        self.gcn_norms: dict[tuple[bool, bool], tuple] = {}
        self.edge_index = None  # PyG's edge_index of the graph: mgg.torch.edges.EdgeIndex.of

    @staticmethod
    def of(g) -> PlanArrays:
        """The DistGraph g's PlanArrays, made on first use."""
        if g.plan_arrays is None:
            g.plan_arrays = PlanArrays(g.plan, g.backend.xp, g.rows)
        return g.plan_arrays

    def _held(self, *arrays) -> tuple:
        return tuple(self.xp.asarray(a) for a in arrays)

    @functools.cached_property
    def ids(self) -> tuple:
        """(dst, src) int64 [E]: the global ids of each edge's ends."""
        p = self.plan
        keys = np.concatenate(p.edge_keys())
        return self._held(keys // p.num_nodes, keys % p.num_nodes)

    @functools.cached_property
    def index(self) -> tuple:
        """(src, dst) int64 [E]: the row each edge reads of cat([x, halo(x, g)]) ([n + H])
        and its destination's local row."""
        return self._held(self.plan.edge_slots(), np.concatenate(self.plan.edge_dst()))

    @functools.cached_property
    def weights(self):
        """[E] float32: the plan's edge weights."""
        return self._held(np.concatenate(self.plan.edge_weights()))[0]

    @functools.cached_property
    def by_dst(self) -> tuple:
        """(ptr [n+1], perm [E]): the edges grouped by destination."""
        p = self.plan
        lp, rp = p.local_indptr.astype(np.int64), p.remote_indptr.astype(np.int64)
        ptr, el, er = lp + rp, int(lp[-1]), int(rp[-1])
        ld, rd = p.edge_dst()  # each edge's destination row
        perm = np.empty(el + er, np.int64)
        perm[ptr[ld] + np.arange(el) - lp[ld]] = np.arange(el)
        perm[ptr[rd] + np.diff(lp)[rd] + np.arange(er) - rp[rd]] = el + np.arange(er)
        return self._held(ptr, perm)

    @functools.cached_property
    def by_src(self) -> tuple:
        """(lp, rp, src, ptr, perm): the destinations' CSRs (local, remote) and each edge's
        source slot, and the edges grouped by source slot (ptr [n + H + 1], perm [E]: a
        CSR over the rows of cat([x, halo(x, g)]), edges in order within a slot)."""
        p = self.plan
        src = p.edge_slots()
        slots = p.num_local_nodes + p.num_halo
        ptr = np.zeros(slots + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=slots), out=ptr[1:])
        perm = np.argsort(src, kind="stable").astype(np.int64)
        lp, rp = (a.astype(np.int64) for a in (p.local_indptr, p.remote_indptr))
        return self._held(lp, rp, src, ptr, perm)

    @functools.cached_property
    def csr(self) -> tuple:
        """(local indptr, local indices, remote indptr, remote slots): the forward CSRs."""
        p = self.plan
        return self._held(p.local_indptr, p.local_indices, p.remote_indptr, p.remote_slot)

    @functools.cached_property
    def rows(self):
        """int64 [L]: a restricted graph's output rows (DistGraph.restricted)."""
        return self._held(self._rows)[0]

    def inverse_in_degrees(self, dtype):
        """[n] ``dtype``: 1/in-degree of each local node (0 without in-edges)."""
        key = np.dtype(dtype)
        if key not in self._inverse_in_degrees:
            deg = self.plan.in_degrees()
            inv = np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0).astype(dtype)
            self._inverse_in_degrees[key] = self._held(inv)[0]
        return self._inverse_in_degrees[key]
