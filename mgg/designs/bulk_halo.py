"""Bulk halo exchange, then local compute (DGCL-style): no overlap."""

from __future__ import annotations

import time

import numpy as np

from ..graph.core import inverse
from ..kernels import cpu
from .cpu import CpuDesign
from .halo import HaloExchange


class BulkHalo(CpuDesign):
    """All-to-all of every needed remote row (each once), then the aggregation."""

    name = "bulk_halo"

    def __init__(self, plan, comm, dim, dtype=np.float32, *, window=None, share=None):
        super().__init__(plan, comm, dim, dtype, window=window, share=share)
        p, h = plan, HaloExchange(plan, comm)
        self.send_rows, self.send_counts, self.recv_counts = (
            h.send_rows,
            h.send_counts,
            h.recv_counts,
        )
        self.send = np.empty((self.send_rows.size, self.dim), self.dtype)
        self.recv = np.empty((p.num_halo, self.dim), self.dtype)
        # rows arrive grouped by owner: remote edges read them there, not in halo order
        self.remote_index = inverse(h.order, np.int32)[p.remote_slot]  # slots are int32

    def run(self, op, eps, out):
        p = self.plan
        t0 = time.perf_counter()
        cpu.gather_rows(self.x, self.send_rows, self.send)
        self.comm.alltoallv(self.send, self.send_counts, self.recv, self.recv_counts)
        self.stats["wait_seconds"] += time.perf_counter() - t0
        self.count(self.plan.num_halo)
        cpu.init_out(op, self.x, out, eps)
        self.local(op, 0, p.lnp_node.size, out)
        self.remote(op, 0, p.rnp_node.size, self.remote_index, self.recv, out)
        cpu.finalize(op, self.in_degrees, out)
