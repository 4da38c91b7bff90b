"""End to end on one GPU: the epoch time of full-graph training of mgg's registered models
(GCN, SAGE, GIN, GAT with their defaults), mgg vs PyG (bench/pyg_models.py).

    python bench/gpu/e2e_vs_pyg.py [--scale 0.25] [--epochs 20]

Same stand-in graph, features, labels and model; Adam; one training step (forward,
backward, optimizer) timed with CUDA events, round-robin, medians. Goal: >= 2x PyG.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np
from common_gpu import PAPER_GRAPHS, Results, cuda_compare, grouped_bars, raw_log, standin_graph
from pyg_models import pyg_model, pyg_optimizer

import mgg.torch as mt
from mgg.train import prepare

from common import default_trainer  # as pyg_models: bench/, put on the path by common_gpu


def pyg_step(name, ds):
    import torch

    src, dst = ds.graph.edges()
    edge_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64)).cuda()
    x = torch.from_numpy(np.asarray(ds.x)).cuda()
    y = torch.from_numpy(ds.y).cuda()
    train = torch.from_numpy(ds.train_mask).cuda()
    model = pyg_model(name, x.shape[1], ds.num_classes).cuda()
    opt = pyg_optimizer(name, model)

    def step():
        model.train()
        opt.zero_grad()
        out = model(x, edge_index)
        torch.nn.functional.cross_entropy(out[train], y[train]).backward()
        opt.step()

    return step


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: r["graph"],
        lambda r: {r["model"]: r["speedup"]},
        "Training step on one GPU: mgg's speedup over PyG",
        "PyG time / mgg time",
        goal=2.0,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    ap.add_argument("--models", default=",".join(mt.MODELS))
    args = ap.parse_args()
    res = Results(
        "e2e_vs_pyg",
        {"scale": args.scale},
        ["graph", "nodes", "edges", "model", "mgg_ms", "pyg_ms", "speedup", "skipped"],
        notes="One GPU, P = 1. Training step: forward, backward, Adam.",
        plot=plot,
    )
    with raw_log("e2e_vs_pyg"):
        for gname in args.graphs.split(","):
            ds = standin_graph(gname, args.scale, features=True)  # with a split
            for model in args.models.split(","):
                dg, data = prepare(ds, None, model, backend="cuda")
                t = default_trainer(dg, data, model)
                times, skipped = timed(t.train_step, model, ds, args.epochs)
                row = {
                    "graph": gname,
                    "nodes": ds.graph.num_nodes,
                    "edges": ds.graph.num_edges,
                    "model": model,
                    "mgg_ms": times["mgg"] * 1e3 if "mgg" in times else None,
                    "pyg_ms": times["pyg"] * 1e3 if "pyg" in times else None,
                    "speedup": times["pyg"] / times["mgg"] if len(times) == 2 else None,
                    "skipped": skipped,
                }
                res.add(row)
                print(f"{gname} {model}: {row}", flush=True)
                del t
                dg.free()
                free_gpu()
        return res.finish()


def free_gpu():
    import cupy
    import torch

    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


def timed(mgg_step, model, ds, epochs) -> tuple[dict, str]:
    """({'mgg': s, 'pyg': s} medians, round-robin; '' or who ran out of GPU memory). A
    side that runs out of memory is dropped and the other timed alone."""
    import cupy
    import torch

    oom = (torch.OutOfMemoryError, cupy.cuda.memory.OutOfMemoryError)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pyg = pyg_step(model, ds)
        return cuda_compare({"mgg": mgg_step, "pyg": pyg}, repeat=epochs), ""
    except oom as e:
        who = "mgg" if isinstance(e, cupy.cuda.memory.OutOfMemoryError) else "PyG"
    pyg = None  # PyG's model and buffers go before mgg is timed alone
    free_gpu()
    if who == "mgg":
        return {}, "mgg ran out of GPU memory"
    try:
        return cuda_compare({"mgg": mgg_step}, repeat=epochs), "PyG ran out of GPU memory"
    except oom:
        return {}, "both ran out of GPU memory"


if __name__ == "__main__":
    sys.exit(main())
