"""DistGraph: what a layer sees of the distributed graph.

It holds this rank's plan (and the transposed plan for backward passes), the comm, and
two aggregation designs per (direction, width), each with its own symmetric input
buffer, used in turn: a rank may then overwrite a buffer only after every peer passed the
other buffer's publish barrier, which is after their last read of it. With one buffer, a
fast rank could overwrite rows a slow peer is still reading.
"""

from __future__ import annotations

import numpy as np

from ..graph.core import Graph
from ..kernels import aggregate
from ..partition import PartitionPlan, build_plan
from .backend import assign


class DistGraph:
    """One rank's view of a graph for training.

    plan    this rank's PartitionPlan (with its transposed plan)
    comm    mgg.comm.Comm, or None for a single process without MPI
    design  aggregation design for P > 1 ('pipelined', 'bulk_halo', 'direct')
    backend 'cpu' (numpy, numba, MPI windows) or 'cuda' (cupy, the CUDA kernel, NVSHMEM)
    knobs   design options (cpu: dist, batch_rnp, window; cuda: dist, wpb, mode)
    """

    def __init__(
        self,
        plan: PartitionPlan,
        comm=None,
        *,
        design: str = "pipelined",
        backend: str = "cpu",
        dtype=np.float32,
        **knobs,
    ):
        size = 1 if comm is None else comm.size
        if plan.num_ranks != size:
            raise ValueError(f"the plan is for {plan.num_ranks} ranks but the job has {size}")
        if backend not in ("cpu", "cuda"):
            raise ValueError(f"backend must be 'cpu' or 'cuda', got {backend!r}")
        if backend == "cuda" and design != "pipelined":
            raise ValueError(f"the cuda backend runs the pipelined design, not {design!r}")
        self.plan, self.comm, self.design, self.knobs = plan, comm, design, knobs
        self.backend = backend
        self.dtype = np.dtype(dtype)
        if backend == "cuda":
            import cupy

            self.xp = cupy
        else:
            self.xp = np
        self._aggs: dict = {}
        self._turn: dict = {}
        self.stats = {"aggregations": 0, "remote_bytes": 0, "setup_seconds": 0.0}

    @classmethod
    def build(cls, graph: Graph, comm=None, ps: int = 16, **kw) -> DistGraph:
        """Partition ``graph`` for the job of ``comm`` and keep this rank's plan."""
        size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
        return cls(build_plan(graph, size, ps, rank=rank), comm, **kw)

    @property
    def num_local_nodes(self) -> int:
        return self.plan.num_local_nodes

    @property
    def lb(self) -> int:
        return self.plan.lb

    @property
    def ub(self) -> int:
        return self.plan.ub

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def size(self) -> int:
        return self.plan.num_ranks

    def propagate(self, x, op: str = "sum", *, transpose: bool = False, eps: float = 0.0):
        """Aggregate x [n_local, D] over the graph (or its transpose); returns [n_local, D].

        op: 'sum', 'mean', 'gcn' (the plan's edge weights) or 'gin' ((1+eps)·x + sum).
        Collective when P > 1.
        """
        plan = self.plan.transposed if transpose else self.plan
        d = x.shape[1]
        self.stats["aggregations"] += 1
        if self.backend == "cpu" and (self.comm is None or self.size == 1):
            x = np.ascontiguousarray(x, dtype=self.dtype)
            return aggregate(plan, x, op, eps=eps)
        agg = self._aggregator(transpose, d)
        if x is not agg.x:
            assign(agg.x, x)
        before = agg.stats["remote_bytes"]
        out = agg(op, eps)
        self.stats["remote_bytes"] += agg.stats["remote_bytes"] - before
        return out

    @property
    def config(self) -> dict:
        """The tunable knobs in force: ps, dist and threads (cpu) or wpb (cuda)."""
        import numba

        out = {"ps": self.plan.ps, "dist": int(self.knobs.get("dist", 4))}
        if self.backend == "cuda":
            out["wpb"] = int(self.knobs.get("wpb", 4))
        else:
            out["threads"] = numba.get_num_threads()
        return out

    def configure(
        self,
        ps: int | None = None,
        dist: int | None = None,
        threads: int | None = None,
        wpb: int | None = None,
    ) -> None:
        """Collective: switch to another configuration (the tuner's knobs). The CSRs are
        kept; only the neighbor partitions and the aggregators are rebuilt."""
        import numba

        if threads is not None:
            if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
                raise ValueError(
                    f"threads must be in [1, {numba.config.NUMBA_NUM_THREADS}], got {threads}"
                )
            numba.set_num_threads(int(threads))
        if wpb is not None:
            if self.backend != "cuda":
                raise ValueError("wpb (warps per block) is a knob of the cuda backend")
            self.free()
            self.knobs = {**self.knobs, "wpb": int(wpb)}
        if ps is None and dist is None:
            return
        self.free()
        if ps is not None:
            self.plan = self.plan.with_ps(int(ps))
        if dist is not None:
            if self.design != "pipelined":
                raise ValueError(f"dist applies to the pipelined design, not {self.design}")
            self.knobs = {**self.knobs, "dist": int(dist)}

    def _aggregator(self, transpose: bool, dim: int):
        """The next of the two designs for this direction and width (collective setup)."""
        key = (transpose, dim)
        if key not in self._aggs:
            import time

            t0 = time.perf_counter()
            plan = self.plan.transposed if transpose else self.plan
            comm = self.comm if self.size > 1 else None
            if self.backend == "cuda":
                from ..kernels.cuda.design import CUDA_DESIGNS as DESIGNS
            else:
                from ..baselines import DESIGNS
            self._aggs[key] = [
                DESIGNS[self.design](plan, comm, dim, self.dtype, **self.knobs) for _ in range(2)
            ]
            self._turn[key] = 0
            self.stats["setup_seconds"] += time.perf_counter() - t0
        turn = self._turn[key]
        self._turn[key] = 1 - turn
        return self._aggs[key][turn]

    def halo_rows(self, transpose: bool = False) -> int:
        """Distinct remote rows this rank fetches per aggregation."""
        return (self.plan.transposed if transpose else self.plan).num_halo

    def free(self) -> None:
        """Collective: release every aggregator's symmetric buffer."""
        for pair in self._aggs.values():
            for agg in pair:
                agg.free()
        self._aggs.clear()
