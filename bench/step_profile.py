"""Where a training step's time goes, mgg (one rank) against DGL, where mgg's lead over a
peer is short of its goal: the dense matrix products (ATen's mm/addmm/bmm, which both
sides hand to the same BLAS), the other ATen ops, the graph kernels and Python.

    python bench/step_profile.py [--graphs amazon_computers,products] [--scale 0.05]
                                 [--models sage,gat] [--steps 10]

mgg: ATen ops' own time from torch's profiler, numba's kernels from cProfile (another
pass), the rest of the step Python. DGL (bench/peers): ATen ops' own time; the rest of
its step is its C kernels and Python, which its profile does not tell apart. Each side in
its own process; each part per step from profiled steps, the Python (and DGL's
kernels) the unprofiled median step less the parts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from mgg.graph.formats import read_npz, write_npz
from mgg.graph.specs import resolve

from common import RESULTS, SHARED_DATA, complete, csv_list, run_json, write_results


def mgg_worker(path: str, name: str, steps: int) -> None:
    import numpy as np
    import torch
    from step_costs import aten_split, profile_steps, time_steps

    from mgg.comm import get_comm
    from mgg.prepare import prepare

    from common import default_trainer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    dg, data = prepare(read_npz(path), get_comm("mpi"), name)
    t = default_trainer(dg, data, name)
    step = t.train_step
    wall = float(np.median(time_steps(step, steps))) * 1e3
    split = aten_split(step, steps)
    kernels = profile_steps(step, steps)
    t.read_losses()
    # native_ms: numba's kernels and every builtin's time (ATen's too, told apart by split)
    print(json.dumps({"step_ms": wall, **split, "native_ms": kernels["native_ms"]}))


PARTS = {
    "mgg": ("gemm", "other_aten", "kernels", "python"),
    "dgl": ("gemm", "other_aten", "kernels_python"),
}


def plot(rows, path) -> None:
    """Stacked bars: each pair's step, mgg beside DGL, by part."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, 2.2 * len(rows)), 4))
    colors = {"gemm": "C0", "other_aten": "C1", "kernels": "C2", "python": "C3"}
    colors["kernels_python"] = "C4"
    for i, row in enumerate(rows):
        for j, side in enumerate(PARTS):
            bottom = 0.0
            for part in PARTS[side]:
                v = row[f"{side}_{part}_ms"]
                label = part if i == 0 and (j == 0 or part == "kernels_python") else None
                ax.bar(i + 0.4 * j - 0.2, v, 0.38, bottom=bottom, color=colors[part], label=label)
                bottom += v
            ax.text(i + 0.4 * j - 0.2, bottom, side, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [f"{r['graph']} {r['model']}" for r in rows])
    ax.set_ylabel("ms per training step (profiled parts)")
    ax.set_title("Where a step goes: mgg (one rank) beside DGL")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="amazon_computers,products")
    ap.add_argument("--scale", type=float, default=0.05, help="the products stand-in's")
    ap.add_argument("--models", default="sage,gat")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--mgg-worker", nargs=3)
    args = ap.parse_args()
    if args.mgg_worker:
        return mgg_worker(args.mgg_worker[0], args.mgg_worker[1], int(args.mgg_worker[2]))
    from peers.check_dgl import write_peer_file
    from peers.dgl_env import run_worker

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for gname in csv_list(args.graphs):
            spec = f"products:scale={args.scale}" if gname == "products" else None
            ds = complete(resolve(spec) if spec else read_npz(SHARED_DATA / f"{gname}.npz"))
            path, peer = Path(tmp) / f"{gname}.npz", Path(tmp) / f"{gname}-peer.npz"
            write_npz(ds, path)
            write_peer_file(ds, peer)
            for name in csv_list(args.models):
                cmd = [sys.executable, __file__, "--mgg-worker", path, name, args.steps]
                m = run_json(cmd, "mgg's worker")
                d = run_worker("profile", peer, name, args.steps)
                row = {
                    "graph": ds.name,
                    "model": name,
                    "mgg_ms": m["step_ms"],
                    "mgg_gemm_ms": m["gemm_ms"],
                    "mgg_other_aten_ms": m["aten_ms"] - m["gemm_ms"],
                    "mgg_kernels_ms": max(0.0, m["native_ms"] - m["aten_ms"]),
                    "mgg_python_ms": max(0.0, m["step_ms"] - m["native_ms"]),
                    "dgl_ms": d["step_s"] * 1e3,
                    "dgl_gemm_ms": d["gemm_ms"],
                    "dgl_other_aten_ms": d["aten_ms"] - d["gemm_ms"],
                    "dgl_kernels_python_ms": max(0.0, d["step_s"] * 1e3 - d["aten_ms"]),
                }
                row["vs_dgl"] = row["dgl_ms"] / row["mgg_ms"]
                row["vs_dgl_without_gemm"] = (row["dgl_ms"] - row["dgl_gemm_ms"]) / (
                    row["mgg_ms"] - row["mgg_gemm_ms"]
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    cols = list(rows[0])
    plot(rows, RESULTS / "step_profile.png")
    write_results(
        "step_profile",
        {"steps": args.steps},
        rows,
        cols,
        notes="ms per step. gemm: ATen's matrix products' own time (torch's profiler); "
        "other_aten: every other ATen op's; mgg kernels: numba's and other builtins' time "
        "(cProfile) less the ATen ops'; mgg python: the step less all of those; "
        "dgl kernels_python: DGL's step less its ATen ops (its C kernels and "
        "Python). vs_dgl_without_gemm: the two steps' ratio with each side's GEMMs taken "
        "out (what is left to the graph work). mgg_ms and dgl_ms unprofiled medians.",
    )


if __name__ == "__main__":
    main()
