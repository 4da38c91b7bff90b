"""Activations kept in host memory (`mgg train --offload`, issue 59 stage 3) on the CPU's
simulated device: what training holds on the "device" at its peak with and without it,
with and without --recompute, the bytes moved, the epoch, and the plan's estimate.

    python bench/offload.py [--graph planted:nodes=200000,classes=16,features=128]
        [--models gcn,sage,gin,gat] [--hidden 128] [--layers 4] [--epochs 3] [--repeat 2]

On the CPU backend the device is the process's heap and the host copies live in a shared
anonymous mapping (mgg.torch.offload), which Linux counts apart: RssAnon is what the
device holds, RssShmem what went to the host. Each run is one `mgg train --json` process
on one rank whose RssAnon and RssShmem a thread samples every 2 ms during fit (freed
blocks of 1 MiB or more go back to the kernel: MALLOC_MMAP_THRESHOLD_); `growth`: the
peak during fit over what the process held when fit began (the dataset, the plan, the
model), the activations' share of the device. The variants of a model run in turn,
``--repeat`` times; cells are the largest peak and the median epoch. The plan's column:
mgg.memory's device estimate of the activations (its `activations` part) for the job.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from common import RESULTS, csv_list, paired_bars, write_results

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "held": [],
    "offload": ["--offload"],
    "recompute": ["--recompute"],
    "recompute+offload": ["--recompute", "--offload"],
}


def _status() -> tuple[float, float]:
    """(RssAnon, RssShmem) of this process in MB."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssShmem"):
                got[key] = int(line.split()[1]) / 1024
    return got.get("RssAnon", 0.0), got.get("RssShmem", 0.0)


def child(argv: list[str]) -> int:
    """`mgg train ARGV --json` in this process, fit's peaks sampled: prints mgg's JSON,
    then a line {"fit_start_anon_mb", "fit_peak_anon_mb", "fit_peak_shmem_mb"}."""
    import mgg.train
    from mgg.cli import main

    peaks = {"on": False, "anon": 0.0, "shmem": 0.0, "start": 0.0}

    def sample():
        while True:
            if peaks["on"]:
                anon, shmem = _status()
                peaks["anon"], peaks["shmem"] = max(peaks["anon"], anon), max(peaks["shmem"], shmem)
            time.sleep(0.002)

    fit = mgg.train.Trainer.fit

    def sampled_fit(self, epochs):
        peaks["start"] = _status()[0]
        peaks["on"] = True
        try:
            return fit(self, epochs)
        finally:
            peaks["on"] = False

    mgg.train.Trainer.fit = sampled_fit
    threading.Thread(target=sample, daemon=True).start()
    rc = main(["train", *argv, "--json"])
    print(json.dumps({"fit_start_anon_mb": peaks["start"], "fit_peak_anon_mb": peaks["anon"],
                      "fit_peak_shmem_mb": peaks["shmem"]}), flush=True)  # fmt: skip
    return rc


def run(argv: list[str]) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 20), MGG_PROGRESS="0")
    r = subprocess.run([sys.executable, __file__, "--child", *map(str, argv)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=3600)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"mgg train {' '.join(map(str, argv))} failed:\n{r.stderr[-3000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return {**json.loads(lines[-2]), **json.loads(lines[-1])}


def planned(graph: str, model: str, hidden: int | None, layers: int, extra: list[str]) -> int:
    from mgg.graph.specs import resolve, spec_facts
    from mgg.memory import job_estimate, job_facts
    from mgg.torch import MODELS

    d = spec_facts(graph) or job_facts(resolve(graph))
    est = job_estimate(d, 1, "train", model=MODELS[model], rows=d["n"], device=True,
                       hidden=hidden, layers=layers, recompute="--recompute" in extra,
                       offload="--offload" in extra)  # fmt: skip
    return int(est["activations"] + est.get("attention", 0))


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="planted:nodes=200000,classes=16,features=128")
    ap.add_argument("--models", default="gcn,sage,gin,gat")
    ap.add_argument("--hidden", type=int, default=128, help="gcn, sage, gin (gat: its own)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    table, runs = [], {}
    for m in csv_list(args.models, allowed=["gcn", "sage", "gin", "gat"]):
        hidden = None if m == "gat" else args.hidden
        base = ["--dataset", args.graph, "--model", m, "--epochs", args.epochs,
                "--eval-every", "0", "--layers", args.layers,
                *(["--hidden", hidden] if hidden else [])]  # fmt: skip
        cell = {v: [] for v in VARIANTS}
        for rep in range(args.repeat):
            for v, extra in VARIANTS.items():
                res = run([*base, *extra])
                cell[v].append(res)
                print(f"{m} {v} rep {rep + 1}: device peak {res['fit_peak_anon_mb']:,.0f} MB "
                      f"(fit began at {res['fit_start_anon_mb']:,.0f}), host "
                      f"{res['fit_peak_shmem_mb']:,.0f} MB, epoch "
                      f"{res['epoch_time_s'] * 1e3:.0f} ms", flush=True)  # fmt: skip
        runs[m] = cell
        held = cell["held"]
        for v, rs in cell.items():
            peak = max(r["fit_peak_anon_mb"] for r in rs)
            growth = max(r["fit_peak_anon_mb"] - r["fit_start_anon_mb"] for r in rs)
            epoch = float(np.median([r["epoch_time_s"] for r in rs]))
            same = cell["recompute"] if "recompute" in v else held
            moved = rs[-1]["offloaded_bytes"][0]
            table.append({
                "model": m,
                "variant": v,
                "device_peak_mb": peak,
                "growth_mb": growth,
                "growth_vs_held": growth / max(r["fit_peak_anon_mb"] - r["fit_start_anon_mb"]
                                               for r in held),
                "planned_mb": planned(args.graph, m, hidden, args.layers, VARIANTS[v]) / 2**20,
                "host_peak_mb": max(r["fit_peak_shmem_mb"] for r in rs),
                "offloaded_mb": None if moved is None else moved / 2**20,
                "epoch_ms": epoch * 1e3,
                "epoch_vs_held": epoch / float(np.median([r["epoch_time_s"] for r in held])),
                "same_losses": all(np.array_equal(r["losses"], same[0]["losses"]) for r in rs),
            })  # fmt: skip
        write(args, table, runs)
    return 0


def write(args, table: list[dict], runs: dict) -> None:
    write_results(
        "offload",
        {"args": vars(args), "runs": runs},
        table,
        [
            "model",
            "variant",
            "device_peak_mb",
            "growth_mb",
            "growth_vs_held",
            "planned_mb",
            "host_peak_mb",
            "offloaded_mb",
            "epoch_ms",
            "epoch_vs_held",
            "same_losses",
        ],  # fmt: skip
        notes=(
            f"`{args.graph}`, one rank, float32, {args.layers} layers, hidden {args.hidden} "
            "(GAT: 8 heads x 8), "
            f"{args.epochs} epochs a run, {args.repeat} runs of each variant in turn. "
            "`device_peak_mb`: the simulated device's peak in fit (RssAnon); `growth_mb`: "
            "that peak over what the process held as fit began, the activations' share; "
            "`planned_mb`: the plan's device activations (and attention) for the job; "
            "`host_peak_mb`: the host copies' peak (RssShmem); `offloaded_mb`: what a step "
            "moved (mgg's `offloaded_bytes`); `same_losses`: bit for bit those of the run "
            "without --offload (held, or recompute). On the CPU the copies are host to "
            "host: the epoch column is the mechanism's cost with no link to hide."
        ),
    )
    growth = {r["variant"]: [] for r in table}
    planned_mb = {r["variant"]: [] for r in table}
    for r in table:
        growth[r["variant"]].append(r["growth_mb"])
        planned_mb[r["variant"]].append(r["planned_mb"])
    models = sorted({r["model"] for r in table}, key=[r["model"] for r in table].index)
    paired_bars(
        RESULTS / "offload.png",
        models,
        [
            ("device growth in fit (MB)", {s: growth[s] for s in ("held", "offload")}),
            (
                "with --recompute (MB)",
                {"held": growth["recompute"], "offload": growth["recompute+offload"]},
            ),
            ("planned device activations (MB)", {s: planned_mb[s] for s in ("held", "offload")}),
        ],  # fmt: skip
        {"held": "activations on the device", "offload": "--offload"},
        f"activations kept in host memory: {args.graph}, one rank (CPU, simulated device)",
    )


if __name__ == "__main__":
    raise SystemExit(main())
