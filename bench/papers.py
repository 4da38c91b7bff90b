"""papers100m at P = 1, 2, 4: drawn and partitioned by the ranks, then trained from its
shards; time and memory per rank, against the memory plan.

    python bench/papers.py [--scale 0.05] [--ranks 1,2,4] [--epochs 3] [--dtype bfloat16]
                           [--work DIR]

For each P, each in its own processes:
- `mggrun -np P mgg partition papers100m:scale=S --out DIR --distributed` (rank r draws
  its share; no process holds the graph): seconds, peak RSS per rank;
- `mgg plan DIR --np P` (before the job) and `mggrun -np P mgg train --dataset DIR` (GCN):
  the median epoch, test accuracy, peak RSS (VmHWM) and PSS at the end per rank, and the
  plan's bytes against the measured peak of the largest rank.
Goal: the largest rank's peak at P = 4 <= 0.3x P = 1's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from common import RESULTS, mgg_json, write_results

GOAL = 0.3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", help="of the rows and the stored features")
    ap.add_argument("--work", default="/tmp/mgg-papers")
    args = ap.parse_args()
    ranks = [int(p) for p in args.ranks.split(",")]
    spec = f"papers100m:scale={args.scale:g}"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows, raw = [], {}
    for p in ranks:
        out = work / f"p{p}"
        t0 = time.perf_counter()
        part = mgg_json(
            p, "partition", spec, "--out", out, "--distributed", "--force", "--dtype", args.dtype
        )
        part_wall = time.perf_counter() - t0
        planned = mgg_json(1, "plan", out, "--np", p, "--dtype", args.dtype)
        train = mgg_json(
            p, "train", "--dataset", out, "--epochs", args.epochs, "--eval-every", "0",
            "--dtype", args.dtype,
        )  # fmt: skip
        raw[p] = {"partition": part, "plan": planned, "train": train}
        big = max(planned["per_rank"], key=lambda r: r["total_bytes"])
        rows.append(
            {
                "P": p,
                "nodes": part["num_nodes"],
                "edges": part["num_edges"],
                "partition_s": part_wall,
                "partition_peak_mb": max(part["peak_rss_mb"]),
                "epoch_s": train["epoch_time_s"],
                "test_acc": train["test_acc"],
                "train_peak_mb": max(train["peak_rss_mb"]),
                "train_pss_mb": max(train["pss_mb"]),
                "planned_mb": big["total_bytes"] / 2**20,
                "plan_vs_peak": big["total_bytes"] / train["peak_bytes"],
                "train_is_plan": train["planned_bytes"] == big["total_bytes"],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(out, ignore_errors=True)
    p1 = rows[0]
    for r in rows:
        r["peak_vs_P1"] = r["train_peak_mb"] / p1["train_peak_mb"]
        r["pss_vs_P1"] = r["train_pss_mb"] / p1["train_pss_mb"]
    last = rows[-1]
    notes = (
        f"`{spec}`: {last['nodes']:,} nodes, {last['edges']:,} CSR entries (the plans add a "
        f"self loop per node), 128 features, 172 classes; rows and stored features in "
        f"{args.dtype}; GCN (hidden 16), {args.epochs} epochs. Partition: `mggrun -np P mgg "
        "partition SPEC --out DIR --distributed` (each rank draws its share; wall seconds, "
        "peak RSS of the largest rank). Train from the shards: median epoch, peak RSS "
        "(VmHWM) and PSS at the end of the largest rank. planned: `mgg plan DIR --np P`, "
        "which `mgg train` reports too (train_is_plan). At P = "
        f"{last['P']} the largest rank peaks at **{last['peak_vs_P1']:.2f}x** P = 1's "
        f"(goal <= {GOAL}x), PSS {last['pss_vs_P1']:.2f}x. This 2-core machine runs the P "
        "ranks on 2 cores, so seconds do not fall with P."
    )
    name = f"papers-s{args.scale:g}"
    cols = ["P", "partition_s", "partition_peak_mb", "epoch_s", "train_peak_mb"]
    cols += ["peak_vs_P1", "train_pss_mb", "pss_vs_P1", "planned_mb", "plan_vs_peak"]
    cols += ["train_is_plan"]
    write_results(name, {"spec": spec, "goal": GOAL, "runs": raw}, rows, cols, notes)
    plot(rows, name)


def plot(rows, name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = [r["P"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (
        ("train_peak_mb", "train: peak RSS"),
        ("train_pss_mb", "train: PSS at the end"),
        ("planned_mb", "train: mgg plan"),
        ("partition_peak_mb", "partition --distributed: peak RSS"),
    ):
        ax.plot(ps, [r[key] / 1024 for r in rows], "o-", label=label)
    ideal = [rows[0]["train_peak_mb"] * GOAL / 1024] * len(ps)
    ax.plot(ps, ideal, "k:", lw=1, label=f"goal at P = 4: {GOAL}x P = 1")
    ax.set_xticks(ps)
    ax.set_xlabel("ranks P")
    ax.set_ylabel("GiB, largest rank")
    ax.set_title(f"{name}: memory per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=120)


if __name__ == "__main__":
    main()
