"""One training epoch, A/B between two commits: does a change leave training's speed as it was?

    python bench/ab_epoch.py [--base REV] [--head REV] [--models gcn,gat] [--np 1,4]
                             [--rounds 5] [--epochs 30] [--dataset NPZ] [--out DIR]

Each revision is checked out into a temporary git worktree under /tmp (removed at the end,
also on Ctrl-C or an error), and every run is `launch/mggrun -np P python -m mgg train ...
--eval-every 0 --json` of that worktree, with the worktree first on PYTHONPATH (so its mgg
is the one imported: checked before the first run) and this venv's Python. A run's time
is the median epoch of that run (epoch_time_s). Each round runs every (model, np) pair
once on each side, alternating which side goes first. Writes ab_epoch.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import RESULTS, ROOT, csv_list, paired_bars, write_results

SIDES = ("base", "head")


def rev_parse(rev: str) -> str:
    r = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"ab_epoch: {rev!r} is not a commit of {ROOT}")
    return r.stdout.strip()


def worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` at ``where`` (as bench/tree_ab.py makes them)."""
    cmd = ["git", "worktree", "add", "--detach", "-f", str(where), rev]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return where


def tree_env(tree: Path) -> dict:
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, MGG_PROGRESS="0")


def check_import(tree: Path) -> None:
    """The worktree's mgg is the one `python -m mgg` imports there (not the venv's)."""
    code = "import mgg; print(mgg.__file__)"
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    got = Path(r.stdout.strip()).resolve()
    if not got.is_relative_to(tree.resolve()):
        raise SystemExit(f"ab_epoch: the worktree {tree} imports mgg from {got}")


def epoch_s(tree: Path, model: str, nprocs: int, a) -> float:
    """One `mgg train` run in ``tree``: its median epoch time, in seconds."""
    cmd = [
        sys.executable,
        str(tree / "launch" / "mggrun"),
        "-np",
        str(nprocs),
        sys.executable,
        "-m",
        "mgg",
        "train",
        "--dataset",
        str(a.dataset),
        "--model",
        model,
        "--epochs",
        str(a.epochs),
        "--eval-every",
        "0",
        "--json",
    ]
    r = subprocess.run(cmd, cwd=tree, env=tree_env(tree), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ab_epoch: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return float(json.loads(r.stdout.strip().splitlines()[-1])["epoch_time_s"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="997f342", help="the commit before the change")
    ap.add_argument("--head", default="HEAD", help="the commit after it")
    ap.add_argument(
        "--dataset",
        default="../shared/data/amazon_computers.npz",
        help="a graph (path relative to the repo root)",
    )
    ap.add_argument("--models", default="gcn,gat")
    ap.add_argument("--np", default="1,4", help="process counts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    a = ap.parse_args()
    a.dataset = (ROOT / a.dataset).resolve()
    if not a.dataset.exists():
        raise SystemExit(f"ab_epoch: no dataset at {a.dataset}")
    models, nps = csv_list(a.models), csv_list(a.np, cast=int)
    pairs = [(m, p) for m in models for p in nps]
    revs = {"base": rev_parse(a.base), "head": rev_parse(a.head)}
    raw = {f"{m} np={p}": {s: [] for s in SIDES} for m, p in pairs}
    home = Path(tempfile.mkdtemp(prefix="ab-epoch-", dir="/tmp"))
    trees = {}
    try:
        for side in SIDES:
            trees[side] = worktree(revs[side], home / side / "mgg")
            check_import(trees[side])
        n, total = 0, a.rounds * len(pairs) * 2
        for r in range(a.rounds):
            for i, (m, p) in enumerate(pairs):
                for side in SIDES if (r + i) % 2 == 0 else SIDES[::-1]:
                    n += 1
                    t0 = time.perf_counter()
                    t = epoch_s(trees[side], m, p, a)
                    raw[f"{m} np={p}"][side].append(t)
                    print(
                        f"[{n}/{total}] round {r + 1} {m} np={p} {side} "
                        f"({revs[side][:9]}): epoch {t * 1e3:.1f} ms "
                        f"(run {time.perf_counter() - t0:.0f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
        shutil.rmtree(home, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT)
    table = [row(name, sides) for name, sides in raw.items()]
    meta = {"processor": platform.processor(), "cpu_count": os.cpu_count(),
            "uname": " ".join(platform.uname()[:5]), **revs}  # fmt: skip
    setup = {"dataset": str(a.dataset), "models": models, "np": nps, "rounds": a.rounds,
             "epochs": a.epochs, "base_rev": a.base, "head_rev": a.head}  # fmt: skip
    payload = {"setup": setup, "raw_epoch_s": raw}
    cols = ["pair", "base_ms", "base_range", "head_ms", "head_range", "head/base", "ratio_range"]
    notes = (
        f"base `{a.base}` = {revs['base'][:9]}, head `{a.head}` = {revs['head'][:9]}; "
        f"{a.dataset.name}, {a.epochs} epochs a run, --eval-every 0; {a.rounds} rounds, each "
        "running every pair on both sides, alternating which goes first. ms: median over the "
        "rounds of each run's median epoch; range: min-max over rounds; head/base: ratio of "
        "the medians, ratio_range: min-max of the rounds' head/base."
    )
    write_results("ab_epoch", payload, table, cols, notes=notes, extra_meta=meta, out_dir=a.out)
    ms = {s: [np.array(v[s]) * 1e3 for v in raw.values()] for s in SIDES}
    med = {s: [np.median(v) for v in ms[s]] for s in SIDES}
    whiskers = {s: np.array([[np.median(v) - v.min(), v.max() - np.median(v)] for v in ms[s]]).T
                for s in SIDES}  # fmt: skip
    paired_bars(
        a.out / "ab_epoch.png",
        list(raw),
        [("epoch (ms): median, min-max", med, whiskers)],
        {s: f"{s} {revs[s][:9]}" for s in SIDES},
        f"mgg train {a.dataset.stem}, {a.rounds} rounds",
    )
    for t in table:
        print(
            f"{t['pair']}: base {t['base_ms']:.1f} ms [{t['base_range']}], head "
            f"{t['head_ms']:.1f} ms [{t['head_range']}], head/base {t['head/base']:.3f} "
            f"[{t['ratio_range']}]"
        )
    print(f"wrote {a.out / 'ab_epoch.json'}, .md, .png")


def row(name: str, sides: dict) -> dict:
    b, h = (np.array(sides[s]) * 1e3 for s in SIDES)

    def span(v):
        return f"{v.min():.4g}-{v.max():.4g}"

    mb, mh = float(np.median(b)), float(np.median(h))
    return {"pair": name, "base_ms": mb, "base_range": span(b), "head_ms": mh,
            "head_range": span(h), "head/base": mh / mb, "ratio_range": span(h / b)}  # fmt: skip


if __name__ == "__main__":
    main()
