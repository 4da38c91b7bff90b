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
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"mgg {args.command}: error: {e}", file=sys.stderr)
        return 2


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
    s.add_argument("--mode", choices=["edges", "nodes"], default="edges",
                   help="balance edges (Algorithm 1) or node counts")
    s.add_argument("--no-transposed", action="store_true",
                   help="skip the transposed plans (backward pass)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_partition)

    s = sub.add_parser("demo", help="generate, partition, aggregate and check a graph")
    s.add_argument("--np", type=int, default=4)
    s.add_argument("--nodes", type=int, default=200_000)
    s.add_argument("--dim", type=int, default=64)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_demo)
    return p


def _graph_args(s):
    s.add_argument("graph", help="a file (.npz, .graph, .txt/.gz edge list, *_beg_pos.bin) or "
                   "a generator spec: reddit|enwiki|products|proteins|orkut[:scale=S], "
                   "rmat:scale=K,ef=F, planted:nodes=N,classes=C")
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
        "mgg": mgg.__version__, "python": platform.python_version(),
        "numpy": np.__version__, "scipy": scipy.__version__, "numba": numba.__version__,
        "cpus": os.cpu_count(), "numba_threads": numba.get_num_threads(),
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
        out["gpus"] = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode()
                       for i in range(n)]
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
    plans = build_plan(g, args.np, args.ps, mode=args.mode,
                       transposed=not args.no_transposed)
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
    print(f"{st['graph']}: {st['num_nodes']:,} nodes, {st['num_edges']:,} edges, P={st['np']}, "
          f"ps={st['ps']}; build_plan {st['plan_seconds']:.3f} s (load {st['load_seconds']:.2f} s)")
    rows = []
    for q in plans:
        s = q.stats()
        e = s["local_edges"] + s["remote_edges"]
        rows.append([s["rank"], f"[{s['lb']}, {s['ub']})", s["nodes"], e, s["local_edges"],
                     s["remote_edges"], s["halo_rows"], s["lnp"], s["rnp"]])
    print(format_table(rows, ["rank", "range", "nodes", "edges", "local", "remote",
                              "halo rows", "LNP", "RNP"]))
    print(f"imbalance (max/mean edges) {st['imbalance']:.3f} · remote fraction "
          f"{st['remote_fraction']:.3f} · remote rows fetched once: {st['halo_rows']:,} of "
          f"{st['remote_edges']:,} remote edges ({st['dedup_saving']:.2f}x fewer)")


def format_table(rows, headers) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c) -> str:
    if isinstance(c, float):
        return f"{c:.4g}"
    if isinstance(c, (int, np.integer)):
        return f"{c:,}"
    return str(c)


# ---- demo --------------------------------------------------------------------------------
def cmd_demo(args) -> int:
    from .graph.generators import planted_partition
    from .kernels import aggregate, gather_halo, reference
    from .partition import build_plan, plan_stats

    t0 = time.perf_counter()
    ds = planted_partition(args.nodes, 8, avg_degree=20, num_features=args.dim, seed=0)
    g = ds.graph.gcn_norm()
    print(f"generated {ds.name}: {g.num_nodes:,} nodes, {g.num_edges:,} edges (with self "
          f"loops) in {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    plans = build_plan(g, args.np, ps=16)
    st = plan_stats(plans, time.perf_counter() - t0)
    st["graph"], st["load_seconds"] = ds.name, 0.0
    _print_partition(st, plans)
    x = ds.x
    result = {"np": args.np, "num_nodes": g.num_nodes, "num_edges": g.num_edges, "ops": {}}
    for op in ("sum", "mean", "gcn", "gin"):
        t0 = time.perf_counter()
        out = np.concatenate([aggregate(p, x[p.lb:p.ub], op, halo=gather_halo(p, x), eps=0.1)
                              for p in plans])
        secs = time.perf_counter() - t0
        ref = reference.aggregate(g, x, op, eps=0.1)
        err = float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))
        ok = err < 1e-5
        result["ops"][op] = {"ok": ok, "max_rel_err": err, "seconds": secs}
        print(f"aggregate {op:>4}: {secs * 1e3:8.1f} ms over {args.np} plans, max error vs "
              f"scipy {err:.1e} {'OK' if ok else 'MISMATCH'}")
    if args.json:
        print(json.dumps(result))
    return 0 if all(v["ok"] for v in result["ops"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
