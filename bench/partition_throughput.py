"""Partition throughput: build_plan for P ranks vs scipy's CSR->CSC conversion.

    python bench/partition_throughput.py [--np 8] [--max-scale 22] [--reddit]

Both are timed round-robin on the same graph in the same run (medians). Goal: build_plan
for P = 8 takes no longer than the conversion. The plan of an undirected graph reuses its
forward split for the backward pass; a directed graph needs the transposed plans too,
which costs a full transpose on top (reported with and without).
"""

from __future__ import annotations

import argparse
import gc

from mgg.graph.generators import rmat, standin
from mgg.partition import build_plan

from common import RESULTS, compare, write_results


def measure(name, g, p, repeat, rows, directed_too=False):
    a = g.to_scipy()
    fns = {"tocsc": lambda: a.tocsc(), "build_plan": lambda: build_plan(g, p, 16)}
    if directed_too:
        fns["build_plan_no_transposed"] = lambda: build_plan(g, p, 16, transposed=False)
    t = compare(fns, repeat=repeat, warmup=1)
    row = {
        "graph": name,
        "nodes": g.num_nodes,
        "edges": g.num_edges,
        "directed": not g.symmetric,
        "np": p,
        "tocsc_s": t["tocsc"],
        "build_plan_s": t["build_plan"],
        "ratio": t["build_plan"] / t["tocsc"],
    }
    if directed_too:
        row["no_transposed_s"] = t["build_plan_no_transposed"]
        row["no_transposed_ratio"] = t["build_plan_no_transposed"] / t["tocsc"]
    rows.append(row)
    print(
        f"{name:>16} {g.num_edges:>12,} edges  tocsc {t['tocsc']:.3f} s  build_plan "
        f"{t['build_plan']:.3f} s  ratio {row['ratio']:.2f}"
        + (f"  (no transposed {row['no_transposed_ratio']:.2f})" if directed_too else ""),
        flush=True,
    )


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for directed, marker in ((False, "o"), (True, "s")):
        sel = [r for r in rows if r["directed"] == directed and r["graph"].startswith("rmat")]
        if not sel:
            continue
        kind = "directed" if directed else "undirected"
        e = [r["edges"] for r in sel]
        ax.plot(e, [r["build_plan_s"] for r in sel], marker + "-", label=f"build_plan, {kind}")
        ax.plot(e, [r["tocsc_s"] for r in sel], marker + "--", label=f"scipy tocsc, {kind}")
    for r in rows:
        if not r["graph"].startswith("rmat"):
            ax.plot(r["edges"], r["build_plan_s"], "*", ms=12, color="C0")
            ax.plot(r["edges"], r["tocsc_s"], "*", ms=12, color="C1")
            ax.annotate(
                r["graph"],
                (r["edges"], r["tocsc_s"]),
                fontsize=7,
                xytext=(-60, 8),
                textcoords="offset points",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("edges")
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"Partitioning for P = {rows[0]['np']} ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--min-scale", type=int, default=16)
    ap.add_argument("--max-scale", type=int, default=22)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reddit", action="store_true", help="also the full Reddit-size stand-in")
    args = ap.parse_args()
    rows = []
    for scale in range(args.min_scale, args.max_scale + 1, 2):
        g = rmat(scale, 16)
        measure(f"rmat-s{scale}", g, args.np, args.repeat, rows)
        del g
        g = rmat(scale, 16, symmetric=False)
        measure(f"rmat-s{scale}-dir", g, args.np, args.repeat, rows, directed_too=True)
        del g
        gc.collect()
    if args.reddit:
        g = standin("reddit", with_features=False).graph
        measure("reddit-standin", g, args.np, args.repeat, rows)
    plot(rows, RESULTS / "partition_throughput.png")
    write_results(
        "partition_throughput",
        {"np": args.np},
        rows,
        [
            "graph",
            "nodes",
            "edges",
            "directed",
            "np",
            "tocsc_s",
            "build_plan_s",
            "ratio",
            "no_transposed_ratio",
        ],
        notes="ratio = build_plan / tocsc (lower is better; goal <= 1). "
        "no_transposed_ratio: directed graphs without the backward plans.",
    )


if __name__ == "__main__":
    main()
