"""Distributed aggregation: one rank's share over a symmetric input buffer.

A design is set up once per (plan, dim) — collectively, on every rank — and then called
once per layer: the caller writes its rows into ``design.x`` and calls ``design(op)``.

``Pipelined`` is MGG's design on the CPU:
  shm window  peers' rows are read in place by the RNP kernel (no copies at all);
  rma window  each remote row is fetched once (the halo) in batches of RNPs, with
              ``dist`` batches in flight, while the LNPs of the same step are aggregated;
              each batch is aggregated as soon as it lands.
"""

from __future__ import annotations

import time

import numpy as np

from ..partition.plan import PartitionPlan
from . import cpu
from .reference import check_op


class PlanMismatchError(RuntimeError):
    """The ranks of a job hold plans that do not belong together."""


class DistributedAggregation:
    """Base of every design: validation, the symmetric input buffer and statistics.

    plan  this rank's PartitionPlan (rank r of P)
    comm  mgg.comm.Comm with comm.rank == plan.rank and comm.size == P
    dim   feature width D of the layer input
    window  'shm' or 'rma' for the MPI backend (default: the comm's choice)
    """

    name = "base"

    def __init__(
        self, plan: PartitionPlan, comm, dim: int, dtype=np.float32, *, window: str | None = None
    ):
        check_plan(plan, comm)
        if int(dim) != dim or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim}")
        self.plan, self.comm, self.dim = plan, comm, int(dim)
        self.dtype = np.dtype(dtype)
        kw = {"window": window} if window else {}
        self.buffer = comm.symmetric(plan.max_local_nodes, self.dim, self.dtype, **kw)
        self.x = self.buffer.local[: plan.num_local_nodes]
        self.in_degrees = plan.in_degrees()
        self.stats = {"calls": 0, "wait_seconds": 0.0, "remote_rows": 0, "remote_bytes": 0}

    def __call__(self, op: str = "sum", eps: float = 0.0, out=None) -> np.ndarray:
        """Collective: aggregate the rows every rank wrote into its ``x``.

        returns out [n_local, D]
        """
        check_op(op, self.plan.has_weights)
        n = self.plan.num_local_nodes
        if out is None:
            out = np.empty((n, self.dim), self.dtype)
        elif out.shape != (n, self.dim):
            raise ValueError(f"out has shape {out.shape}, expected ({n}, {self.dim})")
        self.buffer.publish()
        self.run(op, eps, out)
        self.stats["calls"] += 1
        return out

    def run(self, op: str, eps: float, out: np.ndarray) -> None:
        raise NotImplementedError

    def _weights(self, op: str, which: str):
        return getattr(self.plan, f"{which}_weights") if op == "gcn" else None

    def _local(self, op, k0, k1, out):
        p = self.plan
        cpu.accumulate(
            p.lnp_ptr, p.lnp_node, k0, k1, p.local_indices, self._weights(op, "local"), self.x, out
        )

    def _count(self, rows: int) -> None:
        self.stats["remote_rows"] += rows
        self.stats["remote_bytes"] += rows * self.dim * self.dtype.itemsize

    def free(self) -> None:
        """Collective: release the symmetric buffer."""
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = self.x = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


class Pipelined(DistributedAggregation):
    """MGG: LNP/RNP interleaving with ``dist`` fetch batches in flight, each remote row
    fetched once per call. ``batch_rnp`` is the number of RNPs per batch."""

    name = "pipelined"

    def __init__(
        self,
        plan,
        comm,
        dim,
        dtype=np.float32,
        *,
        window=None,
        dist: int = 4,
        batch_rnp: int = 8192,
    ):
        super().__init__(plan, comm, dim, dtype, window=window)
        if dist < 1 or batch_rnp < 1:
            raise ValueError(f"dist and batch_rnp must be >= 1, got {dist}, {batch_rnp}")
        self.dist = int(dist)
        p = plan
        self.direct = self.buffer.mode == "shm"
        if self.direct:
            # read peers in place: the row of each remote edge in the node-wide view
            self.remote_index = p.remote_pe.astype(np.int64) * self.buffer.rows + p.remote_row
            return
        nb = max(1, -(-p.rnp_node.size // batch_rnp))
        self.rnp_cuts = (np.arange(nb + 1) * p.rnp_node.size) // nb
        self.lnp_cuts = (np.arange(nb + 1) * p.lnp_node.size) // nb
        self.staging = np.empty((p.num_halo, self.dim), self.dtype)
        # rows first used by batch b are halo slots [first_new[b], first_new[b+1]),
        # because the halo is in order of first use
        ends = p.rnp_ptr[self.rnp_cuts]
        first_new = np.zeros(nb + 1, np.int64)
        if p.num_remote_edges:
            cummax = np.maximum.accumulate(p.remote_slot.astype(np.int64))
            first_new[1:] = np.where(ends[1:] > 0, cummax[np.maximum(ends[1:] - 1, 0)] + 1, 0)
        self.batches = []
        for b in range(nb):
            slots = np.arange(first_new[b], first_new[b + 1])
            pes = p.halo_pe[slots]
            self.batches.append(
                [
                    self.buffer.selection(pe, p.halo_row[slots[pes == pe]], slots[pes == pe])
                    for pe in np.unique(pes)
                ]
            )

    def run(self, op, eps, out):
        p = self.plan
        cpu.init_out(op, self.x, out, eps)
        if self.direct:
            self._local(op, 0, p.lnp_node.size, out)
            if p.num_remote_edges:
                cpu.accumulate(
                    p.rnp_ptr,
                    p.rnp_node,
                    0,
                    p.rnp_node.size,
                    self.remote_index,
                    self._weights(op, "remote"),
                    self.buffer.node_view,
                    out,
                )
            cpu.finalize(op, self.in_degrees, out)
            return
        nb = len(self.batches)
        pending = [self._issue(b) for b in range(min(self.dist, nb))]
        w = self._weights(op, "remote")
        for b in range(nb):
            self._local(op, self.lnp_cuts[b], self.lnp_cuts[b + 1], out)
            t0 = time.perf_counter()
            for req in pending.pop(0):
                req.Wait()
            self.stats["wait_seconds"] += time.perf_counter() - t0
            if b + self.dist < nb:
                pending.append(self._issue(b + self.dist))
            cpu.accumulate(
                p.rnp_ptr,
                p.rnp_node,
                self.rnp_cuts[b],
                self.rnp_cuts[b + 1],
                p.remote_slot,
                w,
                self.staging,
                out,
            )
        cpu.finalize(op, self.in_degrees, out)

    def _issue(self, b):
        reqs = []
        for sel in self.batches[b]:
            req = self.buffer.rget(sel, self.staging)
            self._count(sel.size)
            if req is not None:
                reqs.append(req)
        return reqs

    def free(self):
        for batch in getattr(self, "batches", []):
            for sel in batch:
                sel.free()
        super().free()


def check_plan(plan: PartitionPlan, comm) -> None:
    """Raise before any data moves if this rank's plan does not fit the job."""
    if plan.num_ranks != comm.size:
        raise PlanMismatchError(
            f"the plan is for {plan.num_ranks} ranks but the job has {comm.size}"
        )
    if plan.rank != comm.rank:
        raise PlanMismatchError(f"rank {comm.rank} holds the plan of rank {plan.rank}")
    prints = comm.allgather(plan.fingerprint())
    if len(set(prints)) != 1:
        groups = {}
        for r, f in enumerate(prints):
            groups.setdefault(f, []).append(r)
        raise PlanMismatchError(
            "ranks hold plans of different partitions (bounds, ps or "
            f"graph differ): {sorted(groups.values())}"
        )
