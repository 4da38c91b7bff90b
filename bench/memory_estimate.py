"""How close is `mgg train`'s memory estimate to the peak RSS it then reaches?

For planted-partition graphs of several sizes, P ranks and models, runs ``mggrun -np P
mgg train --model M --json`` and compares each rank's peak RSS (VmHWM) with
``memory_estimate_mb``. Writes bench/results/memory_estimate.{json,md,png}.

    python bench/memory_estimate.py [--nodes 20000,...] [--ranks 1,2] [--models gcn,gat,...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import mgg_json, write_results

ROOT = Path(__file__).resolve().parents[1]


def run(n: int, p: int, epochs: int, model: str) -> dict:
    spec = f"planted:nodes={n},classes=8,degree=12,features=32"
    res = mgg_json(p, "train", "--dataset", spec, "--model", model, "--epochs", epochs)
    peak = max(res["peak_rss_mb"])
    est = res["memory_estimate_mb"]
    return {
        "model": model,
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
    ap.add_argument("--models", default="gcn,sage,gin,gat")
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for n in map(int, args.nodes.split(",")):
            for p in map(int, args.ranks.split(",")):
                r = run(n, p, args.epochs, model)
                rows.append(r)
                print(json.dumps(r), flush=True)
    heads = ["model", "nodes", "edges", "P", "peak RSS, largest rank (MB)", "estimate (MB)"]
    heads.append("ratio")
    table = [
        dict(zip(heads, (r["model"], r["nodes"], r["edges"], r["np"], round(max(r["peak_rss_mb"])),
                         round(r["memory_estimate_mb"]), round(r["ratio"], 2)), strict=True))
        for r in rows
    ]  # fmt: skip
    notes = "ratio: estimate / peak RSS of the largest rank (VmHWM); planted, 8 classes, F=32"
    write_results("memory_estimate", {"runs": rows, "args": vars(args)}, table, heads, notes)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        models = list(dict.fromkeys(r["model"] for r in rows))
        fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.5), squeeze=False)
        for ax, model in zip(axes[0], models, strict=True):
            for p in sorted({r["np"] for r in rows}):
                rs = [r for r in rows if r["np"] == p and r["model"] == model]
                ax.plot([r["nodes"] for r in rs], [max(r["peak_rss_mb"]) for r in rs], "o-",
                        label=f"peak RSS, P={p}")  # fmt: skip
                ax.plot([r["nodes"] for r in rs], [r["memory_estimate_mb"] for r in rs], "x--",
                        label=f"estimate, P={p}")  # fmt: skip
            ax.set(title=model.upper(), xlabel="nodes (12 edges per node)", xscale="log")
            ax.set_ylabel("MB per rank")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(ROOT / "bench" / "results" / "memory_estimate.png", dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
