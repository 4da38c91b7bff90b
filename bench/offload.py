"""Activations kept in host memory (`mgg train --offload`, issue 59 stage 3) on the CPU's
simulated device: what training holds on the "device" at its peak with and without it,
with and without --recompute, the bytes moved, the epoch, and the plan's estimate.

    python bench/offload.py [--graph planted:nodes=200000,classes=16,features=128]
        [--models gcn,sage,gin,gat] [--hidden 128] [--layers 2,4] [--epochs 3] [--repeat 2]
        [--backend cpu|cuda] [--dtype float32|bfloat16] [--output-rows all|labeled]
        [--name offload]

On the CPU backend the device is the process's heap and the host copies live in a shared
anonymous mapping (mgg.torch.offload), which Linux counts apart: RssAnon is what the
device holds, RssShmem what went to the host. Each run is one `mgg train --json` process
on one rank whose RssAnon and RssShmem a thread samples every 2 ms during fit (freed
blocks of 1 MiB or more go back to the kernel: MALLOC_MMAP_THRESHOLD_); `growth`: the
peak during fit over what the process held when fit began (the dataset, the plan, the
model), the activations' share of the device. The variants of a model run in turn,
``--repeat`` times; cells are the largest peak and the median epoch. The plan's column:
mgg.memory's device estimate of the activations (its `activations` part) for the job.
With ``--backend cuda`` (the GPU stage 'offload') the device's peak is mgg's
`peak_device_bytes` of the run (its pools' peak), and the results go to bench/results/gpu.
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
    """One `mgg train` process: its JSON with fit's sampled peaks."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 20), MGG_PROGRESS="0")
    r = subprocess.run([sys.executable, __file__, "--child", *map(str, argv)], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=3600)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"mgg train {' '.join(map(str, argv))} failed:\n{r.stderr[-3000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return {**json.loads(lines[-2]), **json.loads(lines[-1])}


def planned(graph: str, model: str, hidden: int | None, layers: int, **job):
    """variant's flags -> the plan's device activations (and attention) of the job (``job``:
    its dtype and output_rows)."""
    from mgg.footprint import job_estimate
    from mgg.graph.facts import job_facts
    from mgg.graph.specs import resolve, spec_facts
    from mgg.torch import MODELS

    d = spec_facts(graph) or job_facts(resolve(graph))

    def of(extra: list[str]) -> int:
        est = job_estimate(d, 1, "train", model=MODELS[model], rows=d["n"], device=True,
                           hidden=hidden, layers=layers, recompute="--recompute" in extra,
                           offload="--offload" in extra, **job)  # fmt: skip
        return int(est["activations"] + est.get("attention", 0))

    return of


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="planted:nodes=200000,classes=16,features=128")
    ap.add_argument("--models", default="gcn,sage,gin,gat")
    ap.add_argument("--hidden", type=int, default=128, help="gcn, sage, gin (gat: its own)")
    ap.add_argument("--layers", default="2,4")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--output-rows", default="all", choices=["all", "labeled"])
    ap.add_argument("--name", default="offload", help="the results' name (GPU: _gpu added)")
    args = ap.parse_args()
    job = {"dtype": args.dtype, "output_rows": args.output_rows}
    gpu = args.backend == "cuda"
    table, runs = [], {}
    for m in csv_list(args.models, allowed=["gcn", "sage", "gin", "gat"]):
        hidden = None if m == "gat" else args.hidden
        for layers in csv_list(args.layers, cast=int):
            base = ["--dataset", args.graph, "--model", m, "--epochs", args.epochs,
                    "--eval-every", "0", "--layers", layers, "--backend", args.backend,
                    "--dtype", args.dtype, "--output-rows", args.output_rows,
                    *(["--hidden", hidden] if hidden else [])]  # fmt: skip
            cell = {v: [] for v in VARIANTS}
            for rep in range(args.repeat):
                for v, extra in VARIANTS.items():
                    res = run([*base, *extra])
                    cell[v].append(res)
                    print(f"{m} x{layers} {v} rep {rep + 1}: device {device_mb(res, gpu):,.0f} "
                          f"MB, epoch {res['epoch_time_s'] * 1e3:.0f} ms", flush=True)  # fmt: skip
            runs[f"{m} x{layers}"] = cell
            table += rows(m, layers, cell, gpu, planned(args.graph, m, hidden, layers, **job))
            write(args, table, runs, gpu)
    return 0


def device_mb(res: dict, gpu: bool) -> float:
    """The device's peak: the pools' (cuda), or the heap's in fit (the CPU's)."""
    return res["peak_device_bytes"][0] / 2**20 if gpu else res["fit_peak_anon_mb"]


def compared_mb(res: dict, gpu: bool) -> float:
    """What vs_held compares: the pools' peak (cuda), or the heap's growth in fit."""
    return device_mb(res, gpu) - (0.0 if gpu else res["fit_start_anon_mb"])


def rows(model: str, layers: int, cell: dict, gpu: bool, plan) -> list[dict]:
    held = cell["held"]
    epoch_held = float(np.median([r["epoch_time_s"] for r in held]))
    agree = (lambda a, b: np.allclose(a, b, rtol=1e-4)) if gpu else np.array_equal
    out = []
    for v, rs in cell.items():
        same = cell["recompute"] if "recompute" in v else held
        moved = rs[-1]["offloaded_bytes"][0]
        compared = max(compared_mb(r, gpu) for r in rs)
        epoch = float(np.median([r["epoch_time_s"] for r in rs]))
        out.append({
            "model": model,
            "layers": layers,
            "variant": v,
            "device_peak_mb": max(device_mb(r, gpu) for r in rs),
            "growth_mb": None if gpu else compared,
            "vs_held": compared / max(compared_mb(r, gpu) for r in held),
            "planned_mb": plan(VARIANTS[v]) / 2**20,
            "host_peak_mb": None if gpu else max(r["fit_peak_shmem_mb"] for r in rs),
            "offloaded_mb": None if moved is None else moved / 2**20,
            "epoch_ms": epoch * 1e3,
            "epoch_vs_held": epoch / epoch_held,
            "same_losses": all(agree(r["losses"], same[0]["losses"]) for r in rs),
        })  # fmt: skip
    return out


def write(args, table: list[dict], runs: dict, gpu: bool) -> None:
    out_dir, extra = RESULTS, {}
    if gpu:
        from gpu.common_gpu import GPU_RESULTS, device

        out_dir, extra = GPU_RESULTS, {"device": device()["device"]}
    name = f"{args.name}_gpu" if gpu else args.name
    write_results(
        name,
        {"args": vars(args), "runs": runs},
        table,
        [
            "model",
            "layers",
            "variant",
            "device_peak_mb",
            "growth_mb",
            "vs_held",
            "planned_mb",
            "host_peak_mb",
            "offloaded_mb",
            "epoch_ms",
            "epoch_vs_held",
            "same_losses",
        ],  # fmt: skip
        notes=(
            f"`{args.graph}`, one rank, {args.dtype}, output rows {args.output_rows}, "
            f"hidden {args.hidden} (GAT: 8 heads x 8), "
            f"{args.epochs} epochs a run, {args.repeat} runs of each variant in turn. "
            + (
                "`device_peak_mb`: the run's peak of the device's pools (torch, CuPy); "
                "`vs_held`: over the held run's. "
                if gpu
                else "`device_peak_mb`: the simulated device's peak in fit (RssAnon); "
                "`growth_mb`: that peak over what the process held as fit began, the "
                "activations' share; `vs_held`: growth over the held run's; "
                "`host_peak_mb`: the host copies' peak (RssShmem). "
            )
            + "`planned_mb`: the plan's device activations (and attention) for the job; "
            "`offloaded_mb`: what a step moved (mgg's `offloaded_bytes`); `same_losses`: "
            "those of the run without --offload (held, or recompute)"
            + (
                ", to 1e-4."
                if gpu
                else ", bit for bit. On the CPU the copies are host to "
                "host: the epoch column is the mechanism's cost with no link to hide."
            )
        ),  # fmt: skip
        extra_meta=extra,
        out_dir=out_dir,
    )
    pairs = [(r, s) for r in table if r["variant"] == "held"
             for s in table if s["variant"] == "offload" and s["model"] == r["model"]
             and s["layers"] == r["layers"]]  # fmt: skip
    key = "device_peak_mb" if gpu else "growth_mb"
    paired_bars(
        out_dir / f"{name}.png",
        [f"{r['model']} x{r['layers']}" for r, _ in pairs],
        [
            (
                ("device peak" if gpu else "device growth in fit") + " (MB)",
                {"held": [r[key] for r, _ in pairs], "offload": [s[key] for _, s in pairs]},
            ),
            (
                "planned device activations (MB)",
                {
                    "held": [r["planned_mb"] for r, _ in pairs],
                    "offload": [s["planned_mb"] for _, s in pairs],
                },
            ),
            (
                "epoch (ms)",
                {
                    "held": [r["epoch_ms"] for r, _ in pairs],
                    "offload": [s["epoch_ms"] for _, s in pairs],
                },
            ),
        ],  # fmt: skip
        {"held": "activations on the device", "offload": "--offload"},
        f"activations kept in host memory: {args.graph}, one rank ({args.backend})",
    )


if __name__ == "__main__":
    raise SystemExit(main())
