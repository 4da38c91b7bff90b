"""MGG's pipelined design on GPUs, with the interface of the CPU designs
(mgg.kernels.distributed.DistributedAggregation): set up per (plan, width), write this
PE's rows into ``x``, call ``design(op)``."""

from __future__ import annotations

import numpy as np

from ..distributed import check_plan
from ..reference import check_op
from . import MODES, DevicePlan, current_device, launch_config, run


class CudaPipelined:
    """One kernel per call: warps interleave LNPs and RNPs (``dist`` of each), remote rows
    by peer-pointer loads ('p2p') or NVSHMEM device gets ('get').

    comm  mgg.comm.nvshmem.NVSHMEMComm (any size: the get mode needs NVSHMEM even on one
          PE), or None for a single PE in plain device memory
    mode  'p2p', 'get', or None: p2p when every peer is reachable by loads (nvshmem_ptr)
          on every PE, else get. ``remote_path`` says which was chosen and why.
    """

    name = "pipelined"

    def __init__(
        self,
        plan,
        comm,
        dim: int,
        dtype=np.float32,
        *,
        dist: int = 4,
        wpb: int = 4,
        mode: str | None = None,
        window=None,
    ):
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"the CUDA kernel aggregates float32 features, not {dtype}")
        if mode not in (None, *MODES):
            raise ValueError(f"remote mode must be one of {MODES} or None, got {mode!r}")
        if comm is None and mode == "get":
            raise ValueError(
                "mode 'get' reads through NVSHMEM: launch with mggrun (one PE will do)"
            )
        import cupy

        self.plan, self.comm, self.dim = plan, comm, int(dim)
        self.dev_id, self.dev = current_device()
        n = plan.num_local_nodes
        if comm is None:
            if plan.num_ranks != 1:
                raise ValueError(f"the plan is for {plan.num_ranks} ranks but there is no comm")
            self.buffer = None
            self._own = cupy.zeros((max(plan.max_local_nodes, 1), self.dim), cupy.float32)
            self.x = self._own[:n]
            self.peers = cupy.asarray(np.array([self._own.data.ptr], np.uint64))
            mode, why = "p2p", "one PE in plain device memory"
        else:
            check_plan(plan, comm)
            self.buffer = comm.symmetric(plan.max_local_nodes, self.dim, np.float32)
            self.x = self.buffer.local[:n]
            self.peers = comm.peer_pointers(self.buffer)
            # one mode for the whole job: the most peers any PE cannot map
            unreachable = int(comm.allreduce(np.array([len(comm.unreachable)]), "max")[0])
            if mode == "p2p" and unreachable:
                mine = comm.unreachable or "a peer PE cannot map all of its peers"
                raise ValueError(
                    "mode 'p2p' needs every peer reachable by loads (nvshmem_ptr), but "
                    f"{mine}: use mode 'get'"
                )
            if mode is None:
                mode = "get" if unreachable else "p2p"
                why = (
                    f"chosen: nvshmem_ptr cannot map {unreachable} peer(s)"
                    if unreachable
                    else "chosen: nvshmem_ptr maps every peer"
                )
            else:
                why = "asked for"
        self.mode = mode
        self.remote_path = {"mode": mode, "why": why}
        self.dist, self.wpb = int(dist), int(wpb)
        self.dplan = DevicePlan(plan, self.dist)
        self.cfg = launch_config(
            plan.ps,
            self.dist,
            self.wpb,
            self.dim,
            plan.lnp_node.size,
            plan.rnp_node.size,
            self.dev,
            mode,
        )
        self.stats = {"calls": 0, "wait_seconds": 0.0, "remote_rows": 0, "remote_bytes": 0}

    def __call__(self, op: str = "sum", eps: float = 0.0, out=None):
        """Collective: aggregate the rows every PE wrote into its ``x``; out [n, D]."""
        import cupy

        check_op(op, self.plan.has_weights)
        n = self.plan.num_local_nodes
        if out is None:
            out = cupy.empty((n, self.dim), cupy.float32)
        elif out.shape != (n, self.dim):
            raise ValueError(f"out has shape {out.shape}, expected ({n}, {self.dim})")
        if self.buffer is not None:
            self.buffer.publish()
        run(self.dplan, self.x, self.peers, out, op, eps, self.cfg, self.dev_id)
        self.stats["calls"] += 1
        self.stats["remote_rows"] += self.plan.num_remote_edges
        self.stats["remote_bytes"] += self.plan.num_remote_edges * self.dim * 4
        return out

    def free(self) -> None:
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = None
        self.x = self._own = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


CUDA_DESIGNS = {CudaPipelined.name: CudaPipelined}
