"""Table 1: direct NVSHMEM (a remote read per edge, no partitioning, no interleaving)
vs the unified-memory designs, on the five stand-ins of Table 3.

    python bench/gpu/table1_direct_vs_uvm.py [--np 4] [--dim 16] [--scale 1.0]

The paper finds direct NVSHMEM *slower* than UVM on 3 of 5 graphs: fine-grained remote
reads without MGG's partitioning and interleaving do not pay off by themselves. Here
(mgg.designs.virtual):

  direct_over_uvm      direct (remote rows in HBM) / uvm (MGG's kernel, remote rows in
                       host memory read over PCIe, rows re-placed before each PE): HBM
                       per-edge reads against host-memory reads with MGG's kernel
  direct_over_uvm_hbm  direct / uvm_hbm (the same per-edge reads, every row resident in
                       HBM as managed memory): what managed memory itself costs, ~1
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
        lambda r: {
            "direct (NVSHMEM)": r["direct_ms"],
            "UVM (remote rows on the host)": r["uvm_ms"],
            "UVM (every row in HBM)": r["uvm_hbm_ms"],
        },
        "Table 1: aggregation, direct NVSHMEM access vs UVM",
        "ms (lower is better)",
        log=True,
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
            "uvm_hbm_ms",
            "direct_over_uvm",
            "direct_over_uvm_hbm",
            "uvm_advice_verified",
            "uvm_hbm_advice_verified",
        ],
        notes=f"{args.np} virtual PEs on one GPU, D = {args.dim}, op sum. direct_over_uvm "
        "> 1: direct is slower (as the paper finds on 3 of 5 graphs); uvm runs MGG's "
        "kernel with the remote rows in host memory (read over PCIe, rows re-placed "
        "before each PE). direct_over_uvm_hbm: the same per-edge reads against UVM with "
        "every row resident in HBM, what managed memory itself costs (~1).",
        plot=plot,
    )
    with raw_log("table1_direct_vs_uvm"):
        for name in args.graphs.split(","):
            g = standin_graph(name, args.scale).graph
            t = time_designs(g, args.np, args.dim, ["direct", "uvm", "uvm_hbm"])
            row = {
                "graph": name,
                "nodes": g.num_nodes,
                "edges": g.num_edges,
                "direct_ms": t["direct"] * 1e3,
                "uvm_ms": t["uvm"] * 1e3,
                "uvm_hbm_ms": t["uvm_hbm"] * 1e3,
                "direct_over_uvm": t["direct"] / t["uvm"],
                "direct_over_uvm_hbm": t["direct"] / t["uvm_hbm"],
                **uvm_columns(t),
                **uvm_columns(t, "uvm_hbm"),
            }
            res.add(row)
            print(
                f"{name}: direct {row['direct_ms']:.2f} ms, UVM (host) {row['uvm_ms']:.2f} "
                f"ms, UVM (HBM) {row['uvm_hbm_ms']:.2f} ms; direct/UVM "
                f"{row['direct_over_uvm']:.2f}, direct/UVM (HBM) "
                f"{row['direct_over_uvm_hbm']:.2f}",
                flush=True,
            )
        return res.finish()


if __name__ == "__main__":
    sys.exit(main())
