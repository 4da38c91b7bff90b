"""Input features streamed from host memory (issue 59, stage 3): a training epoch with the
features held on the device against the same job under a device budget that makes them
stream in chunks of about rows/k, k = 2, 4, 8; and with its activations kept in host
memory too (`--offload`: held and the smallest chunk, `+offload`).

    python bench/stream.py [--backend cpu|cuda] [--graph SPEC] [--model gcn] [--epochs 10]
                           [--chunks 2,4,8] [--repeat 3] [--dtype float32]

Each variant is a `mgg train --json` process (held: no --device-memory; streamed:
--device-memory set to the plan's device total at that chunk), run round-robin
``--repeat`` times; the epoch is the median of each run's median epoch. Reported: epoch
time over the held one, the chunk, the planned device bytes and (cuda) the measured
peak of the pools, and whether the losses agree with the held run's. On the cpu backend
the device is simulated: the copies into the chunk buffers are pure overhead there (host
to host), so the cpu rows bound the mechanism's cost; the GPU stage measures PCIe.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from mgg.footprint import job_estimate
from mgg.graph.facts import job_facts
from mgg.graph.specs import resolve, spec_facts
from mgg.memory import budget_for, format_bytes
from mgg.torch import MODELS

from common import RESULTS, csv_list, mgg_json, write_results


def budgets(spec: str, model: str, dtype: str, ks: list[int]) -> tuple[int, dict]:
    """(rows of the one rank, {k: the device budget whose plan streams rows/k at a time}:
    the plan fills only its usable part, so the budget is the one whose part holds it)."""
    d = spec_facts(spec) or job_facts(resolve(spec))
    rows = d["n"]
    out = {}
    for k in ks:
        chunk = max(1, math.ceil(rows / k))
        est = job_estimate(d, 1, "train", model=MODELS[model], rows=rows, device=True,
                           stream=chunk, dtype=dtype)  # fmt: skip
        out[k] = budget_for(int(est["total"]))
    return rows, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--graph", default="planted:nodes=200000,classes=8,features=512,degree=16")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--chunks", default="2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--no-offload", dest="offload", action="store_false",
                    help="without the +offload variants")  # fmt: skip
    ap.add_argument("--out", default=None, help="results folder (default bench/results[/gpu])")
    args = ap.parse_args()
    ks = csv_list(args.chunks, cast=int)
    rows, budget = budgets(args.graph, args.model, args.dtype, ks)
    base = ["train", "--dataset", args.graph, "--model", args.model, "--epochs", args.epochs,
            "--eval-every", "0", "--backend", args.backend, "--dtype", args.dtype]  # fmt: skip
    variants = {"held": []} | {f"rows/{k}": ["--device-memory", budget[k]] for k in ks}
    if args.offload:
        k = max(ks)
        variants |= {"held+offload": ["--offload"]}
        variants |= {f"rows/{k}+offload": ["--device-memory", budget[k], "--offload"]}
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    gpu = args.backend == "cuda"
    if args.out:
        out_dir = Path(args.out)
    elif gpu:
        from gpu.common_gpu import GPU_RESULTS as out_dir  # $MGG_GPU_OUT on the GPU machine
    else:
        out_dir = RESULTS
    for rep in range(args.repeat):  # round-robin: every variant sees the same drift
        for name, extra in variants.items():
            res = mgg_json(1, *base, *extra)
            runs[name].append(res)
            print(f"rep {rep + 1} {name}: epoch {res['epoch_time_s'] * 1e3:.1f} ms, "
                  f"stream_rows {res['stream_rows']}", flush=True)  # fmt: skip
        table = summarize(runs, rows)
        write(args, table, runs, out_dir, gpu)
    return 0


def summarize(runs: dict, rows: int) -> list[dict]:
    held = float(np.median([r["epoch_time_s"] for r in runs["held"]]))
    losses = runs["held"][0]["losses"]
    table = []
    for name, rs in runs.items():
        epoch = float(np.median([r["epoch_time_s"] for r in rs]))
        last = rs[-1]
        peak = (last.get("peak_device_bytes") or [None])[0]
        planned = last.get("planned_device_bytes")
        table.append(
            {
                "variant": name,
                "rows": rows,
                "stream_rows": last["stream_rows"],
                "epoch_ms": epoch * 1e3,
                "vs_held": epoch / held,
                "planned_device": format_bytes(planned) if planned else None,
                "peak_device": format_bytes(peak) if peak else None,
                "offloaded": format_bytes(max(last["offloaded_bytes"]))
                if last.get("offloaded_bytes") and last["offloaded_bytes"][0] is not None
                else None,
                "peak_rss_mb": max(last["peak_rss_mb"]),
                "losses_agree": bool(np.allclose(last["losses"], losses, rtol=1e-4)),
                "runs": len(rs),
            }
        )
    return table


def write(args, table, runs, out_dir: Path, gpu: bool) -> None:
    name = "stream_gpu" if gpu else "stream_cpu"
    extra = {}
    if gpu:
        from gpu.common_gpu import device

        extra = {"device": device()["device"]}
    write_results(
        name,
        {"args": vars(args), "runs": runs},
        table,
        [
            "variant",
            "rows",
            "stream_rows",
            "epoch_ms",
            "vs_held",
            "planned_device",
            "peak_device",
            "offloaded",
            "peak_rss_mb",
            "losses_agree",
            "runs",
        ],  # fmt: skip
        notes=(
            f"{args.model.upper()} on `{args.graph}` ({args.backend}, {args.dtype}), "
            f"{args.epochs} epochs a run, median of {len(runs['held'])} runs round-robin. "
            "`vs_held`: the streamed epoch over the held one (> 1: slower). "
            "`offloaded`: the activations a step kept in host memory (`+offload`). "
            + (
                ""
                if gpu
                else "The device is simulated on the CPU: each chunk is copied host to host "
                "into its buffer, so this is the mechanism's cost with no link to hide."
            )
        ),
        extra_meta=extra,
        out_dir=out_dir,
    )
    plot(table, out_dir / f"{name}.png", args)


def plot(table: list[dict], path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [r["variant"] for r in table]
    colors = ["#37a" if "offload" in n else "#888" if n == "held" else "#3a7" for n in names]
    ax.bar(names, [r["epoch_ms"] for r in table], color=colors)
    for i, r in enumerate(table):
        ax.text(i, r["epoch_ms"], f"{r['vs_held']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("epoch (ms, median)")
    ax.set_title(f"features held vs streamed, activations offloaded ({args.backend}, {args.model})")
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
