"""DistGraph: what a layer sees of the distributed graph.

It holds this rank's plan (and the transposed plan for backward passes), the comm, the
backend, and two aggregation designs per (direction, width) (a symmetric plan's two
directions share them), each with its own symmetric input buffer, used in turn: a rank
may then overwrite a buffer only after every peer passed the other buffer's publish
barrier, which is after their last read of it. With one buffer, a fast rank could
overwrite rows a slow peer is still reading.
"""

from __future__ import annotations

import time

import numpy as np

from .backend import Backend, assign, get_backend
from .comm.mpi import WINDOWS
from .designs import knobs_for
from .designs.halo import EdgeTranspose, HaloExchange
from .errors import InputError
from .graph.core import Graph
from .hashing import key64
from .kernels import aggregate
from .partition import PartitionPlan, build_plan

KNOBS = ("ps", "dist", "threads", "wpb", "window")  # what configure() and the tuner set


def check_config(config) -> dict:
    """``config`` if it is a dict of knobs in KNOBS with positive integer values (window:
    'shm', 'rma' or 'msg'), or None; else InputError saying which key or value is wrong."""
    if not isinstance(config, dict):
        raise InputError(f'a configuration is a JSON object like {{"ps": 32}}, got {config!r}')
    bad = sorted(set(config) - set(KNOBS))
    if bad:
        raise InputError(f"unknown configuration key {bad[0]!r}: the knobs are {', '.join(KNOBS)}")
    for knob, value in config.items():
        if knob == "window":
            if value is not None and value not in WINDOWS:
                raise InputError(f"window must be one of {', '.join(WINDOWS)}, got {value!r}")
        elif value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1
        ):
            raise InputError(f"{knob} must be a positive integer, got {value!r}")
    return config


class DistGraph:
    """One rank's view of a graph for training.

    plan    this rank's PartitionPlan (with its transposed plan)
    comm    mgg.comm.Comm, or None for a single process without MPI
    design  aggregation design for P > 1 (mgg.designs: 'pipelined', 'bulk_halo', 'direct')
    backend 'cpu' or 'cuda' (or a Backend)
    knobs   design options (cpu: dist, batch_rnp, window; cuda: dist, wpb, mode)
    """

    def __init__(
        self,
        plan: PartitionPlan,
        comm=None,
        *,
        design: str = "pipelined",
        backend: str | Backend = "cpu",
        dtype=np.float32,
        **knobs,
    ):
        size = 1 if comm is None else comm.size
        if plan.num_ranks != size:
            raise ValueError(f"the plan is for {plan.num_ranks} ranks but the job has {size}")
        self.backend = get_backend(backend)
        self.design_cls = self.backend.design(design)
        unknown = sorted(set(knobs) - set(self.design_cls.knobs))
        if unknown:
            raise ValueError(
                f"the {design} design of the {self.backend.name} backend takes "
                f"{', '.join(self.design_cls.knobs) or 'no options'}, not {', '.join(unknown)}"
            )
        self.plan, self.comm, self.design, self.knobs = plan, comm, design, knobs
        self.dtype = np.dtype(dtype)
        self.xp = self.backend.xp
        self._designs: dict = {}
        self._turn: dict = {}
        self.stats = {"aggregations": 0, "remote_bytes": 0, "setup_seconds": 0.0}
        self._halo = self._edge_transpose = None
        self.cache: dict = {}  # what layers derive from the plan once (index tensors)
        self.seed, self.step, self._stream = 0, 0, 0

    @classmethod
    def build(
        cls, graph: Graph, comm=None, ps: int = 16, *, split: str = "edges", **kw
    ) -> DistGraph:
        """Partition ``graph`` for the job of ``comm`` (node_split's ``split`` mode) and
        keep this rank's plan."""
        size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
        return cls(build_plan(graph, size, ps, rank=rank, mode=split), comm, **kw)

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

    def aggregate(
        self, x, op: str = "sum", *, transpose: bool = False, eps: float = 0.0, weights=None
    ):
        """Aggregate x [n_local, D] over the graph (or its transpose); returns [n_local, D].

        op: 'sum', 'mean', 'gcn' (the plan's edge weights) or 'gin' ((1+eps)·x + sum).
        weights: per-call edge weights (local [El(, H)], remote [Er(, H)]) in the order of
        the plan used, for a weighted 'sum' (H heads of D / H columns each).
        Collective when P > 1.
        """
        plan = self.plan.transposed if transpose else self.plan
        d = x.shape[1]
        self.stats["aggregations"] += 1
        if self.size == 1 and not self.backend.gpu:  # no symmetric memory needed
            x = np.ascontiguousarray(x, dtype=self.dtype)
            return aggregate(plan, x, op, eps=eps, weights=weights)
        des = self._design(transpose, d)
        if x is not des.x:
            assign(des.x, x)
        before = des.stats["remote_bytes"]
        out = des(op, eps, weights=weights)
        self.stats["remote_bytes"] += des.stats["remote_bytes"] - before
        return out

    @property
    def halo(self) -> HaloExchange:
        """Collective on first use: the exchange of this rank's halo rows (forward plan)."""
        if self._halo is None:
            self._halo = HaloExchange(self.plan, self.comm)
        return self._halo

    @property
    def edge_transpose(self) -> EdgeTranspose:
        """Collective on first use: per-edge values into the transposed plan's order."""
        if self._edge_transpose is None:
            self._edge_transpose = EdgeTranspose(self.plan, self.comm)
        return self._edge_transpose

    # ---- rank-invariant dropout keys ----------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Key this step's dropout masks: the k-th dropout call of step s draws stream k."""
        self.step, self._stream = int(step), 0

    def next_dropout_key(self) -> np.uint64:
        """The key of the next dropout mask of this step (same sequence on every rank)."""
        key = key64(self.seed, self.step, self._stream)
        self._stream += 1
        return key

    @property
    def config(self) -> dict:
        """The tunable knobs in force: ps, dist and threads and window (cpu, with peers)
        or wpb (cuda)."""
        import numba

        out = {"ps": self.plan.ps, "dist": int(self.knobs.get("dist", 4))}
        if self.backend.gpu:
            out["wpb"] = int(self.knobs.get("wpb", 4))
        else:
            out["threads"] = numba.get_num_threads()
            if self.comm is not None and self.size > 1 and "window" in self.design_cls.knobs:
                out["window"] = self.knobs.get("window") or self.design_cls.default_window(
                    self.comm
                )
        return out

    @property
    def window_choices(self) -> tuple[str, ...]:
        """The windows worth measuring against each other for this job's design
        (Design.window_choices)."""
        return () if self.comm is None else self.design_cls.window_choices(self.comm)

    def configure(self, **config) -> None:
        """Collective: switch to another configuration of the knobs ``KNOBS`` (the
        tuner's: ps, dist, threads, wpb, positive integers; window, 'shm', 'rma' or 'msg').
        The CSRs are kept; only the neighbor partitions and the designs are rebuilt."""
        import numba

        ps, dist, threads, wpb, window = (check_config(config).get(k) for k in KNOBS)
        if threads is not None:
            if not 1 <= threads <= numba.config.NUMBA_NUM_THREADS:
                raise InputError(
                    f"threads must be in [1, {numba.config.NUMBA_NUM_THREADS}], got {threads}"
                )
            numba.set_num_threads(int(threads))
        for knob, value in (("dist", dist), ("wpb", wpb)):
            if value is not None and knob not in self.design_cls.knobs:
                raise InputError(
                    f"{knob} is not a knob of the {self.design} design of the "
                    f"{self.backend.name} backend"
                )
        if window is not None:
            if "window" not in self.design_cls.knobs or self.comm is None:
                raise InputError(f"the {self.design} design of this job takes no window")
            if window not in self.design_cls.windows:
                raise InputError(f"the {self.design} design takes no window {window!r}")
            if window not in self.comm.windows:
                raise InputError(f"window {window} needs every rank on one node")
            if window == self.design_cls.default_window(self.comm) and "window" not in self.knobs:
                window = None  # the default: the designs already open are it
        new = {"dist": dist, "wpb": wpb, "window": window}
        knobs = {**self.knobs, **knobs_for(self.design_cls, new)}
        if (ps is None or ps == self.plan.ps) and knobs == self.knobs:
            return  # the designs already open are this configuration's
        self.free()
        if ps is not None:
            self.plan = self.plan.with_ps(int(ps))
        self.knobs = knobs

    def _design(self, transpose: bool, dim: int):
        """The next of the two designs for this direction and width (collective setup)."""
        key = (transpose and not self.plan.symmetric, dim)  # a symmetric plan is its own
        if key not in self._designs:
            t0 = time.perf_counter()
            plan = self.plan.transposed if transpose else self.plan
            self._designs[key] = [
                self.design_cls(plan, self.comm, dim, self.dtype, **self.knobs) for _ in range(2)
            ]
            self._turn[key] = 0
            self.stats["setup_seconds"] += time.perf_counter() - t0
        turn = self._turn[key]
        self._turn[key] = 1 - turn
        return self._designs[key][turn]

    def halo_rows(self, transpose: bool = False) -> int:
        """Distinct remote rows this rank fetches per aggregation."""
        return (self.plan.transposed if transpose else self.plan).num_halo

    def free(self) -> None:
        """Collective: release every design's symmetric buffer."""
        for pair in self._designs.values():
            for des in pair:
                des.free()
        self._designs.clear()
