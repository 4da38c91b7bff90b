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


def tolerance(dtype) -> float:
    """The largest relative_error a correct design of rows of ``dtype`` may show."""
    return TOLERANCE_BF16 if is_bf16(dtype) else TOLERANCE


def gather_rows(comm, out, dtype=np.float32) -> np.ndarray | None:
    """This job's whole [N, D] output (rows of ``dtype``) on rank 0 as the float type
    they sum in (bf16 widens exactly to float32), None elsewhere; collective."""
    rows = from_storage(to_host(out), dtype).astype(accumulator(dtype), copy=False)
    got = comm.gather(rows, root=0)
    return np.concatenate(got) if comm.rank == 0 else None


def relative_error(got, want) -> float:
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))


def verify_and_time(
    backend, comm, names, plan, x, op: str, *, ref=None, repeat: int = 5, knobs=DEFAULTS,
    order: Order | None = None,
) -> tuple[list[dict], dict]:  # fmt: skip
    """Set up the designs ``names`` of ``backend`` on this rank's ``plan`` (each with the
    ``knobs`` it takes; rows of ``knobs.dtype``), write x [n, D] and call each once,
    gather every output on rank 0 (indexed by original node id under the plan's node
    ``order``, which rank 0 holds; compared with ref [N, D], by original id, there), then
    time them round-robin. Collective.

    returns (runs: one dict per design, outputs: {name: [N, D]} on rank 0, {} elsewhere)
    """
    backend = get_backend(backend)
    dtype = row_dtype(knobs.dtype)
    designs = {}
    try:
        for name in names:
            cls = backend.design(name)
            designs[name] = cls(plan, comm, x.shape[1], dtype, **knobs.options(cls.knobs))
        outs, outputs, errors = {}, {}, {}
        for name, d in designs.items():
            assign(d.x, x)
            outs[name] = d(op, eps=EPS)
            whole = gather_rows(comm, outs[name], dtype)
            if comm.rank == 0:
                with comm.alone():
                    outputs[name] = whole = (order or Order()).to_original(whole)
                    errors[name] = relative_error(whole, ref) if ref is not None else None
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
        return runs, outputs
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
        x = random_features(seed, plan.lb, plan.ub, dim, ids=ids).astype(dtype)
        ref = None
        if comm.rank == 0:
            with comm.alone():  # the scipy oracle of the whole graph: peers wait for it
                x0 = random_features(seed, 0, g.num_nodes, dim).astype(dtype)
                ref = reference.aggregate(g, x0.astype(np.float64), op, eps=EPS)
        for window in windows:
            these = knobs if backend.gpu else replace(knobs, window=window)
            takes = names
            if every_window:
                takes = [n for n in names if window in backend.design(n).windows]
            runs, outs = verify_and_time(
                backend, comm, takes, plan, x, op, ref=ref, repeat=repeat, knobs=these, order=order
            )
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
                if outputs is not None and run["design"] in outs:
                    name = f"{run['design']}-{op}-{run['window']}.npy"
                    with atomic_write(outputs / name) as tmp:
                        np.save(tmp, outs[run["design"]])
    return result


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
