"""Full-graph training epoch: mgg vs PyG, each in its own process, and mgg at P = 1 vs P = 2.

    python bench/train_vs_pyg.py [--models gcn,sage,gin,gat] [--graphs A,B] [--scale 0.13]
                                 [--epochs 20]

Same graph, features, labels and model (mgg's defaults; bench/pyg_models.py), same
thread count (all cores). Each side runs in a process of its own, with its own best
settings: mgg as `mggrun -np P mgg train` (the median epoch it reports), PyG as a worker
process of this script on each graph form its layers take, the fastest reported as its
best (pyg_models.PATHS: edge_index; the transposed sparse adjacency with GCN's
normalization cached; GAT's self loops added once), dense features where they fit, the
median of its training steps after two warm-up steps. The worker imports mgg (to read
the dataset) before torch, so PyG runs with mgg's process settings too: one OpenMP
runtime for torch and numba, and glibc keeping freed memory (docs/training.md; PyG's
amazon_computers step 251 -> 218 ms with it). Graphs without features or labels get
seeded random ones. Goal: mgg >= 10x PyG's best GCN epoch at P = 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from mgg.graph.formats import read_npz, write_npz
from mgg.graph.specs import resolve

from common import RESULTS, complete, mgg_json, real_graphs, write_results

MODELS = ("gcn", "sage", "gin", "gat")


def pyg_worker(path: str, name: str, epochs: int) -> None:
    """Time PyG's training step on the dataset at ``path`` on each graph form of
    ``name`` (pyg_models.PATHS); print {"step_s": {form: median}, ...}."""
    import scipy.sparse as sp
    import torch
    from pyg_models import PATHS, pyg_graph, pyg_model, pyg_optimizer

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    ds = complete(read_npz(path))
    x = ds.x
    if sp.issparse(x):
        x = x.toarray() if x.shape[0] * x.shape[1] < 2e8 else x
    x = torch.from_numpy(np.asarray(x, np.float32)) if not sp.issparse(x) else _csr(x)
    y, train = torch.from_numpy(ds.y), torch.from_numpy(ds.train_mask)
    step_s = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for form in PATHS[name]:
            adj = pyg_graph(ds.graph, form)
            model = pyg_model(name, x.shape[1], ds.num_classes, form)
            opt = pyg_optimizer(name, model)
            times = []
            for _ in range(epochs + 2):
                t0 = time.perf_counter()
                model.train()
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x, adj)[train], y[train])
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t0)
            step_s[form] = float(np.median(times[2:]))
    gomp = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
    print(
        json.dumps(
            {
                "step_s": step_s,
                "threads": torch.get_num_threads(),
                "openmp_runtimes": len(gomp),
            }
        )
    )


def _csr(m):
    import torch

    return torch.sparse_csr_tensor(
        torch.from_numpy(m.indptr.astype(np.int64)),
        torch.from_numpy(m.indices.astype(np.int64)),
        torch.from_numpy(m.data.astype(np.float32)),
        size=m.shape,
    )


def pyg_job(path: Path, name: str, epochs: int) -> dict:
    r = subprocess.run(
        [sys.executable, __file__, "--pyg-worker", str(path), name, str(epochs)],
        capture_output=True,
        text=True,
        timeout=7200,
    )
    if r.returncode:
        raise RuntimeError(f"the PyG worker failed on {path.name} {name}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def mgg_job(nprocs: int, path: Path, name: str, epochs: int) -> dict:
    return mgg_json(
        nprocs, "train", "--dataset", path, "--model", name, "--epochs", epochs, "--eval-every", 0
    )


def measure(ds, models, epochs, tmp: Path, rows):
    path = tmp / f"{ds.name}.npz"
    write_npz(ds, path)
    for name in models:
        peer = pyg_job(path, name, epochs)
        best = min(peer["step_s"], key=peer["step_s"].get)
        p1 = mgg_job(1, path, name, epochs)
        p2 = mgg_job(2, path, name, epochs)
        row = {
            "graph": ds.name,
            "nodes": ds.graph.num_nodes,
            "edges": ds.graph.num_edges,
            "features": int(ds.x.shape[1]),
            "model": name,
            "mgg_ms": p1["epoch_time_s"] * 1e3,
            "pyg_ms": peer["step_s"]["edge_index"] * 1e3,
            "pyg_best_ms": peer["step_s"][best] * 1e3,
            "pyg_best_path": best,
            "p2_ms": p2["epoch_time_s"] * 1e3,
            "mgg_test_acc": p1["test_acc"],
            "pyg_openmp_runtimes": peer["openmp_runtimes"],
        }
        row["vs_pyg"] = row["pyg_ms"] / row["mgg_ms"]
        row["vs_pyg_best"] = row["pyg_best_ms"] / row["mgg_ms"]
        row["p2_vs_p1"] = row["mgg_ms"] / row["p2_ms"]
        rows.append(row)
        print(
            f"{ds.name:>18} {name}: mgg {row['mgg_ms']:8.2f} ms  PyG {row['pyg_ms']:8.2f} ms"
            f" (best {row['pyg_best_ms']:.2f}, {best})  -> {row['vs_pyg_best']:.1f}x its best"
            f"  |  P=2 {row['p2_ms']:.1f} ms ({row['p2_vs_p1']:.2f}x)",
            flush=True,
        )


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.5), 4))
    xs = np.arange(len(rows))
    colors = {"gcn": "C0", "sage": "C1", "gin": "C2", "gat": "C3"}
    ax.bar(xs, [r["vs_pyg_best"] for r in rows], color=[colors[r["model"]] for r in rows])
    ax.axhline(10, color="k", ls="--", lw=1, label="goal 10x (GCN)")
    ax.axhline(1, color="grey", lw=0.5)
    ax.set_yscale("log")
    ax.set_xticks(
        xs, [f"{r['graph']} {r['model']}" for r in rows], fontsize=7, rotation=50, ha="right"
    )
    ax.set_ylabel("PyG's best epoch / mgg epoch (P = 1)")
    ax.set_title("Full-graph training epoch on the CPU, each in its own process")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--scale", type=float, default=0.13, help="products stand-in (8M edges)")
    ap.add_argument(
        "--graphs", help="only these graphs of ../shared/data (and products: the stand-in)"
    )
    ap.add_argument("--pyg-worker", nargs=3, metavar=("PATH", "MODEL", "EPOCHS"))
    args = ap.parse_args()
    if args.pyg_worker:
        path, name, epochs = args.pyg_worker
        return pyg_worker(path, name, int(epochs))
    names = args.graphs.split(",") if args.graphs else None
    products = names is None or "products" in names  # the stand-in
    paths = real_graphs(tuple(n for n in names if n != "products")) if names else real_graphs()
    datasets = [complete(read_npz(p)) for p in paths]
    if products:
        datasets.append(complete(resolve(f"products:scale={args.scale}")))
    stem = "train_vs_pyg"
    if names:
        stem += "-" + "-".join([p.stem for p in paths] + ["products"] * products)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ds in datasets:
            measure(ds, args.models.split(","), args.epochs, Path(tmp), rows)
    plot(rows, RESULTS / f"{stem}.png")
    gcn = [r["vs_pyg_best"] for r in rows if r["model"] == "gcn"]
    write_results(
        stem,
        {"cores": len(os.sched_getaffinity(0)), "gcn_min_vs_pyg_best": min(gcn) if gcn else None},
        rows,
        ["graph", "nodes", "edges", "features", "model", "mgg_ms", "pyg_ms", "vs_pyg"]
        + ["pyg_best_ms", "pyg_best_path", "vs_pyg_best"]
        + ["p2_ms", "p2_vs_p1", "mgg_test_acc", "pyg_openmp_runtimes"],
        notes="mgg_ms: median epoch of `mggrun -np 1 mgg train` (p2_ms: -np 2); pyg_ms: "
        "median training step of the same model in PyG on edge_index, in a process of its "
        "own; pyg_best_ms: the fastest of PyG's graph forms (pyg_best_path: edge_index, "
        "csr: the transposed sparse adjacency, loops: GAT's self loops added once); all on "
        "every core. Graphs without features or labels get seeded random ones.",
    )


if __name__ == "__main__":
    main()
