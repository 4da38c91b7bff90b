"""The output layer for the labeled rows only (--output-rows labeled) against every row, on
a papers100M-shaped graph (1.4% of the nodes labeled): epoch time, peak memory and the
peer bytes of a training epoch, at P = 1 and 2.

    python bench/output_rows.py [--graph papers100m:scale=0.01] [--models gcn,sage]
                                [--ranks 1,2] [--epochs 3] [--repeat 2] [--hidden 128]
                                [--dtype bfloat16]

Each run is a `mggrun -np P mgg train --json` job; both variants of a (model, P) run in
turn, ``--repeat`` times, and each cell is the median of its runs' median epochs. The
accuracy and the losses of the two variants must agree (the same function on the rows the
loss and the metrics read).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from common import RESULTS, csv_list, mgg_json, paired_bars, write_results

VARIANTS = ("all", "labeled")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="papers100m:scale=0.01")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    models = csv_list(args.models, allowed=["gcn", "sage"])
    ranks = csv_list(args.ranks, cast=int)
    runs: dict = {}
    table = []
    for model in models:
        for p in ranks:
            cell = {v: [] for v in VARIANTS}
            for rep in range(args.repeat):
                for v in VARIANTS:
                    res = mgg_json(
                        p, "train", "--dataset", args.graph, "--model", model, "--epochs",
                        args.epochs, "--eval-every", "0", "--hidden", args.hidden, "--dtype",
                        args.dtype, "--output-rows", v,
                    )  # fmt: skip
                    cell[v].append(res)
                    print(f"{model} P={p} rep {rep + 1} {v}: epoch "
                          f"{res['epoch_time_s']:.2f} s", flush=True)  # fmt: skip
            runs[f"{model}/P{p}"] = cell
            table.append(row(model, p, cell))
            write(args, table, runs)
    return 0


def row(model: str, p: int, cell: dict) -> dict:
    epoch = {v: float(np.median([r["epoch_time_s"] for r in cell[v]])) for v in VARIANTS}
    peak = {v: max(max(r["peak_rss_mb"]) for r in cell[v]) for v in VARIANTS}
    full, cut = cell["all"][-1], cell["labeled"][-1]
    return {
        "model": model,
        "P": p,
        "epoch_all_s": epoch["all"],
        "epoch_labeled_s": epoch["labeled"],
        "speedup": epoch["all"] / epoch["labeled"],
        "peak_all_mb": peak["all"],
        "peak_labeled_mb": peak["labeled"],
        "peak_ratio": peak["labeled"] / peak["all"],
        "plan_labeled_mb": cut["memory_estimate_mb"],
        "peer_mb_all": (full["bytes_per_epoch"] or 0) / 1e6,
        "peer_mb_labeled": (cut["bytes_per_epoch"] or 0) / 1e6,
        "test_all": full["test_acc"],
        "test_labeled": cut["test_acc"],
        "losses_agree": bool(np.allclose(full["losses"], cut["losses"], rtol=1e-4)),
    }


def write(args, table: list[dict], runs: dict) -> None:
    cols = list(table[0])
    write_results(
        "output_rows",
        {"args": vars(args), "runs": runs},
        table,
        cols,
        notes=(
            f"`{args.graph}`, {args.dtype}, hidden {args.hidden}, {args.epochs} epochs a run, "
            f"median of {args.repeat} runs per variant in turn. `speedup`: the epoch with "
            "every output row over the one with the labeled rows alone; `peak_*`: the "
            "largest rank's VmHWM; `peer_mb_*`: rows fetched from peers per epoch."
        ),
    )
    plot(table, RESULTS / "output_rows.png")


def plot(table: list[dict], path: Path) -> None:
    sides = {"all": "every row", "labeled": "labeled rows"}
    paired_bars(
        path,
        [f"{r['model']} P={r['P']}" for r in table],
        [
            (label, {v: [r[f"{key}_{v}{unit}"] for r in table] for v in sides})
            for key, unit, label in (("epoch", "_s", "epoch (s)"), ("peak", "_mb", "peak RSS (MB)"))
        ],
        sides,
        "the output layer over every row vs the labeled rows alone",
    )


if __name__ == "__main__":
    raise SystemExit(main())
