"""MGG's pipelined design on GPUs, one PE per process: one kernel per call, warps
interleave LNPs and RNPs (``dist`` partitions of each kind per warp, ``wpb`` warps per
block), remote rows read by peer-pointer loads ('p2p') or NVSHMEM device gets ('get').
Rows are float32 or bfloat16 (uint16 bits on the device, summed in float32, rounded once:
a launch per range of destination rows, whose sums stay within SUMS_MAX_BYTES)."""

from __future__ import annotations

import numpy as np

from ..kernels.cuda import (
    DevicePlan,
    current_device,
    launch_config,
    row_storage,
    run,
    shared_sums,
)
from ..knobs import DEFAULTS, check_value
from ..precision import is_bf16
from .base import Design

# bfloat16 rows: the float32 sums one launch of the CUDA kernel rounds (mgg.kernels.cuda.
# DevicePlan: a launch per range of destination rows) take at most this many bytes
SUMS_MAX_BYTES = 1 << 30


def sums_rows(dim: int) -> int:
    """The destination rows one bf16 launch of width ``dim`` sums: its float32 sums within
    SUMS_MAX_BYTES."""
    return max(1, SUMS_MAX_BYTES // (4 * max(int(dim), 1)))


class CudaPipelined(Design):
    """comm  mgg.comm.nvshmem.NVSHMEMComm (any size: the get mode needs NVSHMEM even on
          one PE), or a comm of one rank without device memory (or None): one PE in plain
          device memory
    remote  'p2p', 'get', or None: p2p when every peer is reachable by loads
            (nvshmem_ptr) on every PE, else get. ``remote_path`` says which was chosen
            and why.
    share   a design of this width over the same node ranges whose input rows (and bf16
            sums) this one reads: a restricted plan's, over its full graph's (Design)
    """

    name = "pipelined"
    knobs = ("dist", "wpb", "remote")
    stores_rounded = True  # bf16: the kernel rounds its float32 sums into out itself

    def __init__(
        self,
        plan,
        comm,
        dim: int,
        dtype=np.float32,
        *,
        dist: int = DEFAULTS.dist,
        wpb: int = DEFAULTS.wpb,
        remote: str | None = DEFAULTS.remote,
        share=None,
    ):
        mode = check_value("remote", remote)
        nvshmem = comm is not None and comm.device_memory
        if not nvshmem and mode == "get":
            raise ValueError(
                "remote 'get' reads through NVSHMEM: launch with mggrun (one PE will do)"
            )
        self.dev_id, self.dev = current_device()
        held = row_storage(dtype, self.dev, self.dev_id)  # before any allocation
        super().__init__(plan, comm, dim, dtype)
        import cupy

        self._alone = not nvshmem
        self._share, self._own, self._held = share, None, held
        if not nvshmem:
            if plan.num_ranks != 1:
                raise ValueError(
                    f"the plan is for {plan.num_ranks} ranks but there is no NVSHMEM comm"
                )
            self.peers = cupy.zeros(1, cupy.uint64)  # one PE: no remote row to point at
            mode, why = "p2p", "one PE in plain device memory"
        else:
            self.symmetric_input(share=share)
            self.peers = comm.peer_pointers(self.buffer)
            # one mode for the whole job: the most peers any PE cannot map
            unreachable = int(comm.allreduce(np.array([len(comm.unreachable)]), "max")[0])
            if mode == "p2p" and unreachable:
                mine = comm.unreachable or "a peer PE cannot map all of its peers"
                raise ValueError(
                    "remote 'p2p' needs every peer reachable by loads (nvshmem_ptr), but "
                    f"{mine}: use remote 'get'"
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
        bf16 = is_bf16(self.dtype)  # a launch per sums_rows rows, so that its sums stay small
        self.dplan = DevicePlan(plan, self.dist, sums_rows(self.dim) if bf16 else None)
        # bf16: the float32 sums the kernel rounds into out, the device's (shared_sums)
        self.acc = shared_sums(self.dev_id, self.dplan.rows * self.dim) if bf16 else None
        self.cfg = launch_config(
            plan.ps,
            self.dist,
            self.wpb,
            self.dim,
            plan.lnp_node.size,
            plan.rnp_node.size,
            self.dev,
            mode,
            self.dtype.itemsize,
        )

    @property
    def x(self):
        """This rank's input rows [n, D]: the symmetric buffer; for one PE alone, a buffer
        made when first asked for (a call given its rows reads them in place instead)."""
        if self._x is None and self._alone:
            self._x = self._input_buffer()[: self.plan.num_local_nodes]
        return self._x

    @x.setter
    def x(self, value):
        self._x = value

    def _input_buffer(self):
        """One PE alone: the input buffer, a share's (the full graph's) where given."""
        if self._share is not None:
            return self._share._input_buffer()
        if self._own is None:
            import cupy

            rows = max(self.plan.max_local_nodes, 1)
            self._own = cupy.zeros((rows, self.dim), self._held)
        return self._own

    def reads_in_place(self, x) -> bool:
        """One PE alone reads a C-contiguous cupy array of its rows' storage in place:
        nothing else reads it, and the launches run in its stream's order."""
        import cupy

        return (
            self._alone
            and isinstance(x, cupy.ndarray)
            and x.ndim == 2
            and x.dtype == self._held
            and x.shape[0] >= self.plan.num_local_nodes
            and x.shape[1] == self.dim
            and x.flags.c_contiguous
        )

    @property
    def xp(self):
        import cupy

        return cupy

    def run(self, op, eps, out):
        run(
            self.dplan,
            self.given if self.given is not None else self.x,
            self.peers,
            out,
            op,
            eps,
            self.cfg,
            self.dev_id,
            weights=self.edge_weights,
            acc=self.acc,
        )
        self.count(self.plan.num_remote_edges)

    def free(self) -> None:
        super().free()
        self._own = self._share = self.acc = None
        self._alone = False
