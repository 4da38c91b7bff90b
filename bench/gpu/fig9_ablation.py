"""Fig. 9: what neighbor partitioning and interleaving are worth.

    python bench/gpu/fig9_ablation.py [--np 4] [--dims 16,64] [--scale 1.0]

MGG vs MGG without neighbor partitioning (a partition is a node's whole neighbor list)
and vs MGG without interleaving (LNPs and RNPs in two launches). The paper: 3.47x and
1.32x slower without them.
"""

from __future__ import annotations

import argparse
import sys

from common_gpu import PAPER_GRAPHS, Results, grouped_bars, raw_log, standin_graph, time_designs


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: f"{r['graph']} D={r['D']}",
        lambda r: {
            "without neighbor partitioning": r["no_partition_slowdown"],
            "without interleaving": r["no_interleave_slowdown"],
        },
        "Fig. 9: slowdown of MGG without each of its two techniques",
        "time / MGG's time",
        goal=1.0,
        log=True,
        line="no change:",
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--dims", default="16,64")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    args = ap.parse_args()
    res = Results(
        "fig9_ablation",
        {"np": args.np, "scale": args.scale},
        ["graph", "D", "mgg_ms", "no_partition_slowdown", "no_interleave_slowdown"],
        notes="Slowdowns > 1 point the paper's way (3.47x, 1.32x).",
        plot=plot,
    )
    with raw_log("fig9_ablation"):
        for name in args.graphs.split(","):
            g = standin_graph(name, args.scale).graph
            widest = int(g.max_in_degree())
            for d in (int(v) for v in args.dims.split(",")):
                knobs = {"no_partition": {"design": "pipelined", "ps": max(1, widest)}}
                t = time_designs(
                    g, args.np, d, ["pipelined", "no_partition", "no_interleave"], knobs=knobs
                )
                row = {
                    "graph": name,
                    "D": d,
                    "mgg_ms": t["pipelined"] * 1e3,
                    "no_partition_slowdown": t["no_partition"] / t["pipelined"],
                    "no_interleave_slowdown": t["no_interleave"] / t["pipelined"],
                }
                res.add(row)
                print(
                    f"{name} D={d}: MGG {row['mgg_ms']:.2f} ms; without partitioning "
                    f"{row['no_partition_slowdown']:.2f}x slower, without interleaving "
                    f"{row['no_interleave_slowdown']:.2f}x",
                    flush=True,
                )
        return res.finish()


if __name__ == "__main__":
    sys.exit(main())
