"""`mgg partition`: report a graph's plans for P ranks, or write a sharded dataset; with
``--distributed``, the job's ranks each read a slice of the file (mgg.partition.distributed)."""

from __future__ import annotations

import os
import time

from ..knobs import Knobs, flag_help
from ..memory import peak_rss_mb
from .common import (
    emit,
    format_table,
    graph_args,
    integer,
    knob_args,
    knob_type,
    knobs_of,
    open_dataset,
    order_file_arg,
    quiet,
    renamed,
)

KNOBS = ("ps", "split", "dtype")  # dtype: of the features --out stores; --order: orders()
MODEL = (
    "the graph the plans are of: a model's (gcn, sage, gin, gat) or a graph kind (as_is, "
    "gcn_norm, self_loops, no_self_loops); default gcn with --out, else the graph as given"
)
DISTRIBUTED = (
    "launched with mggrun -np P: each rank reads only its slice of FILE (edge list, MGG "
    "binary CSR or .npz), or draws its slice of papers100m, and builds its own plan"
)
ORDER = "; without --out, a comma-separated list compares them (e.g. natural,rcm,metis)"
SAVE_ORDER = "write the order to this .npy, for --order-file (the distributed partitioner's)"


def add(sub):
    s = sub.add_parser(
        "partition", help="partition a graph: report the plans, or write a sharded dataset"
    )
    graph_args(s)
    s.add_argument(
        "--np", type=integer(1), default=None, help="number of ranks P (--distributed: the job's)"
    )
    knob_args(s, KNOBS)
    s.add_argument(
        "--order", dest="orders", type=orders, default=None, help=flag_help("order") + ORDER
    )
    order_file_arg(s)
    s.add_argument("--save-order", default=None, help=SAVE_ORDER)
    renamed(s, "--mode", "split")
    s.add_argument("--no-transposed", action="store_true", help="skip the backward plans")
    s.add_argument("--out", help="write a sharded dataset to this folder (each rank opens its own)")
    s.add_argument("--model", default=None, help=MODEL)
    s.add_argument("--force", action="store_true", help="replace --out if it exists")
    s.add_argument("--distributed", action="store_true", help=DISTRIBUTED)
    s.add_argument("--json", action="store_true")
    return s


def orders(text: str) -> list[str]:
    """argparse type of --order: one order, or a comma-separated list of them."""
    names = text.split(",")
    for name in names:
        knob_type("order")(name)
    return names


def main(args) -> int:
    from ..footprint import check_job
    from ..graph.core import job_graph
    from ..graph.specs import dataset_source
    from ..job import check_ranks
    from ..partition import build_plan, plan_stats
    from ..partition import order as node_order
    from ..partition.shards import ShardedDataset, check_target, order_info, write_sharded
    from ..precision import as_rows

    names = args.orders or ["natural"]
    if len(names) > 1 and (args.out or args.save_order or args.distributed):
        raise ValueError(
            f"--order {','.join(names)}: several orders are compared in a report; --out, "
            "--save-order and --distributed take one"
        )
    knobs = knobs_of(args, KNOBS, "mgg partition")
    if args.orders:
        knobs = Knobs.parse({"order": names[0]}, base=knobs)
    if args.out and args.no_transposed:
        raise ValueError("--out writes shards to train on, which need the transposed plans")
    kind = _graph_kind(args.model, "gcn_norm" if args.out else "as_is")
    if args.distributed:
        return _distributed(args, knobs, kind)
    _check_paths(args)
    if args.out:  # before the work (checked again under the output's lock when written)
        check_target(args.out, args.force)
    if args.np is None:
        raise ValueError("--np P is required (the number of ranks to partition for)")
    check_ranks(args.np)  # before the plans, one per rank
    if args.save_order:
        if args.order_file or names == ["natural"]:
            raise ValueError(
                "--save-order writes the order that --order computes (degree, rcm, metis)"
            )
        node_order.check_target(args.save_order)
    t0 = time.perf_counter()
    ds = open_dataset(args.graph, args.scale, args.seed)
    if isinstance(ds, ShardedDataset):
        raise ValueError(f"{args.graph}: already a sharded dataset (partitioned for np={ds.np})")
    load_s = time.perf_counter() - t0
    heaviest = "file" if args.order_file else max(names, key=_heavy)
    mem = check_job(ds, args.np, "partition", source=args.graph, order=heaviest)
    every = []
    for name in names:
        order = node_order.for_job(
            ds.graph, name, parts=args.np, path=args.order_file, seed=args.seed, split=knobs.split
        )
        t0 = time.perf_counter()
        plans = build_plan(
            job_graph(order.apply(ds.graph), kind),
            args.np,
            knobs.ps,
            split=knobs.split,
            transposed=not args.no_transposed,
        )
        stats = [q.stats() for q in plans]
        st = {**plan_stats(stats, time.perf_counter() - t0), "graph": ds.name, "kind": kind}
        st.update(order=order.name, order_seconds=order.seconds)
        every.append(_order_facts(st))
    st.update(load_seconds=load_s, orders=every)
    if args.save_order:
        node_order.save(args.save_order, order, node_order.fingerprint_of(ds.graph))
        st["order_file"] = args.save_order
    if args.out:
        t0 = time.perf_counter()
        rows = [ds.rows(p.lb, p.ub, args.seed, order.ids(p.lb, p.ub)) for p in plans]
        rows = [r._replace(x=as_rows(r.x, knobs.dtype, f"{args.graph}'s features")) for r in rows]
        source = {
            **dataset_source(args.graph, args.scale, args.seed),
            "num_edges": ds.graph.num_edges,
        }
        info = order_info(order.name, order.seconds)
        write_sharded(args.out, plans, rows, kind, source, force=args.force, order=info)
        st.update(out=args.out, write_seconds=time.perf_counter() - t0)
    st["peak_rss_mb"] = [peak_rss_mb()]
    st["memory_estimate_mb"] = mem
    _report(args, st, stats)
    return 0


def _heavy(name: str) -> int:
    from ..footprint.estimate import ORDER_STRUCTURE_PER_EDGE

    return ORDER_STRUCTURE_PER_EDGE.get(name, 0) + (name != "natural")


def _order_facts(st: dict) -> dict:
    """What --json reports of each order: its time, the remote-edge fraction, the halo rows
    (per rank and in all) and the edge imbalance."""
    keys = ("order", "order_seconds", "plan_seconds", "remote_fraction", "halo_rows")
    return {
        **{k: st[k] for k in keys},
        "halo_rows_per_rank": st["halo_rows_per_rank"],
        "imbalance": st["imbalance"],
    }


def _graph_kind(model: str | None, default: str) -> str:
    from ..graph.core import GRAPH_KINDS

    if model is None or model in GRAPH_KINDS:
        return default if model is None else model
    from ..torch import graph_kind  # torch: 1.6 s a rank, for a model's name only

    return graph_kind(model)


def _check_paths(args) -> None:
    """An empty or clashing --out or --save-order, refused before any work."""
    from ..atomic import check_paths

    check_paths(
        {"--out": args.out, "--save-order": args.save_order},
        {"graph": args.graph, "--order-file": args.order_file},
        new=("--out",),
    )


def _distributed(args, knobs, kind: str) -> int:
    from ..backend import get_backend
    from ..graph.papers import NAME as PAPERS
    from ..graph.specs import papers_spec, refuse_scale
    from ..partition.distributed import partition_file
    from ..partition.shards import check_target
    from .common import INPUTS

    comm = get_backend("cpu").comm()  # first: from here on a failing rank aborts the job
    _check_paths(args)
    if args.out:
        check_target(args.out, args.force)
    INPUTS.append(args.graph)
    if args.np is not None and args.np != comm.size:
        raise ValueError(
            f"--np {args.np} but the job has {comm.size} ranks: --distributed partitions for "
            "the job's ranks (mggrun -np P)"
        )
    source = papers_spec(args.graph, args.scale, args.seed)
    if source is None:
        if not (os.path.isfile(args.graph) or os.path.isfile(args.graph + "_beg_pos.bin")):
            raise ValueError(
                f"{args.graph}: --distributed reads a file (edge list, MGG binary CSR or "
                f".npz) or draws {PAPERS}; other generators and folders are partitioned in "
                "one process (drop --distributed)"
            )
        refuse_scale(args.scale, args.graph, "a file")
        source = args.graph
    if args.save_order:
        raise ValueError(
            "--save-order: --distributed reads orders (--order-file); compute one in one "
            "process: mgg partition FILE --np P --order X --save-order F.npy"
        )
    st, stats = partition_file(
        source,
        comm,
        kind=kind,
        knobs=knobs,
        transposed=not args.no_transposed,
        out=args.out,
        force=args.force,
        seed=args.seed,
        order_file=args.order_file,
    )
    st["orders"] = [_order_facts(st)]
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
        if len(st["orders"]) > 1:
            base = st["orders"][0]["halo_rows"]
            rows = [
                [o["order"], f"{o['order_seconds']:.3f}", f"{o['plan_seconds']:.3f}"]
                + [f"{o['remote_fraction']:.3f}", o["halo_rows"], max(o["halo_rows_per_rank"])]
                + [f"{o['halo_rows'] / base:.3f}" if base else "-", f"{o['imbalance']:.3f}"]
                for o in st["orders"]
            ]
            heads = ["order", "order s", "plan s", "remote fraction", "halo rows"]
            heads += ["max per rank", f"vs {st['orders'][0]['order']}", "imbalance"]
            print(f"the table above is of the last order, {st['order']}")
            print(format_table(rows, heads))
        elif st["order"] != "natural":
            print(f"nodes in {st['order']} order, computed in {st['order_seconds']:.3f} s")
        if "order_file" in st:
            print(f"order saved to {st['order_file']} (for --order-file)")
        if "out" in st:
            print(f"sharded dataset written to {st['out']}/ in {st['write_seconds']:.2f} s")
    emit(args, st)
