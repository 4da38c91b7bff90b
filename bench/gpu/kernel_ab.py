"""The aggregation kernel against another version of it (A/B) and cuSPARSE, then ncu.

    python bench/gpu/kernel_ab.py [--against OLD.cu] [--dims 16,128] [--bf16] [--no-ncu]

One Reddit-size R-MAT, generated once and shared through a file; each kernel source (this
checkout's aggregate.cu, and OLD.cu if given, e.g. `git show REV:mgg/kernels/cuda/
aggregate.cu`) runs in its own process (the launcher caches its compiled modules per
process: a source compiles once per width class there; an old source ignores the class's
-D options) and times mgg's sum and gcn (ps = 64 and 128, dist = 1, wpb = 4) round-robin
with cuSPARSE, so each source's ratio to cuSPARSE comes from one run; each row records the
registers per thread of the kernel that ran. --bf16 (issue 52) times each source's kernel
with bfloat16 rows too, in the same round-robin (rows with dtype bfloat16; vs_fp32: the
same source and ps in float32 over bfloat16; vs_cusparse over float32 cuSPARSE, a ratio
of half the bytes as much as of the kernel), and profiles it beside float32. Then one
process runs this checkout's kernel under Nsight Compute (--clock-control none) over one
call of each kernel at every D: speed of light, memory workload (L1/L2 hit rates, DRAM
bytes), occupancy, launch statistics (registers) and warp stall reasons; its report is
kept as text (kernel_ab_ncu.txt).

--orders natural,rcm,metis (issue 53) runs this checkout's kernel on the graph renumbered
in each node order (mgg.partition.order; metis into --parts parts, numbered part by part:
clusters of rows that share neighbours; 8 by default: a part's rows at D = 128, 15 MB,
fit the H100's 50 MB L2, and METIS takes 4 s on a 20M-edge R-MAT on one CPU core, 43 s
with 128 parts), each in its own process as a source is, and
ncu's L1 and L2 hit rates of each order's kernels (one profiled call each); the rows name
the order as their source, vs_natural is natural's mgg_ms over the order's.
--order-dir DIR keeps each computed order there as ORDER.npy and takes it from there
next time (RCM and METIS of the Reddit-size graph take minutes of one core).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from common_gpu import (
    GPU_RESULTS,
    Results,
    check_output,
    cuda_compare,
    cusparse_matrix,
    grouped_bars,
    raw_log,
)

CONFIGS = [(64, 1, 4), (128, 1, 4)]  # (ps, dist, wpb): the best of aggregation.py's sweep
NCU_SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "MemoryWorkloadAnalysis_Tables",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
)


def inner(
    path: str, source: str | None, dims: list[int], repeat: int, profile: bool, bf16: bool
) -> None:
    """One source's process: print one JSON line {'D op ps=..': median ms, ...} (and
    'D op bf16 ps=..' with ``bf16``)."""
    import cupy
    import cupyx.profiler
    import torch

    import mgg.kernels.cuda as kc
    from mgg.backend import assign
    from mgg.designs import get_design
    from mgg.graph.core import Graph
    from mgg.graph.dataset import random_features
    from mgg.harness.check import tolerance
    from mgg.partition import build_plan
    from mgg.precision import BF16

    if source:
        kc.SOURCE = Path(source)
    z = np.load(path)
    g = Graph(z["indptr"], z["indices"], check=False)
    graphs = {"sum": g, "gcn": g.gcn_norm()}
    plans = {op: build_plan(gg, 1, 16, transposed=False)[0] for op, gg in graphs.items()}
    out = {}
    for dim, op in ((d, op) for d in dims for op in ("sum", "gcn")):
        gg, plan = graphs[op], plans[op]
        x = random_features(0, 0, gg.num_nodes, dim)
        pipelined = get_design("virtual", "pipelined")
        designs = {
            c: pipelined([plan.with_ps(c[0])], None, dim, dist=c[1], wpb=c[2]) for c in CONFIGS
        }
        for d in designs.values():
            assign(d.x, x)
        fns = {f"{dim} {op} ps={c[0]}": (lambda d=d: d(op)) for c, d in designs.items()}
        halves, xh = {}, None
        if bf16:
            halves = {c: pipelined([plan.with_ps(c[0])], None, dim, BF16, dist=c[1], wpb=c[2])
                      for c in CONFIGS}  # fmt: skip
            xh = x.astype(BF16)  # the rows, rounded once
            for d in halves.values():
                assign(d.x, cupy.asarray(xh.view(np.uint16)))
            fns |= {f"{dim} {op} bf16 ps={c[0]}": (lambda d=d: d(op)) for c, d in halves.items()}
        w = torch.from_numpy(gg.weights if op == "gcn" else np.ones(gg.num_edges, np.float32))
        a_t = cusparse_matrix(gg, w)
        xt = torch.from_numpy(x).cuda()
        fns[f"{dim} {op} cusparse"] = lambda a_t=a_t, xt=xt: a_t @ xt
        if profile:  # one call of each, inside the profiled range
            for f in fns.values():
                f()
            cupy.cuda.Device().synchronize()
            with cupyx.profiler.profile():
                for f in fns.values():
                    f()
                cupy.cuda.Device().synchronize()
        else:
            out.update({k: v * 1e3 for k, v in cuda_compare(fns, repeat=repeat).items()})
            err = check_output(gg, x, op, cupy.asnumpy(designs[CONFIGS[0]](op)), label=op)
            out[f"{dim} {op} max_rel_error"] = err
            weighted = (kc.NORMS if plan.norm is not None else 1) if op == "gcn" else 0
            dev = cupy.cuda.Device().id
            mod = kc.load_module(dev, weighted, "p2p", kc.width_class(dim))
            out[f"{dim} {op} regs"] = mod.get_function("mgg_aggregate").num_regs
            if bf16:
                got = cupy.asnumpy(halves[CONFIGS[0]](op)).view(BF16).astype(np.float32)
                xr = xh.astype(np.float32)
                out[f"{dim} {op} bf16 max_rel_error"] = check_output(
                    gg, xr, op, got, label=f"{op} bf16", tolerance=tolerance(BF16)
                )
                mod = kc.load_module(dev, weighted, "p2p", kc.width_class(dim, 1, 2), bf16=True)
                out[f"{dim} {op} bf16 regs"] = mod.get_function("mgg_aggregate").num_regs
        del designs, halves, fns, a_t, xt
        cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    print(json.dumps(out), flush=True)


BF16_LABEL = {"bfloat16": " bf16"}  # a bar's label: the source, and bf16 where it is

HIT_RATES = {
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
}


def ordered_graphs(g, orders, parts: int, tmp: str, keep: str | None) -> dict:
    """{order: a graph file of ``g`` renumbered in it}; orders computed once (kept in
    ``keep``, the graph's fingerprint checked when read back)."""
    from mgg.partition import order as node_order

    out, fingerprint = {}, node_order.fingerprint_of(g)
    for name in orders:
        saved = Path(keep) / f"{name}.npy" if keep else None
        if name == "natural":
            o = node_order.Order()
        elif saved is not None and saved.exists():
            o = node_order.read(saved, g.num_nodes, fingerprint)
        else:
            o = node_order.compute(g, name, parts=parts)
            print(f"order {name}: {o.seconds:.1f} s", flush=True)
            if saved is not None:
                saved.parent.mkdir(parents=True, exist_ok=True)
                node_order.save(saved, o, fingerprint)
        h = o.apply(g)
        out[name] = os.path.join(tmp, f"graph-{name}.npz")
        np.savez(out[name], indptr=h.indptr, indices=h.indices)
    return out


def hit_rates(ncu: str, me: list, graphs: dict, rows: list) -> None:
    """ncu's L1 and L2 sector hit rates of mgg's kernel for each order's graph, into the
    rows of that order (the mean over the profiled calls of each (D, op, ps))."""
    metrics = ",".join(HIT_RATES.values())
    for name, path in graphs.items():
        opts = ["--metrics", metrics, "--csv", "--kernel-name", "regex:mgg_aggregate"]
        r = subprocess.run(profiled(ncu, opts, me, path), capture_output=True, text=True)
        (GPU_RESULTS / f"kernel_ab_ncu_{name}.csv").write_text(r.stdout + r.stderr)
        values = parse_hit_rates(r.stdout)
        for row in rows:
            if row["source"] == name:
                row.update({k: float(np.mean(v)) for k, v in values.items()})
        means = {k: round(float(np.mean(v)), 1) for k, v in values.items()}
        print(f"ncu {name}: exit {r.returncode}, hit rates {means}", flush=True)


def profiled(ncu: str, opts: list, me: list, path: str) -> list[str]:
    """The command of ncu (with ``opts``) over one inner run of the graph file ``path``:
    only its profiled range, at the GPU's own clocks."""
    ncu_opts = [ncu, "--clock-control", "none", "--profile-from-start", "off", *opts]
    return [*ncu_opts, *me, "--inner", path, "--profile"]


def parse_hit_rates(csv: str) -> dict[str, list[float]]:
    """{key of HIT_RATES: every value ncu's --csv output has of its metric}."""
    values = {}
    for line in csv.splitlines():
        cells = [c.strip('"') for c in line.strip().split('","')]
        for key, metric in HIT_RATES.items():
            if metric in cells:
                try:
                    values.setdefault(key, []).append(float(cells[-1].replace(",", "")))
                except ValueError:
                    pass
    return values


def ncu_binary() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    hits = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))
    hits += sorted(Path("/usr/local/cuda/bin").glob("ncu"))
    return str(hits[-1]) if hits else None


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: f"{r['op']} D={r['D']} ps={r['ps']}",
        lambda r: {r["source"] + BF16_LABEL.get(r.get("dtype"), ""): r["vs_cusparse"]},
        "mgg vs cuSPARSE, Reddit-size R-MAT",
        "speedup over cuSPARSE",
        goal=1.3,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", help="another aggregate.cu to compare with")
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--nodes", type=int, default=232_965)
    ap.add_argument("--edges", type=int, default=114_615_892)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--bf16", action="store_true", help="also each kernel with bfloat16 rows")
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--orders", default=None, help="node orders to compare (natural,rcm,metis)")
    ap.add_argument("--parts", type=int, default=8, help="METIS's parts with --orders")
    ap.add_argument("--order-dir", default=None, help="where --orders keeps its orders")
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # the graph file: one source's run
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    if args.profile and not args.inner:  # the whole benchmark under ncu would call ncu again
        ap.error("--profile profiles one inner run: it goes with --inner")
    if args.inner:
        return inner(args.inner, args.source, dims, args.repeat, args.profile, args.bf16)

    from mgg.graph.generators import rmat_n

    res = Results(
        "locality" if args.orders else "kernel_ab",
        {"nodes": args.nodes, "edges": args.edges, "configs": CONFIGS, "against": args.against},
        ["source", "dtype", "op", "D", "ps", "regs", "mgg_ms", "cusparse_ms", "vs_cusparse"]
        + ["max_rel_error"]
        + (["vs_fp32"] if args.bf16 else [])
        + (["vs_natural", "l1_hit_pct", "l2_hit_pct"] if args.orders else []),
        notes="Each kernel source in its own process, round-robin with cuSPARSE there "
        "(CUDA events, medians); dist = 1, wpb = 4. 'this': the checkout's aggregate.cu.",
        plot=plot,
    )
    with raw_log("kernel_ab"), tempfile.TemporaryDirectory() as tmp:
        g = rmat_n(args.nodes, args.edges, seed=0)
        print(f"graph: {g}", flush=True)
        path = os.path.join(tmp, "graph.npz")
        np.savez(path, indptr=g.indptr, indices=g.indices)
        me = [sys.executable, "-u", __file__, "--repeat", str(args.repeat), "--dims", args.dims]
        me += ["--bf16"] if args.bf16 else []
        graphs = {"this": path}
        sources = {"this": None} | ({Path(args.against).name: args.against} if args.against else {})
        if args.orders:
            graphs = ordered_graphs(g, args.orders.split(","), args.parts, tmp, args.order_dir)
            sources = dict.fromkeys(graphs)
        for label, source in sources.items():
            extra = ["--source", str(Path(source).resolve())] if source else []
            r = subprocess.run(
                [*me, "--inner", graphs.get(label, path), *extra], capture_output=True, text=True
            )
            print(r.stdout + r.stderr, flush=True)
            if r.returncode:
                raise SystemExit(f"{label}: exit {r.returncode}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            for dim, op, (ps, _, _) in (
                (d, o, c) for d in dims for o in ("sum", "gcn") for c in CONFIGS
            ):
                mgg, cus = got[f"{dim} {op} ps={ps}"], got[f"{dim} {op} cusparse"]
                for dtype, key in (("float32", ""), ("bfloat16", " bf16"))[: 1 + args.bf16]:
                    ms = got[f"{dim} {op}{key} ps={ps}"]
                    res.add(
                        {
                            "source": label,
                            "dtype": dtype,
                            "op": op,
                            "D": dim,
                            "ps": ps,
                            "regs": got[f"{dim} {op}{key} regs"],
                            "mgg_ms": ms,
                            "cusparse_ms": cus,
                            "vs_cusparse": cus / ms,
                            "max_rel_error": got[f"{dim} {op}{key} max_rel_error"],
                            **({"vs_fp32": mgg / ms} if args.bf16 else {}),
                        }
                    )
        ncu = None if args.no_ncu else ncu_binary()
        if not args.no_ncu and ncu is None:
            print("ncu not found: no counters", flush=True)
        if args.orders:
            natural = {(r["dtype"], r["op"], r["D"], r["ps"]): r["mgg_ms"] for r in res.rows
                       if r["source"] == "natural"}  # fmt: skip
            for r in res.rows:
                base = natural.get((r["dtype"], r["op"], r["D"], r["ps"]))
                r["vs_natural"] = base / r["mgg_ms"] if base else None
            if ncu:
                hit_rates(ncu, me, graphs, res.rows)
            return res.finish()
        code = res.finish()
        if ncu:
            sections = [a for s in NCU_SECTIONS for a in ("--section", s)]
            r = subprocess.run(profiled(ncu, sections, me, path), capture_output=True, text=True)
            (GPU_RESULTS / "kernel_ab_ncu.txt").write_text(r.stdout + r.stderr)
            print(f"ncu exit {r.returncode}: {GPU_RESULTS / 'kernel_ab_ncu.txt'}", flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main())
