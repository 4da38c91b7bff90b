"""Bulk halo exchange, then local compute (DGCL-style): no overlap."""

from __future__ import annotations

import time

import numpy as np

from ..kernels import cpu
from .cpu import CpuDesign


class BulkHalo(CpuDesign):
    """All-to-all of every needed remote row (each once), then the aggregation."""

    name = "bulk_halo"

    def __init__(self, plan, comm, dim, dtype=np.float32, *, window=None):
        super().__init__(plan, comm, dim, dtype, window=window)
        p, size = plan, comm.size
        order = np.argsort(p.halo_pe, kind="stable")  # halo slots grouped by owner
        self.recv_counts = np.bincount(p.halo_pe, minlength=size).astype(np.int64)
        requests = np.split(p.halo_row[order].astype(np.int64), np.cumsum(self.recv_counts)[:-1])
        # tell each owner which of its rows we need
        wanted = comm.alltoall(requests)
        self.send_rows = np.concatenate(wanted).astype(np.int64)
        self.send_counts = np.array([w.size for w in wanted], np.int64)
        self.send = np.empty((self.send_rows.size, self.dim), self.dtype)
        self.recv = np.empty((p.num_halo, self.dim), self.dtype)
        pos = np.empty(p.num_halo, np.int64)
        pos[order] = np.arange(p.num_halo)
        self.remote_index = pos[p.remote_slot]

    def run(self, op, eps, out):
        p = self.plan
        t0 = time.perf_counter()
        np.take(self.x, self.send_rows, axis=0, out=self.send)
        self.comm.alltoallv(self.send, self.send_counts, self.recv, self.recv_counts)
        self.stats["wait_seconds"] += time.perf_counter() - t0
        self.count(self.plan.num_halo)
        cpu.init_out(op, self.x, out, eps)
        self.local(op, 0, p.lnp_node.size, out)
        self.remote(op, 0, p.rnp_node.size, self.remote_index, self.recv, out)
        cpu.finalize(op, self.in_degrees, out)
