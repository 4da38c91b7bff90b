"""Direct per-edge gets (MGG's "direct NVSHMEM", Table 1): no neighbor partitioning, no
deduplication, no interleaving."""

from __future__ import annotations

import time

import numpy as np

from ..kernels import cpu
from ..kernels.distributed import DistributedAggregation


class Direct(DistributedAggregation):
    """Every remote edge fetches its own row, blocking, one block of ``block_nodes``
    destination nodes at a time; a node's neighbors are one unit of work (no ps)."""

    name = "direct"

    def __init__(self, plan, comm, dim, dtype=np.float32, *, window=None, block_nodes: int = 32):
        super().__init__(plan, comm, dim, dtype, window=window)
        p = plan
        deg = np.diff(p.remote_indptr)
        self.node_plan = p.with_ps(
            max(1, int(max(deg.max(initial=0), np.diff(p.local_indptr).max(initial=0))))
        )
        n = p.num_local_nodes
        cuts = np.arange(0, n + block_nodes, block_nodes).clip(max=n)
        self.blocks = []  # (first RNP, end RNP, selections) per block with remote edges
        q = self.node_plan
        pe_all, row_all = p.remote_pe, p.remote_row
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            e0, e1 = int(p.remote_indptr[a]), int(p.remote_indptr[b])
            if e0 == e1:
                continue
            pes, rows = pe_all[e0:e1], row_all[e0:e1]
            sels = [
                self.buffer.selection(pe, rows[pes == pe], np.flatnonzero(pes == pe) + e0)
                for pe in np.unique(pes)
            ]
            self.blocks.append(
                (int(np.searchsorted(q.rnp_node, a)), int(np.searchsorted(q.rnp_node, b)), sels)
            )
        self.staging = np.empty((p.num_remote_edges, self.dim), self.dtype)
        self.edge_index = np.arange(p.num_remote_edges, dtype=np.int64)

    def run(self, op, eps, out):
        q = self.node_plan
        cpu.init_out(op, self.x, out, eps)
        cpu.accumulate(
            q.lnp_ptr,
            q.lnp_node,
            0,
            q.lnp_node.size,
            q.local_indices,
            self._weights(op, "local"),
            self.x,
            out,
        )
        w = self._weights(op, "remote")
        for k0, k1, sels in self.blocks:
            t0 = time.perf_counter()
            for sel in sels:
                req = self.buffer.rget(sel, self.staging)
                if req is not None:
                    req.Wait()
                self._count(sel.size)
            self.stats["wait_seconds"] += time.perf_counter() - t0
            cpu.accumulate(q.rnp_ptr, q.rnp_node, k0, k1, self.edge_index, w, self.staging, out)
        cpu.finalize(op, self.in_degrees, out)

    def free(self):
        for _, _, sels in getattr(self, "blocks", []):
            for sel in sels:
                sel.free()
        super().free()
