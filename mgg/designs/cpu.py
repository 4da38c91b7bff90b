"""MGG's pipelined design on CPUs, and the base of the CPU designs.

  shm window  peers' rows are read in place by the RNP kernel (no copies at all);
  rma window  each remote row is fetched once (the halo) in batches of RNPs, with
              ``dist`` batches in flight, while the LNPs of the same step are aggregated;
              each batch is aggregated as soon as it lands.
  msg window  no window: the RNPs and LNPs are cut into ``dist`` chunks; at step s each
              rank sends every peer the rows of its chunk s (two-sided messages,
              mgg.designs.push), then aggregates its local slice s; then each remote
              chunk as it lands. For networks, where one-sided gets wait on the target.

On the CPU, ``dist`` is the number of fetch batches in flight (rma) or of chunks (msg);
on the GPU it is the number of partitions of each kind per warp (mgg.designs.cuda). All
are the paper's interleaving distance: how much remote work is under way while local
work runs.
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from ..comm import WINDOWS
from ..kernels import cpu
from ..knobs import DEFAULTS
from .base import Design
from .push import Pushes


class CpuDesign(Design):
    """A CPU design: the input in an MPI window (``window``: one of ``windows``; default
    the comm's choice) and the numba kernels."""

    knobs = ("window",)
    windows = WINDOWS

    def __init__(self, plan, comm, dim, dtype=np.float32, *, window: str | None = None,
                 share=None):  # fmt: skip
        super().__init__(plan, comm, dim, dtype)
        window = window or self.default_window(comm)
        if window not in self.windows:
            raise ValueError(
                f"the {self.name} design takes window {' or '.join(self.windows)}, not {window}"
            )
        self.symmetric_input(window=window, share=share)
        self.in_degrees = plan.in_degrees()

    @classmethod
    def default_window(cls, comm) -> str:
        """The job's window (comm.window) if this design takes it or the user chose it
        (the constructor then refuses it), else the first of ``windows`` the job can use."""
        if comm.window in cls.windows or comm.window_asked:
            return comm.window
        return next(w for w in cls.windows if w in comm.windows)

    @classmethod
    def window_choices(cls, comm) -> tuple[str, ...]:
        """Those of the job's (comm.window_choices) that this design takes."""
        return tuple(w for w in comm.window_choices if w in cls.windows)

    def weights(self, op: str, which: str):
        """The plan's weights for 'gcn', the call's (if given), else None."""
        if self.edge_weights is not None:
            return self.edge_weights[which == "remote"]
        return self.plan.gcn_weights(which) if op == "gcn" else None

    def local(self, op, k0, k1, out, plan=None) -> None:
        """Aggregate LNPs [k0, k1) from this rank's rows. ``plan``: the design's plan cut
        with another ps (same edges, so the same weights)."""
        p = plan or self.plan
        cpu.accumulate(
            p.lnp_ptr, p.lnp_node, k0, k1, p.local_indices, self.weights(op, "local"), self.x, out
        )

    def remote(self, op, k0, k1, index, rows, out, plan=None) -> None:
        """Aggregate RNPs [k0, k1); remote edge e reads ``rows[index[e]]``."""
        p = plan or self.plan
        cpu.accumulate(p.rnp_ptr, p.rnp_node, k0, k1, index, self.weights(op, "remote"), rows, out)


def _edge_cuts(ptr: np.ndarray, n: int) -> np.ndarray:
    """int64 [m + 1]: partitions [0, K) cut into m <= n non-empty runs of about equal
    edge counts (one empty run when K = 0)."""
    k = ptr.size - 1
    if k == 0:
        return np.zeros(2, np.int64)
    inner = np.searchsorted(ptr, ptr[-1] * np.arange(1, n) // n)
    return np.unique(np.concatenate([[0], inner, [k]])).astype(np.int64)


def _first_new(plan, rnp_cuts: np.ndarray) -> np.ndarray:
    """int64 [nb + 1]: the RNPs of batch b (rnp_cuts[b] to rnp_cuts[b+1]) first read halo
    slots first_new[b] to first_new[b+1]: the halo is in order of first use."""
    ends = plan.rnp_ptr[rnp_cuts]
    first_new = np.zeros(rnp_cuts.size, np.int64)
    if plan.num_remote_edges:
        cummax = np.maximum.accumulate(plan.remote_slot.astype(np.int64))
        first_new[1:] = np.where(ends[1:] > 0, cummax[np.maximum(ends[1:] - 1, 0)] + 1, 0)
    return first_new


_NODE_INDEX: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def node_index(plan, rows: int) -> np.ndarray:
    """int32 (int64 when needed) [Er]: the row of each remote edge's source in the
    node-wide view of a window of ``rows`` rows per rank (pe * rows + row); one array per
    plan and size, shared by every design that reads in place."""
    per_plan = _NODE_INDEX.setdefault(plan, {})
    if rows not in per_plan:
        dtype = np.int32 if plan.num_ranks * rows <= np.iinfo(np.int32).max else np.int64
        index = plan.remote_pe.astype(dtype) * dtype(rows) + plan.remote_row
        index.setflags(write=False)
        per_plan[rows] = index
    return per_plan[rows]


MIN_MESSAGE = 1 << 20  # bytes: smaller chunks cost more in messages than they overlap


class Pipelined(CpuDesign):
    """MGG: LNP/RNP interleaving, each remote row fetched once per call. rma: ``dist``
    fetch batches of ``BATCH_RNP`` RNPs in flight; msg: the RNPs (and the LNPs) cut
    into ``dist`` chunks of equal edge counts (fewer where a peer's rows of a chunk
    would be under MIN_MESSAGE bytes), each peer's rows of a chunk one message."""

    name = "pipelined"
    knobs = ("window", "dist")
    BATCH_RNP = 8192  # RNPs per fetch batch (rma): fewer batches than partitions

    def __init__(
        self,
        plan,
        comm,
        dim,
        dtype=np.float32,
        *,
        window=None,
        dist: int = DEFAULTS.dist,
        share=None,
    ):
        if dist < 1:
            raise ValueError(f"dist must be >= 1, got {dist}")
        super().__init__(plan, comm, dim, dtype, window=window, share=share)
        self.dist = int(dist)
        p = plan
        self.direct = self.buffer.mode == "shm"
        if self.direct:
            # read peers in place: the row of each remote edge in the node-wide view
            self.remote_index = node_index(p, self.buffer.rows)
            return
        self.batches = []
        self.pushes = None
        if self.buffer.mode == "msg":
            # dist chunks, fewer where a peer's share of one would be under MIN_MESSAGE
            peers = max(1, np.unique(p.halo_pe).size)
            per_peer = p.num_halo * self.dim * self.dtype.itemsize // peers
            chunks = max(1, min(self.dist, per_peer // MIN_MESSAGE))
            self.rnp_cuts = _edge_cuts(p.rnp_ptr, chunks)
            self.lnp_cuts = _edge_cuts(p.lnp_ptr, chunks)
            self.pushes = Pushes(p, comm, _first_new(p, self.rnp_cuts), self.dim, self.dtype)
            return
        nb = max(1, -(-p.rnp_node.size // self.BATCH_RNP))
        self.rnp_cuts = (np.arange(nb + 1) * p.rnp_node.size) // nb
        self.lnp_cuts = (np.arange(nb + 1) * p.lnp_node.size) // nb
        first_new = _first_new(p, self.rnp_cuts)
        self.staging = np.empty((p.num_halo, self.dim), self.dtype)
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
            self.local(op, 0, p.lnp_node.size, out)
            if p.num_remote_edges:
                self.remote(op, 0, p.rnp_node.size, self.remote_index, self.buffer.node_view, out)
                self.count(p.num_halo)  # read in place: each peer row at least once
            cpu.finalize(op, self.in_degrees, out)
            return
        if self.pushes is not None:
            self._run_pushed(op, out)
            return
        nb = len(self.batches)
        pending = [self._issue(b) for b in range(min(self.dist, nb))]
        for b in range(nb):
            self.local(op, self.lnp_cuts[b], self.lnp_cuts[b + 1], out)
            t0 = time.perf_counter()
            for req in pending.pop(0):
                req.Wait()
            self.stats["wait_seconds"] += time.perf_counter() - t0
            if b + self.dist < nb:
                pending.append(self._issue(b + self.dist))
            self.remote(
                op, self.rnp_cuts[b], self.rnp_cuts[b + 1], p.remote_slot, self.staging, out
            )
        cpu.finalize(op, self.in_degrees, out)

    def _run_pushed(self, op, out):
        """The msg window: post every receive; push chunk s to the peers, then
        aggregate local slice s (each send also drives MPI's progress); then aggregate
        each chunk in order as it lands (in order: sums then do not depend on arrival)."""
        p, push, mpi = self.plan, self.pushes, self.pushes.mpi
        recvs = push.post_receives()
        sends, slices = [], self.lnp_cuts.size - 1
        for s in range(max(push.steps, slices)):  # the peers may cut fewer chunks
            sends += push.send_step(s, self.x)
            if s < slices:
                self.local(op, self.lnp_cuts[s], self.lnp_cuts[s + 1], out)
        for b in range(self.rnp_cuts.size - 1):
            t0 = time.perf_counter()
            mpi.Request.Waitall(recvs[b])
            self.stats["wait_seconds"] += time.perf_counter() - t0
            self.remote(
                op, self.rnp_cuts[b], self.rnp_cuts[b + 1], push.remote_index, push.staging, out
            )
        self.count(p.num_halo)
        t0 = time.perf_counter()
        mpi.Request.Waitall(sends)
        self.stats["wait_seconds"] += time.perf_counter() - t0
        cpu.finalize(op, self.in_degrees, out)

    def _issue(self, b):
        reqs = []
        for sel in self.batches[b]:
            req = self.buffer.rget(sel, self.staging)
            self.count(sel.size)
            if req is not None:
                reqs.append(req)
        return reqs

    def free(self):
        for batch in getattr(self, "batches", []):
            for sel in batch:
                sel.free()
        self.batches = []
        if getattr(self, "pushes", None) is not None:
            self.pushes.free()
            self.pushes = None
        super().free()
