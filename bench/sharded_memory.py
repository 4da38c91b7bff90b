"""Memory per rank from the file to the trained model: sharded datasets and the
distributed partitioner against every rank reading the whole dataset.

    python bench/sharded_memory.py [--nodes 2000000] [--degree 30] [--features 128]
                                   [--epochs 2] [--ranks 1,2,4] [--work DIR]

A planted-partition graph (N nodes, N*degree CSR entries, 128 features, labels) is saved
once as an uncompressed npz. For each P it measures, each command in its own processes:
- `mgg partition FILE --np P --out` (one process builds every rank's plan) and
  `mggrun -np P mgg partition FILE --out --distributed` (rank r reads its slice): time and
  peak RSS per rank; the two must write bit-identical plans (same digests);
- `mggrun -np P mgg train --dataset SHARDS`: peak RSS per rank (goal: at P = 4 each rank
  <= 0.35x the P = 1 peak) and the median epoch;
- `mggrun -np P mgg train --dataset FILE` (every rank loads the whole dataset, as before
  sharding) where P copies fit in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, machine, mgg_json, write_results

GOAL = 0.35


def make_dataset(path: Path, nodes: int, degree: int, features: int) -> dict:
    from mgg.graph.formats import write_npz
    from mgg.graph.generators import planted_partition

    t0 = time.perf_counter()
    ds = planted_partition(nodes, 16, avg_degree=degree, num_features=features, seed=0)
    g = ds.graph
    write_npz(ds, path, compressed=False)  # stored, so that ranks seek in it
    return {
        "nodes": g.num_nodes,
        "edges": g.num_edges,
        "features": features,
        "file_gib": path.stat().st_size / 2**30,
        "generate_s": time.perf_counter() - t0,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2_000_000)
    ap.add_argument("--degree", type=int, default=30)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--work", default="/tmp/mgg-sharded-memory")
    args = ap.parse_args()
    ranks = [int(p) for p in args.ranks.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"planted-{args.nodes}-d{args.degree}-f{args.features}.npz"
    data = make_dataset(src, args.nodes, args.degree, args.features)
    print(f"dataset {src}: {data}", flush=True)
    mem_gib = machine()["memory_gib"] or 0
    floor = process_floor_mb()
    print(f"a rank's floor (python, torch, numba, mpi4py imported): {floor:.0f} MB", flush=True)
    train = ["--epochs", args.epochs, "--eval-every", "0"]
    rows, raw = [], {}
    for p in ranks:
        one = mgg_json(1, "partition", src, "--np", p, "--out", work / f"one-{p}", "--force")
        dist = mgg_json(
            p, "partition", src, "--out", work / f"dist-{p}", "--distributed", "--force"
        )
        same = one["digests"] == dist["digests"]
        sharded = mgg_json(p, "train", "--dataset", work / f"dist-{p}", *train)
        raw[p] = {"partition": one, "distributed": dist, "train_sharded": sharded}
        for mode, res in (("partition, one process", one), ("partition --distributed", dist)):
            rows.append(
                {
                    "P": p,
                    "what": mode,
                    "peak_rss_per_rank_mb": max(res["peak_rss_mb"]),
                    "seconds": res["load_seconds"] + res["plan_seconds"] + res["write_seconds"],
                    "plans_identical": same,
                }
            )
        rows.append(
            {
                "P": p,
                "what": "train from shards",
                "peak_rss_per_rank_mb": max(sharded["peak_rss_mb"]),
                "seconds": sharded["epoch_time_s"],
            }
        )
        whole_peak = raw.get(1, {}).get("train_file", {}).get("peak_rss_mb", [0])[0]
        if p == 1 or (whole_peak * p / 1024 < 0.7 * mem_gib):
            whole = mgg_json(p, "train", "--dataset", src, *train)
            raw[p]["train_file"] = whole
            rows.append(
                {
                    "P": p,
                    "what": "train from the file (every rank loads all)",
                    "peak_rss_per_rank_mb": max(whole["peak_rss_mb"]),
                    "seconds": whole["epoch_time_s"],
                }
            )
        print(json.dumps(rows[-4:], indent=None), flush=True)
        for d in (f"one-{p}",):
            shutil.rmtree(work / d, ignore_errors=True)
    base = {r["what"]: r["peak_rss_per_rank_mb"] for r in rows if r["P"] == 1}
    for r in rows:
        b = base.get(r["what"])
        r["vs_P1"] = r["peak_rss_per_rank_mb"] / b if b else None
        r["above_floor_vs_P1"] = (r["peak_rss_per_rank_mb"] - floor) / (b - floor) if b else None
    p_max = max(ranks)
    mine = next(r for r in rows if r["P"] == p_max and r["what"] == "train from shards")
    got, above = mine["vs_P1"], mine["above_floor_vs_P1"]
    notes = (
        f"Planted partition: {data['nodes']:,} nodes, {data['edges']:,} edges, "
        f"{data['features']} dense features, 16 classes; GCN, {args.epochs} epochs. Peak RSS "
        f"is the largest rank's (VmHWM). Train from shards at P = {p_max}: "
        f"**{got:.2f}x** the P = 1 peak per rank (goal <= {GOAL}x); above a rank's floor "
        f"of {floor:.0f} MB (the interpreter with torch, numba and mpi4py imported) "
        f"{above:.2f}x (1/P = {1 / p_max:.2f}). 'seconds' is the median "
        "epoch for training, load + plan + write for partitioning (this 2-core machine runs "
        "P ranks on 2 cores)."
    )
    name = "sharded_memory" + (f"-n{args.nodes}" if args.nodes != 2_000_000 else "")
    write_results(
        name,
        {"dataset": data, "goal": GOAL, "floor_mb": floor, "runs": raw},
        rows,
        [
            "P",
            "what",
            "peak_rss_per_rank_mb",
            "vs_P1",
            "above_floor_vs_P1",
            "seconds",
            "plans_identical",
        ],
        notes,
    )
    plot(rows, ranks, floor, name)
    os.remove(src)


def process_floor_mb() -> float:
    """Peak RSS of a process that only imports what a rank imports (MB)."""
    code = (
        "import torch, numba, scipy.sparse; from mpi4py import MPI; "
        "import mgg.cli, mgg.train, mgg.partition.shards; "
        "print(mgg.memory.peak_rss_mb())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def plot(rows, ranks, floor, name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    whats = list(dict.fromkeys(r["what"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(whats)
    for i, w in enumerate(whats):
        xs = [j + i * width for j, p in enumerate(ranks)]
        ys = [
            next(
                (r["peak_rss_per_rank_mb"] / 1024 for r in rows if r["P"] == p and r["what"] == w),
                0,
            )
            for p in ranks
        ]
        ax.bar(xs, ys, width, label=w)
    p1 = next(r["peak_rss_per_rank_mb"] for r in rows if r["what"] == "train from shards")
    ideal = [(floor + (p1 - floor) / p) / 1024 for p in ranks]
    ax.plot(
        [j + 0.4 - width / 2 for j in range(len(ranks))],
        ideal,
        "k--",
        lw=1,
        label="floor + (train P=1 - floor) / P",
    )
    ax.axhline(floor / 1024, color="gray", lw=0.8, ls=":", label="a rank's floor (imports)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ranks))], [f"P = {p}" for p in ranks])
    ax.set_ylabel("peak RSS of the largest rank (GiB)")
    ax.set_title("memory per rank: sharded datasets vs every rank loading all")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)


if __name__ == "__main__":
    main()
