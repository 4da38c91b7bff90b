"""The base of every design: validation, the input buffer ``x``, one ``__call__``,
statistics and lifetime."""

from __future__ import annotations

import numpy as np

from ..errors import LaunchError
from ..kernels.bf16 import store_rows, sums_for
from ..kernels.reference import check_edge_weights, check_op
from ..partition.plan import PartitionPlan
from ..precision import accumulator, row_dtype, storage


class PlanMismatchError(LaunchError):
    """The ranks of a job hold plans that do not belong together."""


class Design:
    """One rank's aggregation over a symmetric input buffer, set up once per (plan, D)
    (collectively, on every rank) and called once per layer: the caller writes its rows
    into ``x`` and calls ``design(op)``.

    plan  this rank's PartitionPlan (rank r of P)
    comm  mgg.comm.Comm of the job (comm.rank == plan.rank, comm.size == P)
    dim   feature width D
    Subclasses set ``x`` [n_local, D] and implement ``run(op, eps, out)``; ``knobs`` names
    the knobs (mgg.knobs) their constructor takes as keyword options beyond (plan, comm,
    dim, dtype), with mgg.knobs.DEFAULTS' values as defaults.

    dtype  the rows' (float32, float64, or mgg.precision.BF16: on the GPU held as uint16
           words); a design whose kernel rounds its sums itself sets ``stores_rounded``,
           the others ``run`` into float32 sums that ``__call__`` rounds once
    """

    name = "base"
    knobs: tuple[str, ...] = ()
    edge_weights_ok = True  # takes per-call edge weights
    stores_rounded = False  # run() writes bf16 rows itself (else into float32 sums)

    def __init__(self, plan: PartitionPlan, comm, dim: int, dtype=np.float32):
        if int(dim) != dim or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim}")
        self.plan, self.comm, self.dim = plan, comm, int(dim)
        self.dtype = row_dtype(dtype)
        self.buffer = None
        self.borrowed = False  # the buffer is another design's (share): it frees it
        self.x = None
        self.stats = {"calls": 0, "wait_seconds": 0.0, "remote_rows": 0, "remote_bytes": 0}
        self.edge_weights = None  # (local, remote) during a call that gives them
        self.given = None  # the input rows a call gives (reads_in_place), during it

    @classmethod
    def window_choices(cls, comm) -> tuple[str, ...]:
        """The windows worth measuring against each other for this design in the job of
        ``comm``: none, unless the design takes a window (CpuDesign)."""
        return ()

    # what the output holds: this rank's rows
    @property
    def rows(self) -> int:
        return self.plan.num_local_nodes

    @property
    def weighted(self) -> bool:
        return self.plan.has_weights

    @property
    def xp(self):
        return np

    def symmetric_input(self, share: Design | None = None, **options) -> None:
        """Collective: check the plan against the job, then allocate ``x`` in symmetric
        memory (max_local_nodes rows on every rank, the first n_local of them ours), or
        read ``share``'s (a design of this width over the same node ranges: a restricted
        plan's design over its full graph's buffer, which that design frees)."""
        check_plan(self.plan, self.comm)
        if share is not None:
            self.buffer, self.x, self.borrowed = share.buffer, share.x, True
            return
        self.buffer = self.comm.symmetric(
            self.plan.max_local_nodes, self.dim, self.dtype, **options
        )
        self.x = self.buffer.local[: self.plan.num_local_nodes]

    def reads_in_place(self, x) -> bool:
        """Whether a call may read the input rows x from where they are (``__call__``'s
        x) instead of from ``x``: none but one GPU PE alone (CudaPipelined)."""
        return False

    def __call__(self, op: str = "sum", eps: float = 0.0, out=None, weights=None, x=None):
        """Collective: aggregate the rows every rank wrote into its ``x``.

        weights  per-call edge weights (local [El(, H)], remote [Er(, H)]) in the plan's
                 edge order, for a weighted sum (GAT's attention)
        x        the input rows, read where they are (only where ``reads_in_place(x)``)
        returns out [rows, D] (numpy on the CPU, cupy on the GPU)
        """
        if x is not None and not self.reads_in_place(x):
            raise ValueError(f"the {self.name} design reads its input rows from its buffer x")
        check_op(op, self.weighted, weights is not None)
        if weights is not None:
            if not self.edge_weights_ok:
                raise ValueError(f"the {self.name} design takes no per-call edge weights")
            weights = check_edge_weights(
                self.plan, weights, self.dim, self.xp, accumulator(self.dtype)
            )
        shape = (self.rows, self.dim)
        held = self.dtype if self.xp is np else storage(self.dtype)
        if out is None:
            out = self.xp.empty(shape, held)
        elif out.shape != shape or out.dtype != held:
            raise ValueError(f"out is {out.dtype} {out.shape}, expected {held} {shape}")
        sums = out if self.stores_rounded else sums_for(out, self.dtype, self.xp)
        if self.buffer is not None:
            self.buffer.publish()
        self.edge_weights, self.given = weights, x
        try:
            self.run(op, eps, sums)
        finally:
            self.edge_weights = self.given = None
        store_rows(sums, out)
        self.stats["calls"] += 1
        return out

    def run(self, op: str, eps: float, out) -> None:
        raise NotImplementedError

    def count(self, rows: int) -> None:
        """Record ``rows`` remote rows read."""
        self.stats["remote_rows"] += rows
        self.stats["remote_bytes"] += rows * self.dim * self.dtype.itemsize

    def free(self) -> None:
        """Collective: release the symmetric buffer."""
        if self.buffer is not None and not self.borrowed:
            self.buffer.free()
        self.buffer = None
        self.x = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


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
