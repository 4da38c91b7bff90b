"""How close is `mgg train`'s memory estimate to the peak RSS it then reaches?

For planted-partition graphs of several sizes and P ranks, runs ``mggrun -np P mgg train
--json`` and compares each rank's peak RSS (VmHWM) with ``memory_estimate_mb``. Writes
bench/results/memory_estimate.{json,md,png}.

    python bench/memory_estimate.py [--nodes 20000,100000,300000,600000,1000000] [--ranks 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from common import write_results

ROOT = Path(__file__).resolve().parents[1]


def run(n: int, p: int, epochs: int) -> dict:
    spec = f"planted:nodes={n},classes=8,degree=12,features=32"
    cmd = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(p), "mgg", "train"]
    cmd += ["--dataset", spec, "--epochs", str(epochs), "--json"]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env=dict(os.environ, MGG_PROGRESS="0")
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    peak = max(res["peak_rss_mb"])
    est = res["memory_estimate_mb"]
    return {
        "nodes": n,
        "edges": res["num_edges"],
        "np": p,
        "peak_rss_mb": res["peak_rss_mb"],
        "memory_estimate_mb": est,
        "ratio": est / peak,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="20000,100000,300000,600000,1000000")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for n in map(int, args.nodes.split(",")):
        for p in map(int, args.ranks.split(",")):
            r = run(n, p, args.epochs)
            rows.append(r)
            print(json.dumps(r), flush=True)
    heads = ["nodes", "edges", "P", "peak RSS, largest rank (MB)", "estimate (MB)", "ratio"]
    table = [
        dict(zip(heads, (r["nodes"], r["edges"], r["np"], round(max(r["peak_rss_mb"])),
                         round(r["memory_estimate_mb"]), round(r["ratio"], 2)), strict=True))
        for r in rows
    ]  # fmt: skip
    notes = "ratio: estimate / peak RSS of the largest rank (VmHWM); planted, 8 classes, F=32"
    write_results("memory_estimate", {"runs": rows, "args": vars(args)}, table, heads, notes)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for p in sorted({r["np"] for r in rows}):
            rs = [r for r in rows if r["np"] == p]
            ax.plot([r["nodes"] for r in rs], [max(r["peak_rss_mb"]) for r in rs], "o-",
                    label=f"peak RSS, P={p}")  # fmt: skip
            ax.plot([r["nodes"] for r in rs], [r["memory_estimate_mb"] for r in rs], "x--",
                    label=f"estimate, P={p}")  # fmt: skip
        ax.set(xlabel="nodes (12 edges per node)", ylabel="MB per rank", xscale="log")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(ROOT / "bench" / "results" / "memory_estimate.png", dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
