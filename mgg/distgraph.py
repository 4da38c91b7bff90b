"""DistGraph: what a layer sees of the distributed graph.

It holds this rank's plan (and the transposed plan for backward passes), the comm, the
backend, and the aggregation designs per (direction, width) (a symmetric plan's two
directions share them), each with its own symmetric input buffer. A rank must not
overwrite its rows while a slow peer still reads them: on GPUs with peers two designs are
used in turn (a rank writes a buffer only after every peer passed the other buffer's
publish barrier, after their last read of it; no host barrier joins the stream; one PE
alone reads its buffer in its stream's order: one design), on CPUs one,
with a barrier before its rows are written again (every read of the last call ended
before its rank's barrier): the window's pages once, not twice (papers100m:scale=0.05
at P = 4: 173 MB of each rank's RSS).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from . import precision
from .backend import Backend, assign, get_backend
from .designs.halo import EdgeTranspose, HaloExchange
from .errors import InputError
from .graph.core import Graph, job_graph
from .hashing import key64
from .kernels import aggregate
from .knobs import SPECS, TUNABLE, Knobs
from .partition import PartitionPlan, build_plan


class DistGraph:
    """One rank's view of a graph for training.

    plan    this rank's PartitionPlan (with its transposed plan)
    comm    mgg.comm.Comm, or None for a single process without MPI
    design  aggregation design for P > 1 (mgg.designs: 'pipelined', 'bulk_halo', 'direct')
    backend 'cpu' or 'cuda' (or a Backend)
    knobs   mgg.knobs.Knobs, or knob keywords (ps=, dist=, window=, dtype=, ...): those
            this backend and design take; a ps other than the plan's re-cuts it
    dtype   the rows' dtype: the knob's (float32 or bfloat16); the cpu backend also
            aggregates float64 (np.float64: for gradcheck)
    kind    the graph's kind (mgg.graph.core.GRAPH_KINDS), what layers check; ``source``
            the graph it was made from (job_graph's input), kept to ``derive`` other
            kinds over the same node ranges
    """

    def __init__(
        self,
        plan: PartitionPlan,
        comm=None,
        *,
        design: str = "pipelined",
        backend: str | Backend = "cpu",
        dtype=None,
        knobs: Knobs | None = None,
        kind: str = "as_is",
        source: Graph | None = None,
        **given,
    ):
        size = 1 if comm is None else comm.size
        if plan.num_ranks != size:
            raise ValueError(f"the plan is for {plan.num_ranks} ranks but the job has {size}")
        self.backend = get_backend(backend)
        self.design_cls = self.backend.design(design)
        self.takes = self.backend.takes(self.design_cls)
        self.job = self.backend.job(design)
        if dtype is not None and precision.row_dtype(dtype) != np.float64:
            given["dtype"], dtype = dtype, None  # a knob's value
        knobs = Knobs.parse(given, takes=self.takes, job=self.job, base=knobs)
        if "ps" in knobs.given and knobs.ps != plan.ps:
            plan = plan.with_ps(knobs.ps)
        self.plan, self.comm, self.design = plan, comm, design
        self.knobs = replace(knobs, ps=plan.ps, window=self._window(knobs.window))
        self._threads(self.knobs.threads)
        self.dtype = precision.row_dtype(self.knobs.dtype if dtype is None else dtype)
        self.xp = self.backend.xp
        self._designs: dict = {}
        self._turn: dict = {}
        self.stats = {"aggregations": 0, "remote_bytes": 0, "setup_seconds": 0.0}
        self._halo = self._edge_transpose = None
        self.plan_arrays = None  # mgg.torch's PlanArrays: what layers read of the plan
        self.kind, self.source = kind, source
        self._derived: dict = {}
        # a restricted graph (restricted): its output rows (int64 [L]) and the graph it
        # restricts, whose designs its backward passes use
        self.rows, self.full = None, None
        self.keys = self  # whose (seed, step, dropout_stream) key the masks (derive's: its base's)
        self.seed, self.step, self.dropout_stream = 0, 0, 0
        self.job_seed = None  # the seed before torch's joined it (mgg.torch.rows' dropout)
        # mgg.torch's GradSync, on g.keys: the gradient sync at the end of a backward pass
        self.grad_sync = None
        # a captured step's keys: int64 [SLOTS] on the device that dropout kernels read
        # their key from, set while its body runs (mgg.torch.graphs); None: by value
        self.key_slots = None

    @classmethod
    def build(
        cls, graph: Graph, comm=None, *, knobs: Knobs | None = None, design="pipelined", **kw
    ) -> DistGraph:
        """Partition ``graph`` for the job of ``comm`` (cut with the knobs' ps and split)
        and keep this rank's plan. ``kw``: knob keywords and DistGraph's other options."""
        size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
        given = {k: kw.pop(k) for k in list(kw) if k in SPECS and k != "dtype"}
        knobs = Knobs.parse(given, base=knobs)
        plan = build_plan(graph, size, knobs.ps, rank=rank, split=knobs.split)
        kw.setdefault("source", graph if graph.kind == "as_is" else None)
        return cls(plan, comm, design=design, knobs=knobs, kind=graph.kind, **kw)

    def derive(self, kind: str, needs: str) -> DistGraph:
        """Collective on first use: this graph as ``kind`` (job_graph of its source) over
        the same node ranges, so rows stay where they are; its dropout keys are this
        graph's. ``needs``: who asks, for the error when there is no source to derive
        from (a sharded dataset keeps only its own kind)."""
        if kind == self.kind:
            return self
        if self.rows is not None:
            raise InputError(
                f"{needs} needs the graph {kind!r}, but this graph is restricted to some "
                "rows (the output layer's, for the labeled rows only): prepare the job for "
                f"the model (prepare(..., model={kind!r}))"
            )
        if kind not in self._derived:
            if self.source is None:
                raise InputError(
                    f"{needs} needs the graph {kind!r}, but this job's graph is "
                    f"{self.kind!r} and its source was not kept: prepare the job for the "
                    f"layer (prepare(..., model={kind!r}), or partition with --model "
                    f"{kind})"
                )
            plan = build_plan(
                job_graph(self.source, kind),
                self.size,
                self.plan.ps,
                rank=self.rank,
                bounds=self.plan.bounds,
            )
            g = DistGraph(
                plan,
                self.comm,
                design=self.design,
                backend=self.backend,
                dtype=self.dtype if self.dtype == np.float64 else None,
                knobs=self.knobs,
                kind=kind,
            )
            g.keys = self.keys
            self._derived[kind] = g
        return self._derived[kind]

    def restricted(self, rows, key: str) -> DistGraph:
        """This graph with the in-edges of ``rows`` only (local row ids int [L]; kept as
        ``key``, so that later calls with that key return it): its aggregations give those
        rows their sums and the others zero, and the layers that pick rows (GCNConv,
        SAGEConv) return only rows ``rows`` ([L, out]): an output layer computed for the
        labeled rows only, over fewer edges and fewer halo rows. Its forward designs read
        this graph's buffers, its backward passes run over this graph's transposed plan
        and designs; its counts are this graph's. Collective on first use of its designs."""
        key = ("rows", key)
        if key not in self._derived:
            g = DistGraph(
                self.plan.restricted(rows),
                self.comm,
                design=self.design,
                backend=self.backend,
                dtype=self.dtype if self.dtype == np.float64 else None,
                knobs=self.knobs,
                kind=self.kind,
            )
            g.keys, g.stats, g.full = self.keys, self.stats, self
            g.rows = np.array(rows, np.int64)
            self._derived[key] = g
        return self._derived[key]

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
        given = x if des.reads_in_place(x) else None
        if given is None and x is not des.x:
            assign(des.x, x)
        before = des.stats["remote_bytes"]
        out = des(op, eps, weights=weights, x=given)
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
        k = self.keys
        k.step, k.dropout_stream = int(step), 0

    def next_dropout_key(self) -> tuple[np.uint64, object]:
        """(key, key_at) of the next dropout mask of this step (same sequence on every
        rank): key_at is None, or the device slot [1] that holds the key while key_slots
        is set (a step being captured reads its keys from there)."""
        k = self.keys
        i, key = k.dropout_stream, key64(k.seed, k.step, k.dropout_stream)
        k.dropout_stream += 1
        if k.key_slots is None:
            return key, None
        if i >= len(k.key_slots):
            raise RuntimeError(f"a captured step draws more than {len(k.key_slots)} dropout masks")
        return key, k.key_slots[i : i + 1]

    @property
    def config(self) -> dict:
        """The tunable knobs in force that this job takes (mgg.knobs.TUNABLE: ps, dist and
        threads, and window with peers, on cpu; ps, dist, wpb on cuda), threads as numba
        runs them; the JSON form a checkpoint keeps and --config takes."""
        import numba

        out = {}
        for k in TUNABLE:
            if k not in self.takes or (k == "window" and self.knobs.window is None):
                continue
            out[k] = numba.get_num_threads() if k == "threads" else getattr(self.knobs, k)
        return out

    @property
    def window_choices(self) -> tuple[str, ...]:
        """The windows worth measuring against each other for this job's design
        (Design.window_choices)."""
        return () if self.comm is None else self.design_cls.window_choices(self.comm)

    def configure(self, knobs: Knobs | None = None, **given) -> None:
        """Collective: switch to other knobs (those a Knobs was given, and keywords: ps=,
        dist=, threads=, wpb=, window=), checked as they enter; the others stay. The CSRs
        are kept; only the neighbor partitions and the designs are rebuilt, and only when
        they change."""
        if knobs is not None:
            given = {**{k: getattr(knobs, k) for k in knobs.given}, **given}
        new = Knobs.parse(given, takes=self.takes, job=self.job, base=self.knobs)
        for k in ("split", "order"):  # chosen when the graph is partitioned
            if getattr(new, k) != getattr(self.knobs, k):
                raise InputError(
                    f"{k} {getattr(new, k)!r}: this graph was partitioned with {k} "
                    f"{getattr(self.knobs, k)!r}; a {k} is chosen when the graph is partitioned"
                )
        new = replace(new, window=self._window(new.window))
        self._threads(new.threads)
        if replace(new, threads=None) == replace(self.knobs, threads=None):
            self.knobs = new
            return  # the designs already open are this configuration's
        self.free()
        self.plan = self.plan.with_ps(new.ps)
        self.knobs = new

    def _window(self, window: str | None) -> str | None:
        """The window this job's designs use (None where they take none, or alone): the
        one asked for, checked against the design and the job's placement, else the
        design's default."""
        if "window" not in self.takes or self.comm is None or self.size == 1:
            return None
        if window is None:
            return self.design_cls.default_window(self.comm)
        if window not in self.design_cls.windows:
            raise InputError(
                f"window {window!r}: the {self.design} design takes "
                f"{', '.join(self.design_cls.windows)}"
            )
        if window not in self.comm.windows:
            raise InputError(f"window {window!r} needs every rank on one node")
        return window

    @staticmethod
    def _threads(threads: int | None) -> None:
        """Run numba's kernels on ``threads`` threads (None: leave numba's setting)."""
        if threads is not None:
            import numba

            numba.set_num_threads(threads)

    def _design(self, transpose: bool, dim: int):
        """The design whose buffer this direction and width's rows go to next, safe to
        write (collective; set up on first use)."""
        if self.full is not None:
            return self._restricted_design(transpose, dim)
        key = (transpose and not self.plan.symmetric, dim)  # a symmetric plan is its own
        if key not in self._designs:
            t0 = time.perf_counter()
            plan = self.plan.transposed if transpose else self.plan
            options = self.knobs.options(self.design_cls.knobs)
            self._designs[key] = [  # on GPUs with peers, two in turn (the docstring)
                self.design_cls(plan, self.comm, dim, self.dtype, **options)
                for _ in range(2 if self.backend.gpu and self.size > 1 else 1)
            ]
            self._turn[key] = 0
            self.stats["setup_seconds"] += time.perf_counter() - t0
        elif not self.backend.gpu:
            buffer = self._designs[key][0].buffer
            if buffer is not None and buffer.mode != "msg":  # peers read it in place
                self.comm.barrier()
        pair = self._designs[key]
        turn = self._turn[key]
        self._turn[key] = (turn + 1) % len(pair)
        return pair[turn]

    def _restricted_design(self, transpose: bool, dim: int):
        """A restricted graph's design: backward, the full graph's (its transposed plan is
        the full one); forward, one over its own plan that reads the full graph's buffer
        of this width, taken in the full graph's turn (its barrier, its alternation), so
        that it holds no window of its own."""
        theirs = self.full._design(transpose, dim)
        if transpose:
            return theirs
        key = (False, dim)
        pair = self.full._designs[(False, dim)]
        if key not in self._designs:
            t0 = time.perf_counter()
            options = self.knobs.options(self.design_cls.knobs)
            self._designs[key] = [
                self.design_cls(self.plan, self.comm, dim, self.dtype, share=d, **options)
                for d in pair
            ]
            self.stats["setup_seconds"] += time.perf_counter() - t0
        return self._designs[key][pair.index(theirs)]

    def halo_rows(self, transpose: bool = False) -> int:
        """Distinct remote rows this rank fetches per aggregation."""
        return (self.plan.transposed if transpose else self.plan).num_halo

    def free(self) -> None:
        """Collective: release every design's symmetric buffer (and the derived graphs',
        first: a restricted graph's designs read this graph's buffers)."""
        for g in self._derived.values():
            g.free()
        self._derived.clear()
        for pair in self._designs.values():
            for des in pair:
                des.free()
        self._designs.clear()
