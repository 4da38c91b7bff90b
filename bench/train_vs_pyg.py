"""Full-graph training epoch: mgg vs PyG on the CPU, and mgg at P = 1 vs P = 2.

    python bench/train_vs_pyg.py [--models gcn,gin] [--real | --graphs A,B] [--epochs 20]

Same graph, same features and labels, same model (GCN 2x16 / GIN 5x64, dropout 0.5,
Adam), same thread count. mgg's and PyG's training steps are timed round-robin in one
process (medians). PyG's GCNConv runs with cached=True (its faster setting). P = 1 and
P = 2 run as `mggrun -np P mgg train` jobs on the same dataset file (median epoch time).
Goals: mgg >= 10x PyG's GCN epoch at P = 1; P = 2 no slower than P = 1 on 2 cores.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numba
import numpy as np
import scipy.sparse as sp

from mgg.graph.dataset import Dataset
from mgg.graph.formats import read_npz, write_npz
from mgg.graph.specs import resolve
from mgg.train import Trainer, build_model, build_optimizer, prepare

from common import RESULTS, compare, complete, mgg_json, real_graphs, write_results


def pyg_model(name, f, c):
    import torch
    from torch_geometric.nn import GCNConv, GINConv

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            if name == "gcn":
                self.convs = torch.nn.ModuleList(
                    [GCNConv(f, 16, cached=True), GCNConv(16, c, cached=True)]
                )
            else:
                dims = [f] + [64] * 4 + [c]
                self.convs = torch.nn.ModuleList(
                    [
                        GINConv(
                            torch.nn.Sequential(
                                torch.nn.Linear(dims[i], 64),
                                torch.nn.ReLU(),
                                torch.nn.Linear(64, dims[i + 1]),
                            )
                        )
                        for i in range(5)
                    ]
                )

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                if name == "gcn" or i > 0:
                    x = torch.nn.functional.dropout(x, 0.5, self.training)
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = torch.relu(x)
            return x

    return Net()


def pyg_step_fn(name, ds: Dataset, data_x):
    import torch

    src, dst = ds.graph.edges()
    edge_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64))
    if sp.issparse(data_x):
        x = torch.sparse_csr_tensor(
            torch.from_numpy(data_x.indptr.astype(np.int64)),
            torch.from_numpy(data_x.indices.astype(np.int64)),
            torch.from_numpy(data_x.data),
            size=data_x.shape,
        )
        x = x.to_dense() if data_x.shape[0] * data_x.shape[1] < 2e8 else x
    else:
        x = torch.from_numpy(np.asarray(data_x))
    y = torch.from_numpy(ds.y)
    train = torch.from_numpy(ds.train_mask)
    model = pyg_model(name, x.shape[1], ds.num_classes)
    first = list(model.convs[0].parameters())
    rest = [p for c in model.convs[1:] for p in c.parameters()]
    opt = torch.optim.Adam(
        [{"params": first, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}], lr=0.01
    )

    def step():
        model.train()
        opt.zero_grad()
        out = model(x, edge_index)
        loss = torch.nn.functional.cross_entropy(out[train], y[train])
        loss.backward()
        opt.step()

    return step


def mgg_job(nprocs, path, model, epochs):
    return mgg_json(
        nprocs, "train", "--dataset", path, "--model", model, "--epochs", epochs, "--eval-every", 0
    )


def measure(ds: Dataset, models, epochs, tmp: Path, rows):
    import torch

    path = tmp / f"{ds.name}.npz"
    write_npz(ds, path)
    for name in models:
        dg, data = prepare(ds, None, name)
        model = build_model(name, data)
        wd = 5e-4 if name == "gcn" else 0.0
        trainer = Trainer(dg, data, model, build_optimizer("adam", model, 0.01, wd), eval_every=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pyg = pyg_step_fn(name, ds, data.x)
        t = compare({"mgg": trainer.train_step, "pyg": pyg}, repeat=epochs, warmup=2)
        p1 = [mgg_job(1, path, name, epochs)["epoch_time_s"] for _ in range(2)]
        p2 = [mgg_job(2, path, name, epochs)["epoch_time_s"] for _ in range(2)]
        row = {
            "graph": ds.name,
            "nodes": ds.graph.num_nodes,
            "edges": ds.graph.num_edges,
            "features": int(data.x.shape[1]),
            "model": name,
            "mgg_ms": t["mgg"] * 1e3,
            "pyg_ms": t["pyg"] * 1e3,
            "vs_pyg": t["pyg"] / t["mgg"],
            "p1_ms": float(np.median(p1)) * 1e3,
            "p2_ms": float(np.median(p2)) * 1e3,
        }
        row["p2_vs_p1"] = row["p1_ms"] / row["p2_ms"]
        rows.append(row)
        print(
            f"{ds.name:>18} {name}: mgg {row['mgg_ms']:8.2f} ms  PyG {row['pyg_ms']:8.2f} ms"
            f"  -> {row['vs_pyg']:.1f}x  |  P=1 {row['p1_ms']:.1f} ms  P=2 "
            f"{row['p2_ms']:.1f} ms ({row['p2_vs_p1']:.2f}x)",
            flush=True,
        )
        torch.set_num_threads(numba.get_num_threads())


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.8), 4))
    xs = np.arange(len(rows))
    ax.bar(xs, [r["vs_pyg"] for r in rows])
    ax.axhline(10, color="k", ls="--", lw=1, label="goal 10x (GCN)")
    ax.set_yscale("log")
    ax.set_xticks(
        xs, [f"{r['graph']} {r['model']}" for r in rows], fontsize=7, rotation=40, ha="right"
    )
    ax.set_ylabel("PyG epoch / mgg epoch (P = 1)")
    ax.set_title(f"Full-graph training epoch on the CPU, {numba.get_num_threads()} threads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gcn,gin")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument(
        "--scale", type=float, default=0.13, help="products stand-in scale (0.13: about 8M edges)"
    )
    ap.add_argument("--real", action="store_true", help="also the graphs of ../shared/data")
    ap.add_argument(
        "--graphs", help="only these graphs of ../shared/data (results: train_vs_pyg-A-B)"
    )
    args = ap.parse_args()
    torch.set_num_threads(numba.get_num_threads())
    stem = "train_vs_pyg"
    if args.graphs:
        paths = real_graphs(tuple(args.graphs.split(",")))
        datasets = [complete(read_npz(p)) for p in paths]
        stem += "-" + "-".join(p.stem for p in paths)
    else:
        datasets = [complete(resolve(f"products:scale={args.scale}"))]
    if args.real and not args.graphs:
        datasets += [complete(read_npz(p)) for p in real_graphs()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ds in datasets:
            measure(ds, args.models.split(","), args.epochs, Path(tmp), rows)
    plot(rows, RESULTS / f"{stem}.png")
    write_results(
        stem,
        {"threads": numba.get_num_threads()},
        rows,
        [
            "graph",
            "nodes",
            "edges",
            "features",
            "model",
            "mgg_ms",
            "pyg_ms",
            "vs_pyg",
            "p1_ms",
            "p2_ms",
            "p2_vs_p1",
        ],
        notes="mgg_ms / pyg_ms: median training step (forward, backward, Adam) "
        "timed round-robin in one process, same threads. p1_ms / p2_ms: "
        "median epoch of `mggrun -np P mgg train` (two jobs each). "
        "Graphs without features or labels get seeded random ones.",
    )


if __name__ == "__main__":
    main()
