"""The check harness (``mgg check``): verify designs against the scipy oracle and time
them round-robin (mgg.harness.timing)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..arrays import to_host
from ..atomic import atomic_write, make_folder
from ..backend import assign, get_backend
from ..graph.core import Graph
from ..graph.dataset import Dataset, random_features
from ..kernels import OPS, reference
from ..knobs import DEFAULTS, Knobs
from ..partition import PartitionPlan, build_plan
from ..partition import order as node_order
from ..partition.order import Order
from ..partition.shards import ShardedDataset
from ..precision import accumulator, from_storage, is_bf16, row_dtype
from .timing import time_round_robin

TOLERANCE = 1e-5  # max |got - scipy| / max(1, max |scipy|)
# bf16 rows: one rounding of the output (2^-8 of its magnitude) beyond float32's
TOLERANCE_BF16 = 2.0**-8 + TOLERANCE
EPS = 0.1  # GIN's eps in checks
ONE_CALL = 2**31  # values MPI's counts reach: rank 0 gathers fewer in one call
ROUND = 2**26  # else that many values a round


def tolerance(dtype) -> float:
    """The largest relative_error a correct design of rows of ``dtype`` may show."""
    return TOLERANCE_BF16 if is_bf16(dtype) else TOLERANCE


def gather_rows(comm, out, dtype=np.float32) -> np.ndarray | None:
    """This job's whole [N, D] output (rows of ``dtype``) on rank 0 as the float type
    they sum in (bf16 widens exactly to float32), None elsewhere; collective. Rank 0
    receives into the one [N, D] array, or where that is ONE_CALL values or more in
    rounds through a buffer of at most ROUND values."""
    rows = np.ascontiguousarray(from_storage(to_host(out), dtype), accumulator(dtype))
    shape, p, lead = rows.shape[1:], comm.size, comm.rank == 0
    width = max(1, int(np.prod(shape)))
    counts = np.asarray(comm.allgather(rows.shape[0]), np.int64)
    whole = np.empty((int(counts.sum()) if lead else 0, *shape), rows.dtype)
    starts, most = np.cumsum(counts) - counts, int(counts.max(initial=0))
    one = counts.sum() * width < ONE_CALL  # each rank's rows straight into place
    step = max(1, most if one else ROUND // (p * width))
    for a in range(0, most, step):
        took = np.clip(counts - a, 0, step)  # each rank's rows this round
        recv = whole if one else np.empty((int(took.sum()) if lead else 0, *shape), rows.dtype)
        send = np.zeros(p, np.int64)
        send[0] = took[comm.rank]
        comm.alltoallv(rows[a : a + send[0]], send, recv, took if lead else np.zeros(p, np.int64))
        if lead and not one:  # the round's rows of each rank into their place
            for r, at in zip(range(p), np.cumsum(took) - took, strict=True):
                whole[starts[r] + a : starts[r] + a + took[r]] = recv[at : at + took[r]]
    return whole if lead else None


def relative_error(got, want, ids=None, chunk: int = 2**16) -> float:
    """max |got - want| / max(1, max |want|), a ``chunk`` of rows at a time; ``ids``: the
    rows of ``want`` that got's rows are (int [len(got)]), else the same rows."""
    err = top = 0.0
    for a in range(0, len(got), chunk):
        w = want[a : a + chunk] if ids is None else want[ids[a : a + chunk]]
        err = max(err, float(np.abs(got[a : a + chunk] - w).max(initial=0.0)))
    for a in range(0, len(want), chunk):
        top = max(top, float(np.abs(want[a : a + chunk]).max(initial=0.0)))
    return err / max(1.0, top)


def verify_and_time(
    backend, comm, names, plan, x, op: str, *, ref=None, repeat: int = 5, knobs=DEFAULTS,
    order: Order | None = None, save=None,
) -> list[dict]:  # fmt: skip
    """Set up the designs ``names`` of ``backend`` on this rank's ``plan`` (each with the
    ``knobs`` it takes; rows of ``knobs.dtype``), write x [n, D] and call each once,
    gather each output on rank 0 in turn (compared with ref [N, D], by original node id
    under the plan's node ``order``, which rank 0 holds; ``save(name, window, out)``
    there: out [N, D] by original id, window the design's or None), then time them
    round-robin. Collective. Returns the runs, one dict per design."""
    backend = get_backend(backend)
    dtype = row_dtype(knobs.dtype)
    designs = {}
    try:
        for name in names:
            cls = backend.design(name)
            designs[name] = cls(plan, comm, x.shape[1], dtype, **knobs.options(cls.knobs))
        order = order or Order()
        outs, errors = {}, {}
        for name, d in designs.items():
            assign(d.x, x)
            outs[name] = d(op, eps=EPS)
            whole = gather_rows(comm, outs[name], dtype)
            if comm.rank == 0:
                with comm.alone():
                    errors[name] = None if ref is None else relative_error(whole, ref, order.perm)
                    if save is not None:
                        save(name, d.buffer.mode if hasattr(d, "windows") else None,
                             order.to_original(whole))  # fmt: skip
            del whole
        errors = comm.bcast(errors)
        calls = {
            name: (lambda d=d, o=outs[name]: d(op, eps=EPS, out=o)) for name, d in designs.items()
        }
        times = time_round_robin(calls, comm, repeat, backend.sync)
        runs = []
        for name, d in designs.items():
            calls_made = d.stats["calls"]
            per_call = [float(d.stats[k]) / calls_made for k in ("remote_bytes", "wait_seconds")]
            total = comm.allreduce(np.array(per_call))
            err = errors[name]
            runs.append(
                {
                    "design": name,
                    "op": op,
                    "ok": err is not None and err < tolerance(dtype),
                    "seconds": float(np.median(times[name])),
                    "max_rel_error": err,
                    "remote_bytes": float(total[0]),
                    "wait_seconds": float(total[1]) / comm.size,
                    **({"remote_path": d.remote_path} if hasattr(d, "remote_path") else {}),
                    **({"window": d.buffer.mode} if hasattr(d, "windows") else {}),
                }
            )
        return runs
    finally:
        for d in designs.values():
            d.free()


def check(
    dataset: Dataset,
    backend,
    comm,
    *,
    ops=OPS,
    names=None,
    knobs: Knobs = DEFAULTS,
    every_window: bool = False,
    dim: int = 16,
    repeat: int = 5,
    seed: int = 0,
    outputs=None,
    order_file=None,
) -> dict:
    """``mgg check``: every design ``names`` (default all) of ``backend`` on every op,
    each with the ``knobs`` it takes (its window: the knob's, or the design's default;
    ``every_window``: each design on every window it takes that this job can use), each
    verified against scipy on rank 0 and timed. Features are random_features(seed) by
    original node id, in ``knobs.dtype`` (bf16: scipy sums the rounded features, in
    float64). The graph is renumbered in the node order (``knobs.order``, or
    ``order_file``); the oracle sees the graph as given, and the outputs are compared
    (and saved) by original node id.

    returns {"graph", "np", "dim", "ps", "dist", "backend", "designs": {name: {ok,
    seconds, window}} (best window), "runs": [...]}; with ``outputs`` (a folder), rank 0
    saves every gathered [N, D] output there as DESIGN-OP-WINDOW.npy
    """
    backend = get_backend(backend)
    names = list(names or backend.designs())
    for bad in [o for o in ops if o not in OPS] + [n for n in names if n not in backend.designs()]:
        raise ValueError(
            f"unknown op or design {bad!r}; ops: {', '.join(OPS)}; "
            f"designs: {', '.join(backend.designs())}"
        )
    knobs.check_taken(backend.takes(*names), backend.job(*names))
    if backend.gpu:
        windows = ["device"]
    elif every_window:
        windows = list(comm.windows)
    else:  # None: each design on its default (mgg.designs.cpu.CpuDesign)
        windows = [knobs.window]
    ps = knobs.ps
    shard_plan = graph_root = None
    if isinstance(dataset, ShardedDataset):
        shard_plan, ids = sharded_plan(dataset, comm, "gcn" in ops, knobs, order_file)
        ps = shard_plan.ps
        graph_root = _graph_on_root(comm, shard_plan)
        order = Order()
        if ids is not None:  # the shards' graph is renumbered: the rows' ids make the order
            parts = comm.gather(ids, root=0)
            if comm.rank == 0:
                order = Order(dataset.order, np.concatenate(parts))
                graph_root = graph_root.permute(order.rank)  # the oracle's: original ids
    else:
        order = node_order.for_job(
            dataset.graph, knobs.order, comm, path=order_file, seed=seed, split=knobs.split
        )
        g0 = dataset.graph
        gcn_graph = g0.gcn_norm() if "gcn" in ops else None
    result = {
        "graph": dataset.name,
        "np": comm.size,
        "dim": dim,
        "ps": ps,
        "dist": knobs.dist,
        "split": knobs.split,
        "dtype": knobs.dtype,
        "order": dataset.order if shard_plan is not None else order.name,
        "backend": backend.name,
        "designs": {},
        "runs": [],
    }
    if outputs is not None and comm.rank == 0:
        outputs = make_folder(outputs, "the designs' outputs")
    for op in ops:
        if shard_plan is not None:
            g, plan = graph_root, shard_plan
        else:
            g = gcn_graph if op == "gcn" else g0
            plan = build_plan(
                order.apply(g), comm.size, ps, rank=comm.rank, split=knobs.split, transposed=False
            )
            ids = order.ids(plan.lb, plan.ub)
        dtype = row_dtype(knobs.dtype)
        x = random_features(seed, plan.lb, plan.ub, dim, ids=ids).astype(dtype, copy=False)
        ref = None
        if comm.rank == 0:
            with comm.alone():  # the scipy oracle of the whole graph: peers wait for it
                ref = oracle(g, op, seed, dim, dtype)
        for window in windows:
            these = knobs if backend.gpu else replace(knobs, window=window)
            takes = names
            if every_window:
                takes = [n for n in names if window in backend.design(n).windows]
            runs = verify_and_time(
                backend, comm, takes, plan, x, op, ref=ref, repeat=repeat, knobs=these,
                order=order, save=_saver(outputs, op, window),
            )  # fmt: skip
            for run in runs:
                run.setdefault("window", window)  # the one the design used
                result["runs"].append(run)
                prev = result["designs"].get(run["design"])
                best = prev is None or run["seconds"] < prev["seconds"]
                result["designs"][run["design"]] = {
                    "ok": run["ok"] and (prev is None or prev["ok"]),
                    "seconds": run["seconds"] if best else prev["seconds"],
                    "window": run["window"] if best else prev["window"],
                }
    return result


def _saver(folder, op: str, window):
    """verify_and_time's ``save``: each output as folder/DESIGN-OP-WINDOW.npy (None
    without a folder)."""
    if folder is None:
        return None

    def save(design: str, used, out) -> None:
        with atomic_write(folder / f"{design}-{op}-{used or window}.npy") as tmp:
            np.save(tmp, out)

    return save


def oracle(graph: Graph, op: str, seed: int, dim: int, dtype, block: int = 2**16) -> np.ndarray:
    """scipy's float64 [N, D] aggregation ``op`` of random_features(seed) rounded to
    ``dtype``; the features are made in float64 a ``block`` of rows at a time."""
    x = np.empty((graph.num_nodes, dim), np.float64)
    for a in range(0, graph.num_nodes, block):
        b = min(a + block, graph.num_nodes)
        x[a:b] = random_features(seed, a, b, dim).astype(dtype, copy=False)
    return reference.aggregate(graph, x, op, eps=EPS)


def sharded_plan(
    dataset: ShardedDataset, comm, weighted: bool, knobs=DEFAULTS, order_file=None
) -> tuple[PartitionPlan, np.ndarray]:
    """This rank's plan from a sharded dataset (``weighted``: an op needs edge weights),
    cut with ``knobs.ps`` where one was given, else the dataset's, and the original ids
    of its rows (int64 [n]; None in natural order)."""
    dataset.check_job(comm.size, knobs=knobs, order_file=order_file)
    shard = dataset.open(comm.rank, comm.size)
    plan = shard.plan
    if weighted and not plan.has_weights:
        raise ValueError(
            f"{dataset.path}: op 'gcn' needs edge weights, and this dataset's graph "
            f"({dataset.graph_kind}) has none: partition with --model gcn"
        )
    ids = shard.rows.ids
    return (plan.with_ps(knobs.ps) if "ps" in knobs.given else plan), ids


def _graph_on_root(comm, plan: PartitionPlan) -> Graph | None:
    """The whole graph of a partition, reassembled from every rank's plan on rank 0 (the
    oracle's input); None elsewhere. Collective."""
    ls, ld, rs, rd = plan.global_edges()
    w = plan.edge_weights()
    mine = (
        np.concatenate([ls, rs]),
        np.concatenate([ld, rd]),
        None if w is None else np.concatenate(w),
    )
    parts = comm.gather(mine, root=0)
    if comm.rank != 0:
        return None
    src, dst = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
    w = np.concatenate([p[2] for p in parts]) if plan.has_weights else None
    return Graph.from_edges(src, dst, plan.num_nodes, w)
