"""P virtual PEs in one process on one GPU: the remote path of the MGG kernel runs for
real (peers are other device buffers, read through their base pointers) without
several processes or NVSHMEM."""

from __future__ import annotations

import time

import numpy as np

from ...partition.plan import PartitionPlan
from ..reference import check_op
from . import DevicePlan, current_device, launch_config, run


class VirtualDesign:
    """MGG over P virtual PEs on the current GPU: every PE's rows in its own device
    buffer, peers read through a table of their base pointers (p2p), ps-sized partitions,
    dist interleaving. plans: all P PartitionPlans; dim: width D. The GPU baselines
    (mgg.baselines.cuda) subclass it and change where rows live and how they arrive."""

    name = "pipelined"

    def __init__(
        self,
        plans: list[PartitionPlan],
        dim: int,
        *,
        ps: int | None = None,
        dist: int = 4,
        wpb: int = 4,
    ):
        import cupy

        self.cupy = cupy
        self.plans = [p.with_ps(ps) if ps else p for p in plans]
        self.dim, self.dist, self.wpb = int(dim), int(dist), int(wpb)
        self.dev_id, self.dev = current_device()
        self.rows = max(1, self.plans[0].max_local_nodes)
        self.setup_seconds = 0.0
        t0 = time.perf_counter()
        self.prepare()
        cupy.cuda.Device().synchronize()
        self.setup_seconds = time.perf_counter() - t0

    def prepare(self) -> None:
        """Allocate the PE buffers and the per-PE device plans."""
        cp = self.cupy
        self.bufs = [cp.zeros((self.rows, self.dim), cp.float32) for _ in self.plans]
        self.peers = cp.asarray(np.array([b.data.ptr for b in self.bufs], np.uint64))
        self.dplans = [DevicePlan(p, self.dist) for p in self.plans]
        self.cfgs = [self._cfg(p, self.dist) for p in self.plans]

    def _cfg(self, p, dist, ps=None):
        return launch_config(
            ps or p.ps, dist, self.wpb, self.dim, p.lnp_node.size, p.rnp_node.size, self.dev
        )

    def load(self, x: np.ndarray) -> None:
        """Write the global input x [N, D]: each PE's rows into its buffer."""
        for p, b in zip(self.plans, self.bufs, strict=True):
            b[: p.num_local_nodes] = self.cupy.asarray(x[p.lb : p.ub], self.cupy.float32)

    def run(self, op: str = "sum", eps: float = 0.0) -> list:
        """Every PE's aggregation, one after another; returns the P device outputs."""
        check_op(op, self.plans[0].has_weights)
        outs = []
        for r, (p, dp, cfg) in enumerate(zip(self.plans, self.dplans, self.cfgs, strict=True)):
            out = self.cupy.empty((p.num_local_nodes, self.dim), self.cupy.float32)
            self._run_pe(r, p, dp, cfg, out, op, eps)
            outs.append(out)
        return outs

    def _run_pe(self, r, p, dp, cfg, out, op, eps) -> None:
        run(dp, self.bufs[r], self.peers, out, op, eps, cfg, self.dev_id)

    def gather(self, outs) -> np.ndarray:
        return self.cupy.asnumpy(self.cupy.concatenate(outs))


def aggregate_virtual(
    plans: list[PartitionPlan], x: np.ndarray, op: str = "sum", *, eps: float = 0.0, **knobs
) -> np.ndarray:
    """MGG's aggregation over P virtual PEs; returns the stitched [N, D] (numpy).
    knobs: ps, dist, wpb."""
    design = VirtualDesign(plans, x.shape[1], **knobs)
    design.load(x)
    return design.gather(design.run(op, eps))
