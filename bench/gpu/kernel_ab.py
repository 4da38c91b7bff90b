"""The aggregation kernel against another version of it (A/B) and cuSPARSE, then ncu.

    python bench/gpu/kernel_ab.py [--against OLD.cu] [--dims 16,128] [--ncu-dims 16]
                                  [--bf16] [--no-ncu] [--backend cpu]

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
call of each kernel at every D of --ncu-dims (default: every D of --dims): speed of
light, memory workload (L1/L2 hit rates, DRAM bytes), occupancy, launch statistics
(registers) and warp stall reasons; its report is kept as text (kernel_ab_ncu.txt).

--orders natural,rcm,metis (issue 53) runs this checkout's kernel on the graph renumbered
in each node order (mgg.partition.order; metis into --parts parts, numbered part by part:
clusters of rows that share neighbours; 8 by default: a part's rows at D = 128, 15 MB,
fit the H100's 50 MB L2, and METIS takes 4 s on a 20M-edge R-MAT on one CPU core, 43 s
with 128 parts), each in its own process as a source is, and
ncu's L1 and L2 hit rates of each order's kernels (one profiled call each, at --ncu-dims);
the rows name the order as their source, vs_natural is natural's mgg_ms over the order's.
--order-dir DIR keeps each computed order there as ORDER.npy (mgg's order file: the
graph's fingerprint and, for metis, its parts recorded after the array; a file of another
graph or another --parts is refused at once) and takes it from there next time, without
importing pymetis. --orders-only computes and saves them (--order-dir) and stops: no GPU,
so the orders of the Reddit-size graph can be made on a CPU beforehand and carried to the
GPU machine, whose image may lack pymetis (2 MB a file; on a busy 2-core VM 4.2 minutes,
73 s of CPU, 10 GB peak: the graph 95 s, RCM 3 s, METIS 148 s):

    python bench/gpu/kernel_ab.py --orders rcm,metis --order-dir DIR --orders-only

--backend cpu is the dry mode, for a CPU without a GPU: everything but the GPU's work,
at any size (`--nodes 2000 --edges 20000`: seconds). Flags are checked as on a GPU; the
graph, the orders and --order-dir are the same; the outer process spawns each inner as
a GPU run does, and the inner computes with mgg's CPU aggregation (mgg.kernels.aggregate,
numba, one thread; bf16 rows too) where the GPU runs the kernel, scipy's product where it runs
cuSPARSE, timed with a host clock, and checked against scipy, so the rows have the GPU
run's columns; each source is compiled with NVRTC (where its library is installed; not
with --no-compile) for sm_90 in every variant the GPU run would load, beside the inner
runs, its registers taken from ptxas's report (the rows' regs); the ncu commands are
built, checked (each profiles one --inner run) and recorded (ncu_commands), not run, and
the first one's inner run (--profile) runs on the CPU.
Its files are named <name>_cpu (kernel_ab_cpu.json, locality_cpu.json, ...) in
$MGG_GPU_OUT or bench/results/gpu/, so they never overwrite a GPU run's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common_gpu import GPU_RESULTS, Results, grouped_bars, raw_log
from kernel_ab_orders import ordered_graphs, orders_only, read_saved, refused_orders, saved_order
from kernel_ab_sides import ARCH, CONFIGS, OPS, CompileCheck, inner, nvrtc_library, variants_of

SCRIPT = str(Path(__file__).resolve())
BACKENDS = ("cuda", "cpu")
NCU_SECTIONS = (
    "SpeedOfLight",
    "MemoryWorkloadAnalysis",
    "MemoryWorkloadAnalysis_Tables",
    "Occupancy",
    "LaunchStats",
    "WarpStateStats",
    "SchedulerStats",
)

BF16_LABEL = {"bfloat16": " bf16"}  # a bar's label: the source, and bf16 where it is

HIT_RATES = {
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
}


# ---- ncu -----------------------------------------------------------------------------------
def hit_rates(commands: dict, rows: list) -> None:
    """ncu's L1 and L2 sector hit rates of mgg's kernel for each order's graph (run by
    ``commands[order]``), into the rows of that order (the mean over the profiled calls
    of each (D, op, ps))."""
    for name, cmd in commands.items():
        r = subprocess.run(cmd, capture_output=True, text=True)
        (GPU_RESULTS / f"kernel_ab_ncu_{name}.csv").write_text(r.stdout + r.stderr)
        values = parse_hit_rates(r.stdout)
        for row in rows:
            if row["source"] == name:
                row.update({k: float(np.mean(v)) for k, v in values.items()})
        means = {k: round(float(np.mean(v)), 1) for k, v in values.items()}
        print(f"ncu {name}: exit {r.returncode}, hit rates {means}", flush=True)


def hit_rate_options() -> list[str]:
    metrics = ",".join(HIT_RATES.values())
    return ["--metrics", metrics, "--csv", "--kernel-name", "regex:mgg_aggregate"]


def profiled(ncu: str, opts: list, me: list, path: str) -> list[str]:
    """The command of ncu (with ``opts``) over one inner run of the graph file ``path``:
    only its profiled range, at the GPU's own clocks."""
    ncu_opts = [ncu, "--clock-control", "none", "--profile-from-start", "off", *opts]
    return check_profiled([*ncu_opts, *me, "--inner", path, "--profile"])


def check_profiled(cmd: list[str]) -> list[str]:
    """``cmd`` when it profiles one inner run: under ncu, the whole benchmark would call
    ncu again (GPU run 8)."""
    if "--inner" not in cmd or "--profile" not in cmd:
        raise AssertionError(f"an ncu command that is not one inner run: {cmd}")
    return cmd


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


# ---- results -------------------------------------------------------------------------------
def host_device() -> dict:
    """The dry mode's stand-in for common_gpu.device(): no GPU."""
    return {"device": "cpu (kernel_ab --backend cpu: no GPU)", "sms": None, "memory_gib": None}


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


# ---- flags ---------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """Every refusal in one line naming the flag, exit status 2 (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def widths(text: str) -> list[int]:
    """A comma-separated list of widths D (positive integers, each once)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: widths are positive integers, e.g. 16,128")
    return list(dict.fromkeys(values))


def order_names(text: str) -> list[str]:
    from mgg.knobs import ORDERS

    values = text.split(",")
    if not values or any(v not in ORDERS for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(ORDERS)}")
    return list(dict.fromkeys(values))


def parser() -> Parser:
    ap = Parser(prog="kernel_ab.py", description=__doc__.splitlines()[0])
    ap.add_argument("--against", help="another aggregate.cu to compare with")
    ap.add_argument("--dims", type=widths, default=[16, 128], help="widths D (16,128)")
    ap.add_argument("--ncu-dims", type=widths, help="the widths ncu profiles (default: --dims)")
    ap.add_argument("--nodes", type=positive, default=232_965)
    ap.add_argument("--edges", type=positive, default=114_615_892)
    ap.add_argument("--repeat", type=positive, default=20)
    ap.add_argument("--bf16", action="store_true", help="also each kernel with bfloat16 rows")
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--orders", type=order_names, help="node orders to compare (natural,rcm,metis)")
    ap.add_argument("--parts", type=positive, default=8, help="METIS's parts with --orders")
    ap.add_argument("--order-dir", default=None, help="where --orders keeps its orders")
    ap.add_argument(
        "--orders-only", action="store_true", help="compute --orders into --order-dir, then stop"
    )
    ap.add_argument(
        "--backend", choices=BACKENDS, default="cuda", help="cpu: the dry mode (no GPU)"
    )
    ap.add_argument("--no-compile", action="store_true", help="cpu: no NVRTC compile check")
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # the graph file: one source's run
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    return ap


def check_args(ap: Parser, args) -> None:
    """Refuse, at once and in one line, what would fail (or mislead) later in the run."""
    if args.profile and not args.inner:  # the whole benchmark under ncu would call ncu again
        ap.error("--profile profiles one inner run: it goes with --inner")
    if args.inner:
        return
    args.ncu_dims = args.ncu_dims or args.dims
    if not set(args.ncu_dims) <= set(args.dims):
        extra = sorted(set(args.ncu_dims) - set(args.dims))
        ap.error(
            f"argument --ncu-dims: {extra} not in --dims {args.dims}: ncu profiles timed widths"
        )
    if args.against:
        if args.orders:
            ap.error("argument --against: --orders runs this checkout's kernel only; give one")
        if not Path(args.against).is_file():
            ap.error(f"argument --against: {args.against}: no such file")
    if args.order_dir and not args.orders:
        ap.error("argument --order-dir: it keeps the orders of --orders, which is not given")
    if args.orders_only and not (args.orders and args.order_dir):
        ap.error("argument --orders-only: it computes --orders into --order-dir: give both")
    if args.backend == "cuda" and not args.orders_only and importlib.util.find_spec("cupy") is None:
        ap.error(
            "argument --backend: cuda needs cupy, not installed here (--backend cpu: dry mode)"
        )
    for name in args.orders or []:
        saved = saved_order(args.order_dir, name)
        if saved is not None and saved.exists():  # refused now, not after the graph's build
            try:
                read_saved(saved, name, args.parts, args.nodes)
            except Exception as e:  # noqa: BLE001 - OrderError, or a file numpy cannot read
                ap.error(f"argument --order-dir: {e}")
        elif name == "metis" and not module_found("pymetis"):
            ap.error(
                "argument --orders: metis needs pymetis, not installed here, or the order "
                "in --order-dir (kernel_ab.py --orders metis --order-dir DIR --orders-only "
                "on a machine with pymetis)"
            )


def module_found(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    check_args(ap, args)
    if args.inner:
        dims = args.dims
        return inner(args.inner, args.source, dims, args.repeat, args.profile, args.bf16,
                     args.backend)  # fmt: skip
    if args.orders_only:
        return orders_only(args)
    return outer(args)


def outer(args) -> int:
    from mgg.graph.generators import rmat_n

    t_start = time.perf_counter()
    host = args.backend == "cpu"
    name = ("locality" if args.orders else "kernel_ab") + ("_cpu" if host else "")
    res = Results(
        name,
        {
            "nodes": args.nodes,
            "edges": args.edges,
            "configs": CONFIGS,
            "against": args.against,
            "dims": args.dims,
            "ncu_dims": args.ncu_dims,
            "backend": args.backend,
        },
        ["source", "dtype", "op", "D", "ps", "regs", "mgg_ms", "cusparse_ms", "vs_cusparse"]
        + ["max_rel_error"]
        + (["vs_fp32"] if args.bf16 else [])
        + (["vs_natural", "l1_hit_pct", "l2_hit_pct"] if args.orders else []),
        notes="Each kernel source in its own process, round-robin with cuSPARSE there "
        "(CUDA events, medians); dist = 1, wpb = 4. 'this': the checkout's aggregate.cu."
        + (
            " DRY MODE (--backend cpu): mgg's CPU aggregation and scipy in place of the "
            f"kernel and cuSPARSE, host clock; regs: NVRTC for {ARCH}; no ncu."
            if host
            else ""
        ),
        plot=plot,
        device_info=host_device() if host else None,
    )
    lib = None if not host or args.no_compile else nvrtc_library()
    if host and not args.no_compile and lib is None:
        print("NVRTC not found: no compile check, no regs", flush=True)
    check = CompileCheck(lib) if lib is not None else None
    with raw_log(name), tempfile.TemporaryDirectory() as tmp:
        g = rmat_n(args.nodes, args.edges, seed=0)
        print(f"graph: {g} ({time.perf_counter() - t_start:.1f} s)", flush=True)
        path = os.path.join(tmp, "graph.npz")
        np.savez(path, indptr=g.indptr, indices=g.indices)
        me = [sys.executable, "-u", SCRIPT, "--repeat", str(args.repeat)]
        me += ["--bf16"] if args.bf16 else []
        timed = [*me, "--dims", ",".join(map(str, args.dims))]
        timed += ["--backend", "cpu"] if host else []
        graphs = {"this": path}
        sources = {"this": None} | ({Path(args.against).name: args.against} if args.against else {})
        if check is not None:  # compiled while the inner runs run
            for source in [None, args.against][: 1 + bool(args.against)]:
                check.submit(source, sorted(variants_of(g, args.dims, args.bf16)))
        if args.orders:
            log = res.payload.setdefault("orders", {})
            with refused_orders():
                graphs = ordered_graphs(g, args.orders, args.parts, tmp, args.order_dir, log)
            sources = dict.fromkeys(graphs)
        # ncu over this checkout's kernel at --ncu-dims, one inner run per graph: its
        # commands built (and checked) before the timed runs
        ncu = None if args.no_ncu else ncu_binary()
        if not args.no_ncu and ncu is None and not host:
            print("ncu not found: no counters", flush=True)
        me_ncu = [*me, "--dims", ",".join(map(str, args.ncu_dims))]
        if args.orders:
            opts = hit_rate_options()
            commands = {k: profiled(ncu or "ncu", opts, me_ncu, p) for k, p in graphs.items()}
        else:
            opts = [a for s in NCU_SECTIONS for a in ("--section", s)]
            commands = {"this": profiled(ncu or "ncu", opts, me_ncu, path)}
        for label, source in sources.items():
            extra = ["--source", str(Path(source).resolve())] if source else []
            r = subprocess.run(
                [*timed, "--inner", graphs.get(label, path), *extra], capture_output=True, text=True
            )
            print(r.stdout + r.stderr, flush=True)
            if r.returncode:
                raise SystemExit(f"{label}: exit {r.returncode}")
            got = json.loads(r.stdout.strip().splitlines()[-1])
            for k in [k for k in got if k.endswith(" variant")] if check else []:
                w, cls = got[k]  # the dry mode: the registers of what a GPU compiles
                regs = check.regs(source, (w, tuple(cls), " bf16 " in k))
                got[k.removesuffix("variant") + "regs"] = regs
            for dim, op, (ps, _, _) in ((d, o, c) for d in args.dims for o in OPS for c in CONFIGS):
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
        if not args.no_ncu:
            res.payload["ncu_commands"] = commands
        if host and not args.no_ncu:  # built, checked, printed; each one's inner run on CPU
            for label, cmd in commands.items():
                print(f"ncu command ({label}, not run on CPU): {' '.join(cmd)}", flush=True)
            label, cmd = next(iter(commands.items()))  # the others differ in the graph file
            tail = [*cmd[cmd.index(sys.executable) :], "--backend", "cpu"]
            r = subprocess.run(tail, capture_output=True, text=True)
            if r.returncode:
                print(r.stdout + r.stderr, flush=True)
                raise SystemExit(f"{label}: the profiled inner run: exit {r.returncode}")
            print(f"the profiled inner run ({label}) ran on CPU", flush=True)
            ncu = None
        if args.orders:
            natural = {(r["dtype"], r["op"], r["D"], r["ps"]): r["mgg_ms"] for r in res.rows
                       if r["source"] == "natural"}  # fmt: skip
            for r in res.rows:
                base = natural.get((r["dtype"], r["op"], r["D"], r["ps"]))
                r["vs_natural"] = base / r["mgg_ms"] if base else None
                r.setdefault("l1_hit_pct", None)
                r.setdefault("l2_hit_pct", None)
            if ncu:
                hit_rates(commands, res.rows)
        if check is not None:
            print(check.close(), flush=True)
        res.payload["pymetis_imported"] = sys.modules.get("pymetis") is not None
        res.payload["seconds"] = round(time.perf_counter() - t_start, 2)
        code = res.finish()
        if ncu and not args.orders:
            r = subprocess.run(commands["this"], capture_output=True, text=True)
            (GPU_RESULTS / "kernel_ab_ncu.txt").write_text(r.stdout + r.stderr)
            print(f"ncu exit {r.returncode}: {GPU_RESULTS / 'kernel_ab_ncu.txt'}", flush=True)
        print(f"{name}: {time.perf_counter() - t_start:.1f} s", flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main())
