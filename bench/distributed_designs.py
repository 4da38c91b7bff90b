"""Distributed aggregation designs on MPI: pipelined (MGG) vs bulk halo vs direct per-edge.

    python bench/distributed_designs.py [--np 2,4] [--dims 16,128] [--real | --graphs A,B]

Each configuration is one `mggrun -np P mgg check GRAPH --json` job, which verifies every
design against scipy and times them round-robin (median of the slowest rank), so the
ratios come from one run. Goals: pipelined >= 1.3x bulk halo and >= 3x direct.
"""

from __future__ import annotations

import argparse

import numpy as np

from common import RESULTS, mgg_json, real_graphs, write_results

DESIGNS = ("pipelined", "bulk_halo", "direct")


def run_check(nprocs, graph, dim, repeat):
    return mgg_json(
        nprocs, "check", graph, "--dim", dim, "--op", "sum", "--window", "all", "--repeat", repeat
    )


def rows_of(res, graph_name):
    rows = []
    for window in ("shm", "rma"):
        runs = {r["design"]: r for r in res["runs"] if r["window"] == window}
        p = runs["pipelined"]
        row = {
            "graph": graph_name,
            "np": res["np"],
            "D": res["dim"],
            "window": window,
            "all_ok": all(r["ok"] for r in runs.values()),
        }
        for d in DESIGNS:
            row[f"{d}_ms"] = runs[d]["seconds"] * 1e3
            row[f"{d}_wait_share"] = runs[d]["wait_seconds"] / runs[d]["seconds"]
            row[f"{d}_MB"] = runs[d]["remote_bytes"] / 1e6
        row["vs_bulk_halo"] = runs["bulk_halo"]["seconds"] / p["seconds"]
        row["vs_direct"] = runs["direct"]["seconds"] / p["seconds"]
        rows.append(row)
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=False)
    for ax, key, goal, title in (
        (axes[0], "vs_bulk_halo", 1.3, "pipelined vs bulk halo"),
        (axes[1], "vs_direct", 3.0, "pipelined vs direct per-edge"),
    ):
        labels = [f"{r['graph']} P{r['np']} D{r['D']} {r['window']}" for r in rows]
        xs = np.arange(len(rows))
        ax.bar(
            xs, [r[key] for r in rows], color=["C0" if r["window"] == "shm" else "C1" for r in rows]
        )
        ax.axhline(goal, color="k", ls="--", lw=1, label=f"goal {goal}x")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_xticks(xs, labels, fontsize=7, rotation=90)
        ax.set_ylabel("speedup (blue: shm window, orange: rma)")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rmat-scale", type=int, default=18)
    ap.add_argument("--real", action="store_true", help="also the graphs of ../shared/data")
    ap.add_argument(
        "--graphs", help="only these graphs of ../shared/data (results: distributed_designs-A-B)"
    )
    args = ap.parse_args()
    graphs = [(f"rmat-s{args.rmat_scale}", f"rmat:scale={args.rmat_scale},ef=16")]
    stem = "distributed_designs"
    if args.graphs:
        graphs = [(p.stem, str(p)) for p in real_graphs(tuple(args.graphs.split(",")))]
        stem += "-" + "-".join(name for name, _ in graphs)
    elif args.real:
        graphs += [
            (p.stem, str(p)) for p in real_graphs(("amazon_computers", "ego_twitter", "cnr_2000"))
        ]
    rows = []
    for name, spec in graphs:
        for nprocs in (int(n) for n in args.np.split(",")):
            for dim in (int(d) for d in args.dims.split(",")):
                for row in rows_of(run_check(nprocs, spec, dim, args.repeat), name):
                    rows.append(row)
                    print(
                        f"{name:>16} P={nprocs} D={dim:<4} {row['window']}: pipelined "
                        f"{row['pipelined_ms']:8.2f} ms  bulk {row['bulk_halo_ms']:8.2f}  "
                        f"direct {row['direct_ms']:8.2f}  -> {row['vs_bulk_halo']:.2f}x "
                        f"bulk, {row['vs_direct']:.2f}x direct"
                        f"{'' if row['all_ok'] else '  MISMATCH'}",
                        flush=True,
                    )
    plot(rows, RESULTS / f"{stem}.png")
    write_results(
        stem,
        {},
        rows,
        [
            "graph",
            "np",
            "D",
            "window",
            "pipelined_ms",
            "bulk_halo_ms",
            "direct_ms",
            "vs_bulk_halo",
            "vs_direct",
            "pipelined_wait_share",
            "bulk_halo_wait_share",
            "direct_wait_share",
            "pipelined_MB",
            "bulk_halo_MB",
            "direct_MB",
        ],
        notes="Times: median over round-robin calls of the slowest rank. wait_share: "
        "time a rank waits for remote rows / call time. MB: bytes copied "
        "from peers per call, all ranks (the shm pipelined design reads "
        "peers in place and copies nothing). P ranks share this machine's "
        "cores (oversubscribed beyond its core count).",
    )


if __name__ == "__main__":
    main()
