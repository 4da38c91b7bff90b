"""Test accuracy of bfloat16 rows against float32: every model, four real graphs, P = 1 and 4.

    python bench/bf16_accuracy.py [--models gcn,sage,gin,gat]
                                  [--datasets cora,pubmed,amazon_computers,coauthor_cs]
                                  [--ranks 1,4] [--seeds 0,1,2] [--timeout 1800] [--resume]

Each run is `mgg train --dataset ../shared/data/NAME.npz --model M --seed S --row-normalize
--dtype D --eval-every 0 --json` in a process of its own (P = 1: `.venv/bin/mgg`; P > 1:
`.venv/bin/mggrun -np P .venv/bin/mgg`), one after another, with the model's defaults
(epochs: the command's 200). ``--eval-every 0`` only skips the per-epoch evaluation: the
final accuracies are the same. The seed draws the weights, the dropout masks and, for the
graphs without a standard split (amazon_computers, coauthor_cs: 20 per class train, 30
val), the split. pubmed has no features here: mgg trains it on one-hot node ids.
Claim (issue 52): on every (model, graph, P), the mean test accuracy over the seeds in
bf16 is within 0.5 points of fp32, and P = 1 and P = 4 agree. A run that fails or whose
losses turn non-finite is recorded with its error and command, not retried. The results
are rewritten after each run; ``--resume`` keeps the runs of the results file and runs the
rest. Loss curves (first 50 epochs) are kept for cora GCN. Each pair has the 95%
confidence interval of its mean per-seed difference: a pair outside 0.5 points whose
interval holds 0 is noise the seeds cannot resolve (more seeds: ``--seeds``), not a loss.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE

import numpy as np

from common import RESULTS, ROOT, SHARED_DATA, csv_list, write_atomic, write_results

MODELS = ("gcn", "sage", "gin", "gat")
DATASETS = ("cora", "pubmed", "amazon_computers", "coauthor_cs")
DTYPES = ("float32", "bfloat16")
TOLERANCE = 0.5  # points of test accuracy
CURVE = ("gcn", "cora", 50)  # the loss curves kept: model, dataset, epochs
BIN = Path(".venv/bin")  # relative to the repository root, where the runs start


def train_command(model: str, dataset: str, p: int, dtype: str, seed: int) -> list[str]:
    """The exact command of one run, from the repository root."""
    data = Path("..") / "shared" / "data" / f"{dataset}.npz"
    launch = [str(BIN / "mggrun"), "-np", str(p)] if p > 1 else []
    return [
        *launch,
        str(BIN / "mgg"),
        "train",
        "--dataset",
        str(data),
        "--model",
        model,
        "--seed",
        str(seed),
        "--row-normalize",
        "--dtype",
        dtype,
        "--eval-every",
        "0",
        "--json",
    ]


def run_one(model: str, dataset: str, p: int, dtype: str, seed: int, timeout: float) -> dict:
    """One training run: its accuracies, wall time and, if it failed or diverged, why."""
    cmd = train_command(model, dataset, p, dtype, seed)
    run = {"model": model, "dataset": dataset, "P": p, "dtype": dtype, "seed": seed}
    run["command"] = shlex.join(cmd)
    t0 = time.perf_counter()
    # a session of its own, so that a timeout ends the launcher and its ranks together
    proc = subprocess.Popen(
        cmd, stdout=PIPE, stderr=PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        run["wall_s"] = time.perf_counter() - t0
        run["error"] = f"timed out after {timeout:.0f} s; stderr tail: {err[-2000:]}"
        return run
    run["wall_s"] = time.perf_counter() - t0
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        run["error"] = f"exit {proc.returncode}: " + (err.strip()[-3000:] or out[-3000:])
        return run
    try:
        res = json.loads(lines[-1])
    except json.JSONDecodeError:
        run["error"] = f"no JSON on the last line of stdout: {lines[-1][:500]!r}"
        return run
    losses = [float("nan") if v is None else float(v) for v in res["losses"]]
    for k in ("test_acc", "val_acc", "train_acc", "epoch_time_s", "dtype"):
        run[k] = res.get(k)
    run["epochs"] = len(losses)
    run["final_loss"] = losses[-1] if losses else None
    if (model, dataset) == CURVE[:2]:
        run["losses"] = losses[: CURVE[2]]
    if res.get("dtype") != dtype:
        run["error"] = f"the run reports dtype {res.get('dtype')!r}, asked {dtype!r}"
    elif not all(math.isfinite(v) for v in losses):
        first = next(i for i, v in enumerate(losses) if not math.isfinite(v))
        run["error"] = f"diverged: the loss is {losses[first]} at epoch {first + 1}"
    return run


def _stats(runs: list[dict]) -> tuple[float | None, float | None, int]:
    """Mean and sample std of the test accuracy (points) of the runs that succeeded."""
    acc = [100 * r["test_acc"] for r in runs if "error" not in r and r.get("test_acc") is not None]
    if not acc:
        return None, None, 0
    return float(np.mean(acc)), float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0, len(acc)


def _paired(a: list[dict], b: list[dict]) -> list[float]:
    """Per-seed differences b - a of test accuracy (points), over seeds both have."""
    ok = {r["seed"]: r["test_acc"] for r in a if "error" not in r}
    both = [r for r in b if "error" not in r and r["seed"] in ok]
    return [100 * (r["test_acc"] - ok[r["seed"]]) for r in both]


def _ci95(pair: list[float]) -> float | None:
    """Half-width of the 95% confidence interval of the mean of paired differences
    (Student's t over the seeds), or None under two seeds."""
    if len(pair) < 2:
        return None
    from scipy.stats import t

    return float(t.ppf(0.975, len(pair) - 1) * np.std(pair, ddof=1) / np.sqrt(len(pair)))


def _verdict(diff: float | None, ci: float | None) -> str:
    """'yes': the means within TOLERANCE; 'NO': outside it, and the seeds' interval
    excludes 0 (a difference they resolve); 'noise': outside it, but the interval holds
    0: the seeds cannot tell the difference from none."""
    if diff is None:
        return "-"
    if abs(diff) <= TOLERANCE:
        return "yes"
    return "noise" if ci is not None and abs(diff) <= ci else "NO"


def summarize(runs: list[dict], models, datasets, ranks) -> tuple[list[dict], list[dict]]:
    """Rows of the bf16-vs-fp32 table per (model, dataset, P) and of the P agreement table
    per (model, dataset, dtype)."""

    def pick(m, d, p, t):
        return [r for r in runs if (r["model"], r["dataset"], r["P"], r["dtype"]) == (m, d, p, t)]

    rows, agree = [], []
    for m in models:
        for d in datasets:
            for p in ranks:
                f32, b16 = pick(m, d, p, "float32"), pick(m, d, p, "bfloat16")
                if not f32 and not b16:
                    continue
                (fm, fs, fn), (bm, bs, bn) = _stats(f32), _stats(b16)
                diff = None if fm is None or bm is None else bm - fm
                pair = _paired(f32, b16)
                ci = _ci95(pair)
                errors = [r for r in f32 + b16 if "error" in r]
                rows.append(
                    {
                        "model": m,
                        "dataset": d,
                        "P": p,
                        "seeds": f"{fn}+{bn}",
                        "fp32": fm,
                        "fp32_std": fs,
                        "bf16": bm,
                        "bf16_std": bs,
                        "diff_points": diff,
                        "diff_std": float(np.std(pair, ddof=1)) if len(pair) > 1 else None,
                        "max_seed_diff": max(pair, key=abs) if pair else None,
                        "within_0.5": None if diff is None else abs(diff) <= TOLERANCE,
                        "ci95": ci,
                        "verdict": _verdict(diff, ci),
                        "fp32_epoch_ms": _median(f32, "epoch_time_s", 1e3),
                        "bf16_epoch_ms": _median(b16, "epoch_time_s", 1e3),
                        "wall_s": sum(r.get("wall_s", 0.0) for r in f32 + b16),
                        "errors": len(errors),
                    }
                )
            if len(ranks) < 2:
                continue
            for t in DTYPES:
                one, many = pick(m, d, ranks[0], t), pick(m, d, ranks[-1], t)
                if not one or not many:
                    continue
                (am, _, _), (bm, _, _) = _stats(one), _stats(many)
                pair = _paired(one, many)
                diff = None if am is None or bm is None else bm - am
                ci = _ci95(pair)
                agree.append(
                    {
                        "model": m,
                        "dataset": d,
                        "dtype": t,
                        "p_low": am,
                        "p_high": bm,
                        "diff_points": diff,
                        "max_seed_diff": max(pair, key=abs) if pair else None,
                        "within_0.5": None if diff is None else abs(diff) <= TOLERANCE,
                        "ci95": ci,
                        "verdict": _verdict(diff, ci),
                    }
                )
    return rows, agree


def loss_gap(runs: list[dict]) -> dict:
    """Per P: the largest |bf16 - fp32| training loss over the kept curves (same seed)."""
    curves = {(r["P"], r["dtype"], r["seed"]): r["losses"] for r in runs if r.get("losses")}
    gap = {}
    for (p, t, s), y in curves.items():
        ref = curves.get((p, "float32", s))
        if t == "bfloat16" and ref is not None:
            n = min(len(y), len(ref))
            d = float(np.max(np.abs(np.subtract(y[:n], ref[:n])))) if n else 0.0
            gap[p] = max(gap.get(p, 0.0), d)
    return dict(sorted(gap.items()))


def _median(runs, key, scale):
    v = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
    return float(np.median(v)) * scale if v else None


def _pm(mean, std) -> str:
    return "-" if mean is None else f"{mean:.2f} ± {std:.2f}"


def _pm_ci(v) -> str:
    return "-" if v is None else f"± {v:.2f}"


def _num(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _signed(v) -> str:
    return "-" if v is None else f"{v:+.2f}"


def plot(rows: list[dict], agree: list[dict], runs: list[dict], path: Path) -> None:
    """Top: bf16 - fp32 mean test accuracy per (model, dataset), one bar per P, with the
    ±0.5 point band and fp32's own P = 4 - P = 1 difference (reduction order only);
    bottom: the loss curves of cora GCN and their difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(12, 8))
    ax = fig.add_subplot(2, 1, 1)
    groups = list(dict.fromkeys((r["model"], r["dataset"]) for r in rows))
    ranks = sorted({r["P"] for r in rows})
    width = 0.8 / max(1, len(ranks))
    for i, p in enumerate(ranks):
        xs, ys, es = [], [], []
        for g, (m, d) in enumerate(groups):
            row = next((r for r in rows if (r["model"], r["dataset"], r["P"]) == (m, d, p)), None)
            if row is None or row["diff_points"] is None:
                continue
            xs.append(g + (i - (len(ranks) - 1) / 2) * width)
            ys.append(row["diff_points"])
            es.append(row["ci95"] or 0.0)
        ax.bar(xs, ys, width, yerr=es, capsize=2, label=f"P = {p}", color=f"C{i}")
    fp32 = {(a["model"], a["dataset"]): a["diff_points"] for a in agree if a["dtype"] == "float32"}
    floor = [(g, fp32[k]) for g, k in enumerate(groups) if fp32.get(k) is not None]
    if floor:
        xs, ys = np.array(floor).T
        ax.plot(xs, ys, "kx", ms=7, label=f"fp32 P={ranks[-1]} − P={ranks[0]}")
    ax.axhspan(-TOLERANCE, TOLERANCE, color="green", alpha=0.12, label="±0.5 points")
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(
        range(len(groups)), [f"{m} {d}" for m, d in groups], fontsize=7, rotation=30, ha="right"
    )
    ax.set_ylabel("bf16 − fp32 test accuracy (points)")
    ax.set_title(
        "bfloat16 rows vs float32: mean test accuracy over seeds (error bar: 95% CI of "
        "the mean per-seed difference)",
        fontsize=10,
    )
    ax.legend(fontsize=8)

    curves = {}
    for r in runs:
        if (r["model"], r["dataset"]) == CURVE[:2] and r.get("losses"):
            curves[(r["P"], r["dtype"], r["seed"])] = np.asarray(r["losses"], float)
    if curves:
        a1, a2 = fig.add_subplot(2, 2, 3), fig.add_subplot(2, 2, 4)
        for (p, t, s), y in sorted(curves.items()):
            a1.plot(
                np.arange(1, len(y) + 1),
                y,
                color=f"C{ranks.index(p) if p in ranks else 0}",
                ls="-" if t == "float32" else "--",
                lw=0.9,
                label=f"P={p} {t}" if s == min(k[2] for k in curves) else None,
            )
            other = curves.get((p, "float32", s))
            if t == "bfloat16" and other is not None:
                n = min(len(y), len(other))
                a2.plot(np.arange(1, n + 1), y[:n] - other[:n], lw=0.9, label=f"P={p} seed {s}")
        a1.set_xlabel("epoch")
        a1.set_ylabel("training loss")
        a1.set_title("cora GCN: loss, float32 (solid) vs bfloat16 (dashed)", fontsize=10)
        a1.legend(fontsize=7)
        a2.axhline(0, color="k", lw=0.6)
        a2.set_xlabel("epoch")
        a2.set_ylabel("bf16 − fp32 loss")
        a2.set_title("cora GCN: loss difference, same seed", fontsize=10)
        a2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--resume", action="store_true", help="keep the runs of the results file")
    ap.add_argument("--out-dir", default=None, help="default: bench/results")
    args = ap.parse_args()
    models = csv_list(args.models, MODELS)
    datasets = csv_list(args.datasets, DATASETS)
    ranks = sorted(csv_list(args.ranks, cast=int))
    seeds = csv_list(args.seeds, cast=int)
    dtypes = csv_list(args.dtypes, DTYPES)
    if not SHARED_DATA.is_dir():
        print(f"bf16_accuracy: {SHARED_DATA} is absent: nothing to measure (skipped)")
        return 0
    missing = [d for d in datasets if not (SHARED_DATA / f"{d}.npz").exists()]
    for d in missing:
        print(f"bf16_accuracy: {SHARED_DATA / d}.npz is absent: {d} skipped")
    datasets = [d for d in datasets if d not in missing]
    if not datasets:
        return 0
    default = (models, datasets, ranks, seeds, dtypes) == (
        list(MODELS),
        list(DATASETS),
        [1, 4],
        [0, 1, 2],
        list(DTYPES),
    )
    stem = "bf16_accuracy"
    if not default:
        stem += "-" + "-".join(
            [*models, *datasets, "p" + "_".join(map(str, ranks)), "s" + "_".join(map(str, seeds))]
            + ([] if dtypes == list(DTYPES) else dtypes)
        )
    out_dir = Path(args.out_dir) if args.out_dir else RESULTS
    key = ("model", "dataset", "P", "dtype", "seed")
    done = {}
    if args.resume and (out_dir / f"{stem}.json").exists():
        for r in json.loads((out_dir / f"{stem}.json").read_text()).get("runs", []):
            done[tuple(r[k] for k in key)] = r
    # fp32 and bf16 of one seed back to back, so a partial run already pairs them
    todo = [
        (m, d, p, t, s)
        for d in datasets
        for m in models
        for p in ranks
        for s in seeds
        for t in dtypes
    ]
    runs, t_start, spent = [], time.perf_counter(), 0.0
    fresh = 0
    for i, job in enumerate(todo, 1):
        if job in done:
            runs.append(done[job])
            continue
        run = run_one(*job, timeout=args.timeout)
        runs.append(run)
        fresh += 1
        spent += run["wall_s"]
        eta = spent / fresh * sum(1 for j in todo[i:] if j not in done)
        m, d, p, t, s = job
        what = (
            f"test {100 * run['test_acc']:.1f}%  loss {run['final_loss']:.4f}"
            if "error" not in run
            else "FAILED: " + run["error"].splitlines()[-1][:200]
        )
        print(
            f"[{i}/{len(todo)}] {m:>4} {d:>16} P={p} {t:>8} seed {s}: {what}  "
            f"({run['wall_s']:.1f} s; left ~{eta / 60:.0f} min)",
            flush=True,
        )
        if "error" in run:
            print(f"    reproduce: cd {ROOT} && {run['command']}", flush=True)
        save(stem, out_dir, runs, (models, datasets, ranks, seeds, dtypes), t_start)
    rows, agree = save(stem, out_dir, runs, (models, datasets, ranks, seeds, dtypes), t_start)
    plot(rows, agree, runs, out_dir / f"{stem}.png")
    print((out_dir / f"{stem}.md").read_text())
    return 0


def save(stem, out_dir, runs, grid, t_start):
    """Rewrite the results (JSON + markdown) with the runs so far."""
    models, datasets, ranks, seeds, dtypes = grid
    elapsed = time.perf_counter() - t_start
    rows, agree = summarize(runs, models, datasets, ranks)
    failed = [r for r in runs if "error" in r]
    outside = [r for r in rows if r["within_0.5"] is False]
    resolved = sum(r["verdict"] == "NO" for r in rows)
    total = sum(r.get("wall_s", 0.0) for r in runs)
    table = [
        {
            **r,
            "fp32 (mean ± std)": _pm(r["fp32"], r["fp32_std"]),
            "bf16 (mean ± std)": _pm(r["bf16"], r["bf16_std"]),
            "bf16 − fp32": _signed(r["diff_points"]),
            "worst seed": _signed(r["max_seed_diff"]),
            "95% CI": _pm_ci(r["ci95"]),
        }
        for r in rows
    ]
    p_many = ranks[-1] if len(ranks) > 1 else None
    agree_md = []
    if agree:
        agree_md = [
            "",
            f"## P = {ranks[0]} vs P = {p_many} (same seeds; mean test accuracy, points)",
            "",
            f"| model | dataset | dtype | P={ranks[0]} | P={p_many} | difference | worst seed "
            "| 95% CI | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for a in agree:
            agree_md.append(
                f"| {a['model']} | {a['dataset']} | {a['dtype']} | "
                f"{_num(a['p_low'])} | {_num(a['p_high'])} | "
                f"{_signed(a['diff_points'])} | {_signed(a['max_seed_diff'])} | "
                f"{_pm_ci(a['ci95'])} | {a['verdict']} |"
            )
    fails_md = []
    if failed:
        fails_md = ["", "## Failed or diverged runs", ""] + [
            f"- `{r['command']}`: {r['error'].splitlines()[-1][:300]}" for r in failed
        ]
    notes = (
        f"Test accuracy (points) over seeds {','.join(map(str, seeds))} (std: sample std over "
        f"the seeds), `--row-normalize`, each model's defaults (200 epochs). bf16 − fp32: the "
        f"difference of the means; worst seed: the largest per-seed difference; within 0.5: "
        f"|bf16 − fp32| <= {TOLERANCE} points (the claim of issue 52); 95% CI: of the mean "
        f"per-seed difference (same seed: same split, weights and masks; Student's t); "
        f"verdict: yes (within {TOLERANCE}), NO (outside, and the interval excludes 0) or "
        f"noise (outside, but the interval holds 0: these seeds cannot tell it from no "
        f"difference). Epoch: the median "
        f"epoch of the runs (`epoch_time_s`, ms; 2 shared cores, not a speed measurement). "
        f"The P = {ranks[0]} vs P = {ranks[-1]} table's float32 rows differ by float "
        f"reduction order only: the noise floor of a pair. "
        f"{len(runs)} runs, {len(failed)} failed or diverged, "
        f"{len(outside)} pair(s) outside 0.5 points ({resolved} of them resolved by the "
        f"seeds: verdict NO); {total / 60:.1f} min of runs in all."
    )
    curve = loss_gap(runs)
    if curve:
        gaps = ", ".join(f"P={p}: {v:.2g}" for p, v in curve.items())
        notes += f" cora GCN, first 50 epochs, largest |bf16 − fp32| training loss: {gaps}."
    path = write_results(
        stem,
        {
            "tolerance_points": TOLERANCE,
            "models": models,
            "datasets": datasets,
            "ranks": ranks,
            "seeds": seeds,
            "dtypes": dtypes,
            "elapsed_s": elapsed,
            "runs_wall_s": total,
            "all_within": bool(rows) and not outside and not failed,
            "p_agreement": agree,
            "loss_curve_max_abs_diff": curve,
            "runs": runs,
        },
        table,
        ["model", "dataset", "P", "fp32 (mean ± std)", "bf16 (mean ± std)", "bf16 − fp32"]
        + ["worst seed", "95% CI", "verdict", "fp32_epoch_ms", "bf16_epoch_ms", "wall_s"]
        + ["errors"],
        notes=notes,
        out_dir=out_dir,
    )
    md = path.with_suffix(".md")
    if agree_md or fails_md:
        write_atomic(md, md.read_text() + "\n".join(agree_md + fails_md) + "\n")
    return rows, agree


if __name__ == "__main__":
    sys.exit(main())
