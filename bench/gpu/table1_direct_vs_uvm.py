"""Table 1: direct NVSHMEM (a remote read per edge, no partitioning, no interleaving)
vs the unified-memory design, on the five stand-ins of Table 3.

    python bench/gpu/table1_direct_vs_uvm.py [--np 4] [--dim 16] [--scale 1.0]

The paper finds direct NVSHMEM *slower* than UVM on 3 of 5 graphs: fine-grained remote
reads without MGG's partitioning and interleaving do not pay off by themselves.
"""

from __future__ import annotations

import argparse
import sys

from common_gpu import (
    PAPER_GRAPHS,
    Results,
    grouped_bars,
    raw_log,
    standin_graph,
    time_designs,
    uvm_columns,
)


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: r["graph"],
        lambda r: {"direct (NVSHMEM)": r["direct_ms"], "UVM": r["uvm_ms"]},
        "Table 1: aggregation, direct NVSHMEM access vs UVM",
        "ms (lower is better)",
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    args = ap.parse_args()
    res = Results(
        "table1_direct_vs_uvm",
        {"np": args.np, "dim": args.dim, "scale": args.scale},
        [
            "graph",
            "nodes",
            "edges",
            "direct_ms",
            "uvm_ms",
            "direct_over_uvm",
            "uvm_advice_verified",
        ],
        notes=f"{args.np} virtual PEs on one GPU, D = {args.dim}, op sum. "
        "direct_over_uvm > 1: direct is slower (as the paper finds on 3 of 5 graphs).",
        plot=plot,
    )
    with raw_log("table1_direct_vs_uvm"):
        for name in args.graphs.split(","):
            g = standin_graph(name, args.scale).graph
            t = time_designs(g, args.np, args.dim, ["direct", "uvm"])
            row = {
                "graph": name,
                "nodes": g.num_nodes,
                "edges": g.num_edges,
                "direct_ms": t["direct"] * 1e3,
                "uvm_ms": t["uvm"] * 1e3,
                "direct_over_uvm": t["direct"] / t["uvm"],
                **uvm_columns(t),
            }
            res.add(row)
            print(
                f"{name}: direct {row['direct_ms']:.2f} ms, UVM {row['uvm_ms']:.2f} ms, "
                f"direct/UVM {row['direct_over_uvm']:.2f}",
                flush=True,
            )
        return res.finish()


if __name__ == "__main__":
    sys.exit(main())
