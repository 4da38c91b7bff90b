"""Direct per-edge gets (MGG's "direct NVSHMEM", Table 1) on CPUs: no neighbor
partitioning, no deduplication, no interleaving."""

from __future__ import annotations

import time

import numpy as np

from ..kernels import cpu
from .cpu import CpuDesign


class Direct(CpuDesign):
    """Every remote edge fetches its own row, blocking, one block of ``BLOCK_NODES``
    destination nodes at a time into a buffer of that block's rows; a node's neighbors
    are one unit of work (no ps)."""

    name = "direct"
    windows = ("shm", "rma")  # per-edge gets: the msg window has none
    BLOCK_NODES = 32

    def __init__(self, plan, comm, dim, dtype=np.float32, *, window=None, share=None):
        super().__init__(plan, comm, dim, dtype, window=window, share=share)
        block_nodes = self.BLOCK_NODES
        p = plan
        q = self.node_plan = p.with_ps(max(1, p.widest_row))
        n = p.num_local_nodes
        cuts = np.arange(0, n + block_nodes, block_nodes).clip(max=n)
        pe_all, row_all = p.remote_pe, p.remote_row
        # position of each remote edge in its block's buffer (int32, as every design's
        # indices: one compiled kernel serves them all)
        self.edge_pos = np.empty(p.num_remote_edges, np.int32)
        self.blocks = []  # (first RNP, end RNP, selections) of each block with remote edges
        widest = 0
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            e0, e1 = int(p.remote_indptr[a]), int(p.remote_indptr[b])
            if e0 == e1:
                continue
            self.edge_pos[e0:e1] = np.arange(e1 - e0)
            pes, rows = pe_all[e0:e1], row_all[e0:e1]
            sels = [
                self.buffer.selection(pe, rows[pes == pe], np.flatnonzero(pes == pe))
                for pe in np.unique(pes)
            ]
            k0, k1 = np.searchsorted(q.rnp_node, [a, b])
            self.blocks.append((int(k0), int(k1), sels))
            widest = max(widest, e1 - e0)
        self.staging = np.empty((widest, self.dim), self.dtype)

    def run(self, op, eps, out):
        q = self.node_plan
        cpu.init_out(op, self.x, out, eps)
        self.local(op, 0, q.lnp_node.size, out, plan=q)
        for k0, k1, sels in self.blocks:
            t0 = time.perf_counter()
            for sel in sels:
                req = self.buffer.rget(sel, self.staging)
                if req is not None:
                    req.Wait()
                self.count(sel.size)
            self.stats["wait_seconds"] += time.perf_counter() - t0
            self.remote(op, k0, k1, self.edge_pos, self.staging, out, plan=q)
        cpu.finalize(op, self.in_degrees, out)

    def free(self):
        for *_, sels in getattr(self, "blocks", []):
            for sel in sels:
                sel.free()
        self.blocks = []
        super().free()
