"""Large dense inputs read a chunk at a time in training (ChunkedRows) against the code
before, on a papers100M-shaped graph: each rank's peak RSS in training, the epoch and the
memory plan, with and without --recompute.

    python bench/lean_activations.py --base REV [--graph papers100m:scale=0.01]
        [--models gcn,sage] [--hidden 64,128] [--ranks 1] [--epochs 3] [--repeat 2]

``--base``: a commit to compare with, checked out into a temporary git worktree whose
mgg the base runs import (run there, with it on PYTHONPATH); the new runs import this
tree's. ``--with``:
commits applied onto the base (the measure it lacks: fit_peak_rss_mb, training's peak
before the final evaluation). Each (model,
hidden, --recompute, P) runs base and new in turn, ``--repeat`` times; cells are the
median epoch and the largest peak. Recompute runs only where the first layer is as wide
as the input (there chunks are taken only while recomputing). The losses of the two must
agree: the same training.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from common import RESULTS, csv_list, mgg_json, paired_bars, write_results

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("base", "new")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit before the change")
    ap.add_argument("--with", dest="picks", default="", help="commits applied onto the base")
    ap.add_argument("--graph", default="papers100m:scale=0.01")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--hidden", default="64,128")
    ap.add_argument("--ranks", default="1")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    features = 128  # papers100m's
    cells = [
        (m, h, rc, p)
        for m in csv_list(args.models, allowed=["gcn", "sage"])
        for h in csv_list(args.hidden, cast=int)
        for rc in ((False, True) if h == features else (False,))
        for p in csv_list(args.ranks, cast=int)
    ]
    with tempfile.TemporaryDirectory(prefix="mgg-lean-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base),
                        args.base], check=True, capture_output=True)  # fmt: skip
        for rev in filter(None, args.picks.split(",")):
            subprocess.run(["git", "-C", str(base), "cherry-pick", "-n", rev], check=True,
                           capture_output=True)  # fmt: skip
        try:
            data = {}
            for m, p in sorted({(c[0], c[3]) for c in cells}):  # each model's graph, P
                data[m, p] = Path(tmp) / f"{m}-{p}"
                mgg_json(1, "partition", args.graph, "--np", p, "--model", m, "--out",
                         data[m, p], "--dtype", args.dtype)  # fmt: skip
            runs, table = {}, []
            # blocks of 1 MiB and more mapped and unmapped: RSS follows the live bytes, not
            # what malloc kept of the setup's (mgg keeps freed blocks below 1 GiB)
            live = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
            env = {"base": {"PYTHONPATH": str(base), **live}, "new": live}
            where = {"base": base, "new": ROOT}
            for m, h, rc, p in cells:
                cell = {s: [] for s in SIDES}
                for rep in range(args.repeat):
                    for side in SIDES:
                        res = mgg_json(
                            p, "train", "--dataset", data[m, p], "--model", m, "--hidden", h,
                            "--epochs", args.epochs, "--eval-every", "0", "--dtype",
                            args.dtype, "--output-rows", "labeled",
                            *(["--recompute"] if rc else []), env=env[side], cwd=where[side],
                        )  # fmt: skip
                        cell[side].append(res)
                        print(f"{m} h{h}{' recompute' if rc else ''} P={p} rep {rep + 1} "
                              f"{side}: epoch {res['epoch_time_s']:.2f} s, peak "
                              f"{max(res['fit_peak_rss_mb']):,.0f} MB", flush=True)  # fmt: skip
                runs[f"{m}/h{h}/{'recompute' if rc else 'keep'}/P{p}"] = cell
                table.append(row(m, h, rc, p, cell))
                write(args, table, runs)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           capture_output=True)  # fmt: skip
            shutil.rmtree(base, ignore_errors=True)
    return 0


def row(model: str, hidden: int, recompute: bool, p: int, cell: dict) -> dict:
    epoch = {s: float(np.median([r["epoch_time_s"] for r in cell[s]])) for s in SIDES}
    peak = {s: max(max(r["fit_peak_rss_mb"]) for r in cell[s]) for s in SIDES}
    plan = {s: cell[s][-1]["memory_estimate_mb"] for s in SIDES}
    losses = {s: cell[s][-1]["losses"] for s in SIDES}
    return {
        "model": model,
        "hidden": hidden,
        "recompute": recompute,
        "P": p,
        "peak_base_mb": peak["base"],
        "peak_new_mb": peak["new"],
        "peak_new/base": peak["new"] / peak["base"],
        "epoch_base_s": epoch["base"],
        "epoch_new_s": epoch["new"],
        "epoch_new/base": epoch["new"] / epoch["base"],
        "plan_base_mb": plan["base"],
        "plan_new_mb": plan["new"],
        "plan/peak_new": plan["new"] / peak["new"],
        "losses_agree": bool(np.allclose(losses["base"], losses["new"], rtol=1e-3)),
    }


def write(args, table: list[dict], runs: dict) -> None:
    write_results(
        "lean_activations",
        {"args": vars(args), "runs": runs},
        table,
        list(table[0]),
        notes=(
            f"`{args.graph}` (sharded once), {args.dtype}, --output-rows labeled, "
            f"{args.epochs} epochs a run; base (`{args.base}`"
            + (f" with `{args.picks}`" if args.picks else "")
            + ") and new in turn, "
            f"{args.repeat} times; the median epoch and the largest rank's largest VmHWM "
            "over the training (fit_peak_rss_mb), with MALLOC_MMAP_THRESHOLD_=1 MiB so that "
            "RSS follows the live bytes rather than what malloc kept of the setup's. "
            "New: dense "
            "inputs of 256 MiB or more are read a chunk at a time where the first layer "
            "multiplies them first (hidden < 128), or could while recomputing (hidden "
            "128), so no dropped-out copy of every input row is held. `losses_agree`: "
            "within 1e-3 (with --recompute at hidden 128 the first layer aggregates after "
            "its GEMM instead of before: float order)."
        ),
    )
    plot(table, RESULTS / "lean_activations.png")


def plot(table: list[dict], path: Path) -> None:
    paired_bars(
        path,
        [f"{r['model']} h{r['hidden']}{' rc' if r['recompute'] else ''} P={r['P']}" for r in table],
        [
            (label, {side: [r[f"{key}_{side}{unit}"] for r in table] for side in SIDES})
            for key, unit, label in (("peak", "_mb", "peak RSS (MB)"), ("epoch", "_s", "epoch (s)"))
        ],
        {side: side for side in SIDES},
        "training memory and time, before and after (papers100m stand-in)",
    )


if __name__ == "__main__":
    raise SystemExit(main())
