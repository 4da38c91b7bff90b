"""A benchmark run on two trees of mgg, interleaved: is a change behaviour-neutral in speed?

    python bench/tree_ab.py --old REV [--new REV] [--rounds 3] -- SCRIPT [ARGS...]

Both trees are checked out as temporary worktrees (``--new`` defaults to HEAD), so the
checkout's own results stay as they are. Each round runs ``bench/SCRIPT ARGS`` once in
each tree, alternating which goes first, each against its own mgg (PYTHONPATH) and
writing into its own bench/results; the rows of the result each run writes are matched
by their non-float columns, and every ``*_ms`` column compared: median over rounds of
new / old, with the rounds' spread of old against old as the noise to judge it by.
Writes bench/results/tree_ab-SCRIPT.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, write_results


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-f", str(where), rev],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    shared = ROOT.parent / "shared"
    if shared.exists() and not (where.parent / "shared").exists():
        (where.parent / "shared").symlink_to(shared)  # the benchmarks' real graphs
    return where


def run(tree: Path, script: str, args: list[str]) -> list[dict]:
    """One run of bench/SCRIPT in ``tree``; the table of the result file it wrote."""
    before = time.time()
    env = dict(os.environ, PYTHONPATH=str(tree), MGG_PROGRESS="0")
    cmd = [sys.executable, str(tree / "bench" / script), *args]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    results = (tree / "bench" / "results").glob("*.json")
    written = [p for p in results if p.stat().st_mtime >= before]
    if len(written) != 1:
        raise SystemExit(f"{script} wrote {len(written)} result files, expected 1")
    return json.loads(written[0].read_text())["table"]


def key(row: dict) -> tuple:
    return tuple((k, v) for k, v in sorted(row.items()) if not isinstance(v, float))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the tree before the change (a git revision)")
    ap.add_argument("--new", default="HEAD", help="the tree after it (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("script", help="a script of bench/, then its arguments")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    revs = {
        name: subprocess.run(
            ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        for name, rev in (("old", a.old), ("new", a.new))
    }
    home = Path(tempfile.mkdtemp(prefix="tree-ab-"))
    trees = {name: worktree(rev, home / name / "mgg") for name, rev in revs.items()}
    runs = {"old": [], "new": []}
    try:
        for r in range(a.rounds):
            for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                t0 = time.perf_counter()
                runs[name].append({key(row): row for row in run(trees[name], a.script, a.args)})
                print(f"round {r + 1}/{a.rounds} {name} ({revs[name]}): "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
        shutil.rmtree(home, ignore_errors=True)
    rows = []
    for k, first in runs["old"][0].items():
        for col in (c for c, v in first.items() if c.endswith("_ms") and v is not None):
            old = np.array([rn[k][col] for rn in runs["old"]])
            new = np.array([rn[k][col] for rn in runs["new"]])
            rows.append(
                {
                    **dict(k),
                    "time": col.removesuffix("_ms"),
                    "old_ms": float(np.median(old)),
                    "new_ms": float(np.median(new)),
                    "new_vs_old": float(np.median(new) / np.median(old)),
                    "old_spread": float((old.max() - old.min()) / np.median(old)),
                }
            )
    ratios = np.array([r["new_vs_old"] for r in rows])
    noise = np.array([r["old_spread"] for r in rows])
    summary = {
        "old": revs["old"],
        "new": revs["new"],
        "rounds": a.rounds,
        "script": [a.script, *a.args],
        "median_new_vs_old": float(np.median(ratios)),
        "geomean_new_vs_old": float(np.exp(np.log(ratios).mean())),
        "median_old_spread": float(np.median(noise)),
    }
    print(json.dumps(summary))
    stem = f"tree_ab-{Path(a.script).stem}"
    plot(rows, summary, RESULTS / f"{stem}.png")
    ids = [c for c in rows[0] if c not in ("old_ms", "new_ms", "new_vs_old", "old_spread")]
    write_results(
        stem,
        {"summary": summary},
        rows,
        [*ids, "old_ms", "new_ms", "new_vs_old", "old_spread"],
        notes=f"old {revs['old']} vs new {revs['new']}, {a.rounds} rounds interleaved (each "
        "round runs both trees, alternating which goes first); ms: median over rounds; "
        "old_spread: (max - min) / median of the old tree's rounds, the noise a ratio is "
        f"judged by. Median new/old {summary['median_new_vs_old']:.3f}, geometric mean "
        f"{summary['geomean_new_vs_old']:.3f}, median old spread "
        f"{summary['median_old_spread']:.3f}.",
    )


def plot(rows, summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(rows)), 4.5))
    xs = np.arange(len(rows))
    ax.bar(xs, [r["new_vs_old"] for r in rows], color="C0", label="new / old (median)")
    ax.errorbar(
        xs, np.ones(len(rows)), yerr=[r["old_spread"] / 2 for r in rows], fmt="none",
        color="k", lw=0.8, label="1 ± half the old tree's range over rounds",
    )  # fmt: skip
    shown = [k for k, v in rows[0].items() if not isinstance(v, float | bool) and k != "time"]
    labels = [" ".join(f"{k}={r[k]}" for k in shown) + f" {r['time']}" for r in rows]
    ax.set_xticks(xs, labels, rotation=90, fontsize=6)
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_ylabel("time, new tree / old tree")
    ax.set_title(f"{' '.join(summary['script'])}: {summary['new']} vs {summary['old']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
