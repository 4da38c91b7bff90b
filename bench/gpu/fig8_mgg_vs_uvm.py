"""Fig. 8: MGG vs the unified-memory design, GCN and GIN, at P = 2, 4, 8 PEs.

    python bench/gpu/fig8_mgg_vs_uvm.py [--np 2,4,8] [--scale 1.0]

What the two designs differ in is the aggregation: per forward pass GCN (2 layers, 16
hidden) aggregates twice at width 16, GIN (5 layers, 64 hidden) five times at width 64
(the layers transform before aggregating). Goal: MGG >= 3.65x UVM on average.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from common_gpu import (
    PAPER_GRAPHS,
    Results,
    grouped_bars,
    raw_log,
    standin_graph,
    time_designs,
    uvm_columns,
)

MODELS = {"gcn": (16, 2, "gcn"), "gin": (64, 5, "gin")}  # width, aggregations, op


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: r["graph"],
        lambda r: {f"P = {r['np']}": r["speedup"]},
        lambda r: f"{r['model'].upper()}: MGG speedup over UVM",
        "UVM time / MGG time",
        goal=3.65,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", default="2,4,8")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    args = ap.parse_args()
    res = Results(
        "fig8_mgg_vs_uvm",
        {"scale": args.scale},
        ["graph", "np", "model", "mgg_ms", "uvm_ms", "speedup", "uvm_advice_verified"],
        notes="Aggregation time of one forward pass; P virtual PEs on one GPU "
        "(paper: 3.16x GCN, 4.15x GIN on 8 A100s).",
        plot=plot,
    )
    with raw_log("fig8_mgg_vs_uvm"):
        for name in args.graphs.split(","):
            g = standin_graph(name, args.scale).graph
            for p in (int(v) for v in args.np.split(",")):
                for model, (width, count, op) in MODELS.items():
                    t = time_designs(g, p, width, ["pipelined", "uvm"], op=op)
                    row = {
                        "graph": name,
                        "np": p,
                        "model": model,
                        "mgg_ms": count * t["pipelined"] * 1e3,
                        "uvm_ms": count * t["uvm"] * 1e3,
                        "speedup": t["uvm"] / t["pipelined"],
                        **uvm_columns(t),
                    }
                    res.add(row)
                    print(
                        f"{name} P={p} {model}: MGG {row['mgg_ms']:.2f} ms UVM "
                        f"{row['uvm_ms']:.2f} ms -> {row['speedup']:.2f}x",
                        flush=True,
                    )
        mean = {
            m: float(np.mean([r["speedup"] for r in res.rows if r["model"] == m]))
            for m in MODELS
            if any(r["model"] == m for r in res.rows)
        }
        print(f"mean speedup over UVM: {mean}", flush=True)
        return res.finish(mean_speedup=mean)


if __name__ == "__main__":
    sys.exit(main())
