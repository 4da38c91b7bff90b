"""bfloat16 rows on the CPU against float32, in one run: the aggregation kernel, the
bytes that cross ranks, a training epoch, and peak memory per rank (issue 52).

    python bench/bf16_cpu.py [--parts agg,train,memory] [--rmat-scale 18]
        [--graphs cnr_2000,ego_twitter] [--dims 16,128] [--products-scale 0.1]
        [--epochs 5] [--mem-nodes 1000000] [--mem-degree 30] [--mem-hidden 16,128]
        [--work DIR]

- agg: one rank's aggregation (mgg.kernels.aggregate, what `mgg check` runs at P = 1),
  sum and gcn, on R-MAT (2^scale nodes, 16 edges per node) and real graphs, D = 16 and
  128, float32 and bfloat16 timed round-robin in one process (medians). Goal: >= 1.4x at
  D = 128. The kernel is bound by the rows it gathers: the ratio is half the bytes as
  much as the kernel.
- train: `mgg train` on the products stand-in (100 features), GCN and SAGE at P = 1 and
  4, each dtype: the median epoch (goal >= 1.2x at P = 1) and the peers' bytes per epoch
  (goal 0.5x).
- memory: a products-like planted graph (N nodes, N*degree entries, 128 features) saved
  once, partitioned into shards in each dtype (`mgg partition --out --dtype`), trained
  from them at P = 1 and 4, GCN at each ``--mem-hidden`` width: the largest rank's peak
  RSS, bf16 over fp32 (goal <= 0.65x), whole and above the floor no dtype changes (the
  RSS of a process that imported torch, numba, MPI and mgg).

Results: bench/results/bf16_cpu.*; a run of some ``--parts`` only writes
bf16_cpu-PART[-PART].*.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import RESULTS, compare, machine, mgg_json, write_results

DTYPES = ("float32", "bfloat16")
PARTS = ("agg", "train", "memory")
GOALS = {"agg_d128": 1.4, "epoch": 1.2, "halo_bytes": 0.5, "rss": 0.65}


def aggregation(graphs, dims, rmat_scale: int) -> list[dict]:
    from mgg.graph.dataset import random_features
    from mgg.graph.generators import rmat
    from mgg.graph.specs import resolve
    from mgg.kernels import aggregate
    from mgg.partition import build_plan
    from mgg.precision import BF16

    named = [(f"rmat-s{rmat_scale}", lambda: rmat(rmat_scale, 16, seed=1))]
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    for name in graphs:
        path = shared / f"{name}.npz"
        if path.exists():
            named.append((name, lambda p=path: resolve(str(p)).graph))
        else:
            print(f"skipping {name}: {path} not found", flush=True)
    rows = []
    for name, load in named:
        g0 = load()
        for op in ("sum", "gcn"):
            g = g0.gcn_norm() if op == "gcn" else g0
            plan = build_plan(g, 1, 16, transposed=False)[0]
            for d in dims:
                x = {"float32": random_features(0, 0, g.num_nodes, d)}
                x["bfloat16"] = x["float32"].astype(BF16)
                out = {k: np.empty_like(v) for k, v in x.items()}
                fns = {k: (lambda k=k: aggregate(plan, x[k], op, out=out[k])) for k in DTYPES}
                t = compare(fns, repeat=9)
                row = {
                    "part": "agg",
                    "graph": name,
                    "nodes": g.num_nodes,
                    "edges": g.num_edges,
                    "op": op,
                    "D": d,
                    "fp32_ms": t["float32"] * 1e3,
                    "bf16_ms": t["bfloat16"] * 1e3,
                    "speedup": t["float32"] / t["bfloat16"],
                }
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def training(scale: float, epochs: int, ranks) -> list[dict]:
    rows = []
    spec = f"products:scale={scale}"
    for model in ("gcn", "sage"):
        for p in ranks:
            res = {}
            for dt in DTYPES:
                res[dt] = mgg_json(
                    p, "train", "--dataset", spec, "--model", model, "--epochs", epochs,
                    "--eval-every", "0", "--dtype", dt,
                )  # fmt: skip
            f, b = res["float32"], res["bfloat16"]
            row = {
                "part": "train",
                "graph": spec,
                "nodes": f["num_nodes"],
                "edges": f["num_edges"],
                "op": model,
                "P": p,
                "fp32_ms": f["epoch_time_s"] * 1e3,
                "bf16_ms": b["epoch_time_s"] * 1e3,
                "speedup": f["epoch_time_s"] / b["epoch_time_s"],
                "fp32_bytes_per_epoch": f["bytes_per_epoch"],
                "bf16_bytes_per_epoch": b["bytes_per_epoch"],
                "bytes_ratio": (b["bytes_per_epoch"] / f["bytes_per_epoch"])
                if f["bytes_per_epoch"]
                else None,
                "fp32_rss_mb": max(f["peak_rss_mb"]),
                "bf16_rss_mb": max(b["peak_rss_mb"]),
            }
            rows.append(row)
            print(_line(row), flush=True)
    return rows


FLOOR = (
    "import re, mpi4py.MPI, mgg.cli.train, mgg.train, mgg.kernels.cpu; "
    "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
)


def floor_mb() -> float:
    """The RSS of a process that imported what a training rank imports (torch, numba,
    MPI, mgg), and holds nothing else: the part of a rank no dtype changes."""
    out = subprocess.run([sys.executable, "-c", FLOOR], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024


def memory(
    nodes: int, degree: int, epochs: int, ranks, work: Path, hiddens=(16,)
) -> tuple[list[dict], dict]:
    from mgg.graph.formats import write_npz
    from mgg.graph.generators import planted_partition

    work.mkdir(parents=True, exist_ok=True)
    src = work / f"planted-{nodes}-d{degree}-f128.npz"
    t0 = time.perf_counter()
    ds = planted_partition(nodes, 16, avg_degree=degree, num_features=128, seed=0)
    write_npz(ds, src, compressed=False)
    data = {"nodes": ds.graph.num_nodes, "edges": ds.graph.num_edges, "features": 128}
    data["generate_s"] = time.perf_counter() - t0
    data["floor_mb"] = floor_mb()
    del ds
    print(f"dataset {src}: {data}", flush=True)
    rows = []
    for p in ranks:
        res = {}
        for dt in DTYPES:
            out = work / f"shards-{p}-{dt}"
            mgg_json(1, "partition", src, "--np", p, "--out", out, "--dtype", dt, "--force")
            for h in hiddens:
                res[dt, h] = mgg_json(
                    p, "train", "--dataset", out, "--epochs", epochs, "--eval-every", "0",
                    "--dtype", dt, "--hidden", h,
                )  # fmt: skip
            shutil.rmtree(out, ignore_errors=True)
        for h in hiddens:
            rows.append(_memory_row(res["float32", h], res["bfloat16", h], src, data, p, h))
            print(_line(rows[-1]), flush=True)
    src.unlink(missing_ok=True)
    return rows, data


def _memory_row(f: dict, b: dict, src: Path, data: dict, p: int, hidden: int) -> dict:
    """One memory row: the largest rank's peak RSS in each dtype, and their ratio, whole
    and above the imports' floor."""
    fr, br, floor = max(f["peak_rss_mb"]), max(b["peak_rss_mb"]), data["floor_mb"]
    return {
        "part": "memory",
        "graph": src.stem,
        "nodes": data["nodes"],
        "edges": data["edges"],
        "op": f"gcn h{hidden}",
        "hidden": hidden,
        "P": p,
        "fp32_ms": f["epoch_time_s"] * 1e3,
        "bf16_ms": b["epoch_time_s"] * 1e3,
        "speedup": f["epoch_time_s"] / b["epoch_time_s"],
        "fp32_rss_mb": fr,
        "bf16_rss_mb": br,
        "rss_ratio": br / fr,
        "floor_mb": floor,
        "above_floor_ratio": (br - floor) / (fr - floor),
        "fp32_estimate_mb": f["memory_estimate_mb"],
        "bf16_estimate_mb": b["memory_estimate_mb"],
    }


def _line(row) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def plot(rows, path) -> None:
    """One panel per part that ran: aggregation speedups, training, peak RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(p, [r for r in rows if r["part"] == p]) for p in PARTS]
    panels = [(p, got) for p, got in panels if got]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for ax, (part, got) in zip(axes[0], panels, strict=True):
        {"agg": _plot_agg, "train": _plot_train, "memory": _plot_memory}[part](ax, got)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_agg(ax, agg) -> None:
    labels = [f"{r['graph']}\n{r['op']} D={r['D']}" for r in agg]
    ax.bar(range(len(agg)), [r["speedup"] for r in agg], color="tab:blue")
    ax.axhline(GOALS["agg_d128"], color="k", ls="--", lw=1, label="goal at D=128")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xticks(range(len(agg)), labels, rotation=70, fontsize=7)
    ax.set_ylabel("float32 time / bfloat16 time")
    ax.set_title("aggregation, one rank")
    ax.legend(fontsize=8)


def _plot_train(ax, tr) -> None:
    x = np.arange(len(tr))
    ax.bar(x - 0.2, [r["speedup"] for r in tr], 0.4, label="epoch speedup")
    ratios = [r["bytes_ratio"] or 0 for r in tr]
    ax.bar(x + 0.2, ratios, 0.4, label="peer bytes, bf16/fp32")
    ax.axhline(GOALS["epoch"], color="k", ls="--", lw=1, label="epoch goal")
    ax.axhline(GOALS["halo_bytes"], color="tab:orange", ls=":", lw=1, label="bytes goal")
    ax.set_xticks(x, [f"{r['op']} P={r['P']}" for r in tr], fontsize=8)
    ax.set_title(tr[0]["graph"])
    ax.legend(fontsize=8)


def _plot_memory(ax, mem) -> None:
    x = np.arange(len(mem))
    ax.bar(x - 0.2, [r["fp32_rss_mb"] for r in mem], 0.4, label="float32")
    ax.bar(x + 0.2, [r["bf16_rss_mb"] for r in mem], 0.4, label="bfloat16")
    for i, r in enumerate(mem):
        ax.text(i + 0.2, r["bf16_rss_mb"], f"{r['rss_ratio']:.2f}x", ha="center", va="bottom")
    if mem[0].get("floor_mb"):
        ax.axhline(mem[0]["floor_mb"], color="k", ls=":", lw=1, label="imports' floor")
    ax.set_xticks(x, [f"P={r['P']} h{r.get('hidden', 16)}" for r in mem])
    ax.set_ylabel("peak RSS of the largest rank (MB)")
    ax.set_title(f"GCN memory (goal bf16 <= {GOALS['rss']}x)")
    ax.legend(fontsize=8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rmat-scale", type=int, default=18)
    ap.add_argument("--graphs", default="cnr_2000,ego_twitter")
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--products-scale", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--mem-nodes", type=int, default=1_000_000)
    ap.add_argument("--mem-degree", type=int, default=30)
    ap.add_argument("--mem-hidden", default="16,128", help="GCN's hidden widths (memory)")
    ap.add_argument("--work", default="/tmp/mgg-bf16-cpu")
    args = ap.parse_args()
    parts = args.parts.split(",")
    ranks = [int(p) for p in args.ranks.split(",")]
    rows, payload = [], {"goals": GOALS, "machine_cores": machine()["cores"]}
    if "agg" in parts:
        dims = [int(d) for d in args.dims.split(",")]
        rows += aggregation(args.graphs.split(","), dims, args.rmat_scale)
    if "train" in parts:
        rows += training(args.products_scale, args.epochs, ranks)
    if "memory" in parts:
        hiddens = [int(h) for h in args.mem_hidden.split(",")]
        mem, payload["memory_dataset"] = memory(
            args.mem_nodes, args.mem_degree, args.epochs, ranks, Path(args.work), hiddens
        )
        rows += mem
    agg128 = [r["speedup"] for r in rows if r["part"] == "agg" and r.get("D") == 128]
    if agg128:
        payload["agg_d128_geomean"] = float(np.exp(np.mean(np.log(agg128))))
    notes = (
        "Ratios are float32 over bfloat16 times (speedup) and bfloat16 over float32 bytes "
        "and memory, in one run on this machine (P ranks share its cores). The "
        "aggregation gathers 2-byte rows instead of 4-byte ones and sums them in float32: "
        "its speedup is the bytes as much as the kernel. Goals: aggregation >= 1.4x at "
        "D = 128, epoch >= 1.2x, peer bytes 0.5x, peak RSS <= 0.65x. Memory: GCN at "
        "its default width (16) and at 128; above_floor_ratio leaves out floor_mb, what a "
        "process holds once it imported torch, numba, MPI and mgg, which no dtype halves."
    )
    if "agg_d128_geomean" in payload:
        notes += f" Aggregation at D = 128: geometric mean {payload['agg_d128_geomean']:.2f}x."
    columns = ["part", "graph", "op", "D", "P", "fp32_ms", "bf16_ms", "speedup"]
    columns += ["bytes_ratio", "fp32_rss_mb", "bf16_rss_mb", "rss_ratio", "above_floor_ratio"]
    stem = "-".join(["bf16_cpu"] + ([] if set(parts) == set(PARTS) else parts))
    write_results(stem, payload, rows, columns, notes)
    plot(rows, RESULTS / f"{stem}.png")
    print(f"wrote {RESULTS / stem}.json", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
