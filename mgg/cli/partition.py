"""`mgg partition`: report a graph's plans for P ranks, or write a sharded dataset; with
``--distributed``, the job's ranks each read a slice of the file (mgg.partition.distributed)."""

from __future__ import annotations

import os
import time

from ..memory import peak_rss_mb
from .common import (
    emit,
    format_table,
    graph_args,
    integer,
    knob_args,
    knobs_of,
    open_dataset,
    quiet,
    renamed,
)

KNOBS = ("ps", "split", "dtype")  # dtype: of the features --out stores
MODEL = (
    "the graph the plans are of: a model's (gcn, sage, gin, gat) or a graph kind (as_is, "
    "gcn_norm, self_loops, no_self_loops); default gcn with --out, else the graph as given"
)
DISTRIBUTED = (
    "launched with mggrun -np P: each rank reads only its slice of FILE (edge list, MGG "
    "binary CSR or .npz) and builds its own plan"
)


def add(sub):
    s = sub.add_parser(
        "partition", help="partition a graph: report the plans, or write a sharded dataset"
    )
    graph_args(s)
    s.add_argument(
        "--np", type=integer(1), default=None, help="number of ranks P (--distributed: the job's)"
    )
    knob_args(s, KNOBS)
    renamed(s, "--mode", "split")
    s.add_argument("--no-transposed", action="store_true", help="skip the backward plans")
    s.add_argument("--out", help="write a sharded dataset to this folder (each rank opens its own)")
    s.add_argument("--model", default=None, help=MODEL)
    s.add_argument("--force", action="store_true", help="replace --out if it exists")
    s.add_argument("--distributed", action="store_true", help=DISTRIBUTED)
    s.add_argument("--json", action="store_true")
    return s


def main(args) -> int:
    from ..graph.core import job_graph
    from ..graph.specs import dataset_source
    from ..memory import check_job
    from ..partition import build_plan, plan_stats
    from ..partition.shards import ShardedDataset, check_target, write_sharded
    from ..precision import as_rows

    knobs = knobs_of(args, KNOBS, "mgg partition")
    if args.out and args.no_transposed:
        raise ValueError("--out writes shards to train on, which need the transposed plans")
    kind = _graph_kind(args.model, "gcn_norm" if args.out else "as_is")
    if args.distributed:
        return _distributed(args, knobs, kind)
    if args.out:  # before the work (checked again under the output's lock when written)
        check_target(args.out, args.force)
    if args.np is None:
        raise ValueError("--np P is required (the number of ranks to partition for)")
    t0 = time.perf_counter()
    ds = open_dataset(args.graph, args.scale, args.seed)
    if isinstance(ds, ShardedDataset):
        raise ValueError(f"{args.graph}: already a sharded dataset (partitioned for np={ds.np})")
    load_s = time.perf_counter() - t0
    mem = check_job(ds, args.np, "partition", source=args.graph)
    t0 = time.perf_counter()
    plans = build_plan(
        job_graph(ds.graph, kind),
        args.np,
        knobs.ps,
        split=knobs.split,
        transposed=not args.no_transposed,
    )
    stats = [q.stats() for q in plans]
    st = {**plan_stats(stats, time.perf_counter() - t0), "graph": ds.name, "kind": kind}
    st["load_seconds"] = load_s
    if args.out:
        t0 = time.perf_counter()
        rows = [ds.rows(p.lb, p.ub, args.seed) for p in plans]
        rows = [r._replace(x=as_rows(r.x, knobs.dtype, f"{args.graph}'s features")) for r in rows]
        source = {
            **dataset_source(args.graph, args.scale, args.seed),
            "num_edges": ds.graph.num_edges,
        }
        write_sharded(args.out, plans, rows, kind, source, force=args.force)
        st.update(out=args.out, write_seconds=time.perf_counter() - t0)
    st["peak_rss_mb"] = [peak_rss_mb()]
    st["memory_estimate_mb"] = mem
    _report(args, st, stats)
    return 0


def _graph_kind(model: str | None, default: str) -> str:
    from ..torch import graph_kind

    return default if model is None else graph_kind(model)


def _distributed(args, knobs, kind: str) -> int:
    from ..backend import get_backend
    from ..graph.specs import refuse_scale
    from ..partition.distributed import partition_file
    from ..partition.shards import check_target
    from .common import INPUTS

    comm = get_backend("cpu").comm()  # first: from here on a failing rank aborts the job
    if args.out:
        check_target(args.out, args.force)
    INPUTS.append(args.graph)
    if args.np is not None and args.np != comm.size:
        raise ValueError(
            f"--np {args.np} but the job has {comm.size} ranks: --distributed partitions for "
            "the job's ranks (mggrun -np P)"
        )
    if not (os.path.isfile(args.graph) or os.path.isfile(args.graph + "_beg_pos.bin")):
        raise ValueError(
            f"{args.graph}: --distributed reads a file (edge list, MGG binary CSR or .npz); "
            "generators and folders are partitioned in one process (drop --distributed)"
        )
    refuse_scale(args.scale, args.graph, "a file")
    st, stats = partition_file(
        args.graph,
        comm,
        kind=kind,
        knobs=knobs,
        transposed=not args.no_transposed,
        out=args.out,
        force=args.force,
        seed=args.seed,
    )
    st["peak_rss_mb"] = comm.allgather(peak_rss_mb())
    if comm.rank == 0:
        _report(args, st, stats)
    return 0


def _report(args, st, stats) -> None:
    if not quiet(args):
        print(
            f"{st['graph']} ({st['kind']}): {st['num_nodes']:,} nodes, {st['num_edges']:,} "
            f"edges, P={st['np']}, ps={st['ps']}; plans {st['plan_seconds']:.3f} s "
            f"(load {st['load_seconds']:.2f} s)"
        )
        rows = [
            [s["rank"], f"[{s['lb']}, {s['ub']})", s["nodes"]]
            + [s["local_edges"] + s["remote_edges"]]
            + [s[k] for k in ("local_edges", "remote_edges", "halo_rows", "lnp", "rnp")]
            + [s["digest"][:12]]
            for s in stats
        ]
        heads = ["rank", "range", "nodes", "edges", "local", "remote", "halo rows", "LNP", "RNP"]
        print(format_table(rows, heads + ["digest"]))
        print(
            f"imbalance (max/mean edges) {st['imbalance']:.3f} · remote fraction "
            f"{st['remote_fraction']:.3f} · remote rows fetched once: {st['halo_rows']:,} of "
            f"{st['remote_edges']:,} remote edges ({st['dedup_saving']:.2f}x fewer)"
        )
        if "out" in st:
            print(f"sharded dataset written to {st['out']}/ in {st['write_seconds']:.2f} s")
    emit(args, st)
