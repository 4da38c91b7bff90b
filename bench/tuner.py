"""The tuner on a busy CPU: is its pick within 5% of the exhaustive best, run after run?

    python bench/tuner.py [--np 4] [--dim 16] [--runs 10] [--rmat-scale 16]

Per graph, ``--runs`` independent `mggrun -np P mgg tune GRAPH --exhaustive --json`
jobs. Each searches with the tuner's protocol, then measures the whole grid on its own
(5 rounds round-robin), then re-measures the start, the default, the model's guess, the
tuned and the grid's best configurations side by side (40 rounds: the judge's own noise
must stay well under the 5% it judges); the ratios are of those confirmed medians.
Goal (issue 18): tuned within 5% of the exhaustive best in >= 9 of 10 runs per graph,
never worse than 1.15x, with <= 15 configurations measured.
"""

from __future__ import annotations

import argparse

import numpy as np

from common import RESULTS, mgg_json, real_graphs, write_results

PICKS = ("tuned", "model_guess", "default", "start")


def plot(runs, graphs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.4 * len(graphs) + 2, 4))
    width = 0.8 / len(PICKS)
    for j, pick in enumerate(PICKS):
        for i, g in enumerate(graphs):
            ys = [r[f"{pick}_vs_exhaustive"] for r in runs if r["graph"] == g]
            xs = i + (j - (len(PICKS) - 1) / 2) * width + np.linspace(-0.3, 0.3, len(ys)) * width
            ax.scatter(xs, ys, s=14, color=f"C{j}", label=pick if i == 0 else None)
    ax.axhline(1.05, color="k", ls="--", lw=1, label="goal: within 5%")
    ax.axhline(1.15, color="r", ls=":", lw=1, label="never worse than 1.15x")
    ax.set_xticks(range(len(graphs)), graphs)
    ax.set_ylabel("confirmed latency / exhaustive best")
    ax.set_title(f"Tuner under noise, P = {runs[0]['np']}, D = {runs[0]['D']}, one dot a run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--rmat-scale", type=int, default=16)
    args = ap.parse_args()
    graphs = [(f"rmat-s{args.rmat_scale}", f"rmat:scale={args.rmat_scale},ef=16")]
    graphs += [(p.stem, str(p)) for p in real_graphs(("amazon_computers", "ego_twitter"))]
    runs, summary = [], []
    out = RESULTS / "tuner"
    for name, spec in graphs:
        for run in range(args.runs):
            res = mgg_json(
                args.np,
                "tune",
                spec,
                "--dim",
                args.dim,
                "--exhaustive",
                "--confirm",
                40,
                "--out",
                out,
            )
            conf = res["confirmed_latency_s"]
            row = {
                "graph": name,
                "run": run,
                "np": args.np,
                "D": args.dim,
                "measured": res["measured"],
                "samples": res["samples"],
                "noise": res["noise"],
                "confidence": res["confidence"],
                "tuned": res["best"],
                "exhaustive": res["exhaustive_best"],
                "exhaustive_ms": conf["exhaustive_best"] * 1e3,
                "search_s": res["search_seconds"],
            }
            for pick in PICKS:
                row[f"{pick}_vs_exhaustive"] = conf[pick] / conf["exhaustive_best"]
            runs.append(row)
            print(
                f"{name:>16} run {run}: {row['measured']:2d} configs, {row['samples']} "
                f"samples, noise {row['noise']:.1%}: tuned {row['tuned']} at "
                f"{row['tuned_vs_exhaustive']:.3f}x of {row['exhaustive']} "
                f"({row['exhaustive_ms']:.2f} ms); model guess "
                f"{row['model_guess_vs_exhaustive']:.3f}x",
                flush=True,
            )
        mine = [r for r in runs if r["graph"] == name]
        ratios = [r["tuned_vs_exhaustive"] for r in mine]
        summary.append(
            {
                "graph": name,
                "runs": len(mine),
                "within_5pct": sum(x <= 1.05 for x in ratios),
                "worst": max(ratios),
                "median": float(np.median(ratios)),
                "max_measured": max(r["measured"] for r in mine),
                "median_samples": float(np.median([r["samples"] for r in mine])),
                "noise": float(np.median([r["noise"] for r in mine])),
                "confidence": float(np.median([r["confidence"] for r in mine])),
                "model_guess_within_5pct": sum(
                    r["model_guess_vs_exhaustive"] <= 1.05 for r in mine
                ),
                "default_within_5pct": sum(r["default_vs_exhaustive"] <= 1.05 for r in mine),
                "search_s": float(np.median([r["search_s"] for r in mine])),
            }
        )
        s = summary[-1]
        s["goal_met"] = s["within_5pct"] >= 0.9 * s["runs"] and s["worst"] <= 1.15
        s["goal_met"] = s["goal_met"] and s["max_measured"] <= 15
    plot(runs, [g for g, _ in graphs], RESULTS / "tuner.png")
    write_results(
        "tuner",
        {"np": args.np, "dim": args.dim, "runs": runs},
        summary,
        [
            "graph",
            "runs",
            "within_5pct",
            "worst",
            "median",
            "max_measured",
            "median_samples",
            "noise",
            "confidence",
            "model_guess_within_5pct",
            "default_within_5pct",
            "search_s",
            "goal_met",
        ],
        notes="Each run one 4-rank job on this 2-core machine (oversubscribed: a busy "
        "machine). Ratios are confirmed medians (40 rounds side by side) over the "
        "exhaustive best, found by measuring the whole grid on its own (5 rounds "
        "round-robin). within_5pct: runs whose tuned pick is within 5%; "
        "model_guess_within_5pct / default_within_5pct: the same for the model's guess "
        "alone and for the default (16, 4, max threads). noise: median relative spread "
        "(MAD / median) of a configuration's samples. Every run in the JSON; the plot "
        "shows each run's ratios (tuner.png).",
    )


if __name__ == "__main__":
    main()
