"""`mgg` command line: `mgg info | partition | demo`.

Every subcommand that reports results takes ``--json`` and then prints its result as one
JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, KeyError, RuntimeError) as e:
        print(f"mgg {args.command}: error: {e}", file=sys.stderr)
        _abort_job(2)
        return 2


def _abort_job(code: int) -> None:
    """In a multi-rank job, a failing rank takes the whole job down instead of leaving
    its peers waiting in a collective."""
    from .comm import _world

    for comm in _world.values():
        if comm.size > 1:
            sys.stderr.flush()
            comm.abort(code)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mgg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")

    s = sub.add_parser("info", help="versions, backends and devices")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("partition", help="partition a graph and report the plan's statistics")
    _graph_args(s)
    s.add_argument("--np", type=int, required=True, help="number of ranks P")
    s.add_argument("--ps", type=int, default=16, help="neighbor partition size")
    s.add_argument(
        "--mode",
        choices=["edges", "nodes"],
        default="edges",
        help="balance edges (Algorithm 1) or node counts",
    )
    s.add_argument(
        "--no-transposed", action="store_true", help="skip the transposed plans (backward pass)"
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_partition)

    s = sub.add_parser(
        "check",
        help="run every distributed design, verify against scipy "
        "on rank 0 and time it (launch with mggrun)",
    )
    _graph_args(s)
    s.add_argument("--dim", type=int, default=16, help="feature width D")
    s.add_argument("--op", default="sum", help="sum|mean|gcn|gin, or 'all'")
    s.add_argument("--ps", type=int, default=16, help="neighbor partition size")
    s.add_argument("--dist", type=int, default=4, help="fetch batches in flight (pipelined)")
    s.add_argument("--designs", default="all", help="comma-separated design names, or 'all'")
    s.add_argument("--window", default="auto", help="auto|shm|rma, or 'all' (MPI backend)")
    s.add_argument("--backend", choices=["cpu"], default="cpu")
    s.add_argument("--repeat", type=int, default=5, help="timed runs per design (median)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("demo", help="generate, partition, aggregate and check a graph")
    s.add_argument("--np", type=int, default=4)
    s.add_argument("--nodes", type=int, default=200_000)
    s.add_argument("--dim", type=int, default=64)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_demo)
    return p


def _graph_args(s):
    s.add_argument(
        "graph",
        help="a file (.npz, .graph, .txt/.gz edge list, *_beg_pos.bin) or "
        "a generator spec: reddit|enwiki|products|proteins|orkut[:scale=S], "
        "rmat:scale=K,ef=F, planted:nodes=N,classes=C",
    )
    s.add_argument("--scale", type=float, default=None, help="scale factor for stand-ins")
    s.add_argument("--seed", type=int, default=0)


def load_dataset(args):
    from .graph.generators import resolve

    return resolve(args.graph, scale=args.scale, seed=args.seed)


# ---- info --------------------------------------------------------------------------------
def cmd_info(args) -> int:
    import numba
    import scipy

    import mgg

    info = {
        "mgg": mgg.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "numba": numba.__version__,
        "cpus": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "backends": ["cpu"],
    }
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        from mpi4py import MPI

        info["mpi4py"] = mpi4py.__version__
        info["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
        info["backends"].append("mpi")
    except Exception as e:  # noqa: BLE001 - report, don't fail
        info["mpi"] = f"unavailable ({e})"
    info.update(_cuda_info())
    if info.get("gpus"):
        info["backends"].append("cuda")
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:>14}: {v}")
    return 0


def _cuda_info() -> dict:
    try:
        import cupy
    except Exception:  # noqa: BLE001
        return {"cupy": "not installed"}
    out = {"cupy": cupy.__version__}
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        out["gpus"] = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(n)]
    except Exception as e:  # noqa: BLE001
        out["gpus"] = []
        out["cuda"] = f"no device ({e})"
    try:
        import nvshmem  # noqa: F401

        out["nvshmem4py"] = "installed"
    except Exception:  # noqa: BLE001
        out["nvshmem4py"] = "not installed"
    return out


# ---- partition ---------------------------------------------------------------------------
def cmd_partition(args) -> int:
    from .partition import build_plan, plan_stats

    t0 = time.perf_counter()
    ds = load_dataset(args)
    load_s = time.perf_counter() - t0
    g = ds.graph
    t0 = time.perf_counter()
    plans = build_plan(g, args.np, args.ps, mode=args.mode, transposed=not args.no_transposed)
    plan_s = time.perf_counter() - t0
    st = plan_stats(plans, plan_s)
    st["graph"] = ds.name
    st["load_seconds"] = load_s
    if not args.json or sys.stdout.isatty():
        _print_partition(st, plans)
    if args.json:
        print(json.dumps(st))
    return 0


def _print_partition(st: dict, plans) -> None:
    print(
        f"{st['graph']}: {st['num_nodes']:,} nodes, {st['num_edges']:,} edges, P={st['np']}, "
        f"ps={st['ps']}; build_plan {st['plan_seconds']:.3f} s (load {st['load_seconds']:.2f} s)"
    )
    rows = []
    for q in plans:
        s = q.stats()
        e = s["local_edges"] + s["remote_edges"]
        rows.append(
            [
                s["rank"],
                f"[{s['lb']}, {s['ub']})",
                s["nodes"],
                e,
                s["local_edges"],
                s["remote_edges"],
                s["halo_rows"],
                s["lnp"],
                s["rnp"],
            ]
        )
    print(
        format_table(
            rows, ["rank", "range", "nodes", "edges", "local", "remote", "halo rows", "LNP", "RNP"]
        )
    )
    print(
        f"imbalance (max/mean edges) {st['imbalance']:.3f} · remote fraction "
        f"{st['remote_fraction']:.3f} · remote rows fetched once: {st['halo_rows']:,} of "
        f"{st['remote_edges']:,} remote edges ({st['dedup_saving']:.2f}x fewer)"
    )


def format_table(rows, headers) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c) -> str:
    if isinstance(c, float):
        return f"{c:.4g}"
    if isinstance(c, (int, np.integer)):
        return f"{c:,}"
    return str(c)


# ---- check ---------------------------------------------------------------------------
def cmd_check(args) -> int:
    from .baselines import DESIGNS
    from .comm import get_comm
    from .graph.generators import random_features
    from .kernels import OPS, reference
    from .partition import build_plan

    comm = get_comm("mpi")  # first: from here on a failing rank aborts the job
    ops = list(OPS) if args.op == "all" else args.op.split(",")
    names = list(DESIGNS) if args.designs == "all" else args.designs.split(",")
    windows = ["shm", "rma"] if args.window == "all" else [args.window]
    for bad in [o for o in ops if o not in OPS] + [d for d in names if d not in DESIGNS]:
        raise ValueError(
            f"unknown op or design {bad!r}; ops: {', '.join(OPS)}; designs: {', '.join(DESIGNS)}"
        )
    if "auto" in windows:
        windows = [comm.window]
    lead = comm.rank == 0
    ds = load_dataset(args)
    graphs = {}
    result = {
        "graph": ds.name,
        "np": comm.size,
        "dim": args.dim,
        "ps": args.ps,
        "dist": args.dist,
        "designs": {},
        "runs": [],
    }
    for op in ops:
        if op == "gcn" and "gcn" not in graphs:
            graphs["gcn"] = ds.graph.gcn_norm()
        g = graphs["gcn"] if op == "gcn" else ds.graph
        plan = build_plan(g, comm.size, args.ps, rank=comm.rank, transposed=False)
        x = random_features(args.seed, plan.lb, plan.ub, args.dim)
        ref = (
            reference.aggregate(
                g, random_features(args.seed, 0, g.num_nodes, args.dim), op, eps=0.1
            )
            if lead
            else None
        )
        for window in windows:
            for run in _run_designs(comm, names, plan, x, ref, op, window, args):
                result["runs"].append(run)
                prev = result["designs"].get(run["design"])
                best = prev is None or run["seconds"] < prev["seconds"]
                result["designs"][run["design"]] = {
                    "ok": run["ok"] and (prev is None or prev["ok"]),
                    "seconds": run["seconds"] if best else prev["seconds"],
                    "window": window if best else prev["window"],
                }
    if lead:
        if not args.json or sys.stdout.isatty():
            print(
                f"{ds.name}: {ds.graph.num_nodes:,} nodes, {ds.graph.num_edges:,} edges, "
                f"P={comm.size}, D={args.dim}, ps={args.ps}, dist={args.dist}"
            )
            print(
                format_table(
                    [
                        [
                            r["design"],
                            r["op"],
                            r["window"],
                            "ok" if r["ok"] else "MISMATCH",
                            f"{r['seconds'] * 1e3:.2f}",
                            f"{r['wait_seconds'] * 1e3:.2f}",
                            f"{r['remote_bytes'] / 1e6:.2f}",
                        ]
                        for r in result["runs"]
                    ],
                    [
                        "design",
                        "op",
                        "window",
                        "check",
                        "ms (median)",
                        "wait ms (rank mean)",
                        "MB fetched (all ranks)",
                    ],
                )
            )
        if args.json:
            print(json.dumps(result))
    return 0 if all(d["ok"] for d in result["designs"].values()) else 1


def _run_designs(comm, names, plan, x, ref, op, window, args) -> list[dict]:
    """Set up every design, check its output on rank 0, then time them round-robin (so
    they share the machine's noise); the time of a call is the slowest rank's."""
    from .baselines import DESIGNS

    designs = {}
    try:
        for name in names:
            kw = {"dist": args.dist} if name == "pipelined" else {}
            designs[name] = DESIGNS[name](plan, comm, args.dim, window=window, **kw)
        outs, errors = {}, {}
        for name, d in designs.items():
            d.x[:] = x
            outs[name] = d(op, eps=0.1)
            got = comm.comm.gather(outs[name], root=0)
            if comm.rank == 0:
                got = np.concatenate(got)
                errors[name] = float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))
        errors = comm.bcast(errors)
        times = {name: [] for name in designs}
        for _ in range(args.repeat):
            for name, d in designs.items():
                comm.barrier()
                t0 = time.perf_counter()
                d(op, eps=0.1, out=outs[name])
                times[name].append(time.perf_counter() - t0)
        runs = []
        for name, d in designs.items():
            calls = d.stats["calls"]
            per_call = {k: float(d.stats[k]) / calls for k in ("remote_bytes", "wait_seconds")}
            total = comm.allreduce(np.array([per_call["remote_bytes"], per_call["wait_seconds"]]))
            secs = float(np.median(comm.allreduce(np.array(times[name]), "max")))
            runs.append(
                {
                    "design": name,
                    "op": op,
                    "window": window,
                    "ok": errors[name] < 1e-5,
                    "seconds": secs,
                    "max_rel_error": errors[name],
                    "remote_bytes": float(total[0]),
                    "wait_seconds": float(total[1]) / comm.size,
                }
            )
        return runs
    finally:
        for d in designs.values():
            d.free()


# ---- demo --------------------------------------------------------------------------------
def cmd_demo(args) -> int:
    from .graph.generators import planted_partition
    from .kernels import aggregate, gather_halo, reference
    from .partition import build_plan, plan_stats

    t0 = time.perf_counter()
    ds = planted_partition(args.nodes, 8, avg_degree=20, num_features=args.dim, seed=0)
    g = ds.graph.gcn_norm()
    print(
        f"generated {ds.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges (with self "
        f"loops) in {time.perf_counter() - t0:.2f} s"
    )
    t0 = time.perf_counter()
    plans = build_plan(g, args.np, ps=16)
    st = plan_stats(plans, time.perf_counter() - t0)
    st["graph"], st["load_seconds"] = ds.name, 0.0
    _print_partition(st, plans)
    x = ds.x
    result = {"np": args.np, "num_nodes": g.num_nodes, "num_edges": g.num_edges, "ops": {}}
    for op in ("sum", "mean", "gcn", "gin"):
        t0 = time.perf_counter()
        out = np.concatenate(
            [aggregate(p, x[p.lb : p.ub], op, halo=gather_halo(p, x), eps=0.1) for p in plans]
        )
        secs = time.perf_counter() - t0
        ref = reference.aggregate(g, x, op, eps=0.1)
        err = float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))
        ok = err < 1e-5
        result["ops"][op] = {"ok": ok, "max_rel_err": err, "seconds": secs}
        print(
            f"aggregate {op:>4}: {secs * 1e3:8.1f} ms over {args.np} plans, max error vs "
            f"scipy {err:.1e} {'OK' if ok else 'MISMATCH'}"
        )
    if args.json:
        print(json.dumps(result))
    return 0 if all(v["ok"] for v in result["ops"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
