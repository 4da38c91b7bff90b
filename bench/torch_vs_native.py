"""The PyTorch front-end's training epoch vs the hand-written numpy layers it replaces.

    python bench/torch_vs_native.py [--graphs A,B] [--scale 0.13] [--epochs 15]

Same graph, plan, features, model shape and threads, one process, steps timed
round-robin (medians): the native stack (mgg.nn: explicit backward, own Adam, fused
softmax cross-entropy) against mgg.torch (autograd over the same aggregation kernels,
torch.optim.Adam, torch's cross-entropy). GCN 2 x 16 and GIN 5 x 64 without batch norm
(the native GIN has none). Goal before the native stack is retired: torch <= 1.15x.
"""

from __future__ import annotations

import argparse

import numba
import torch
import torch.nn.functional as F

import mgg.torch as mt
from mgg.graph.formats import read_npz
from mgg.graph.specs import resolve
from mgg.nn import softmax_cross_entropy
from mgg.train import build_model, build_optimizer, prepare

from common import compare, complete, real_graphs, write_results


def native_step(dg, data, name):
    model = build_model(name, data)
    opt = build_optimizer("adam", model, 0.01, 5e-4)
    epoch = [0]

    def step():
        model.train()
        model.set_epoch(epoch[0])
        model.zero_grad()
        logits = model.forward(data.x, dg)
        _, dlogits, _, _ = softmax_cross_entropy(logits, data.y, data.train_mask)
        model.backward(dlogits)
        opt.step()
        epoch[0] += 1

    return step


def torch_step(dg, data, name):
    kw = {"batch_norm": False, "layers": 5} if name == "gin" else {}
    model = mt.build_model(name, data.num_features, data.num_classes, **kw)
    opt = torch.optim.Adam(model.param_groups(5e-4), lr=0.01)
    x = mt.as_features(data.x)
    y, mask = torch.from_numpy(data.y), torch.from_numpy(data.train_mask)
    count = float(mask.sum())
    epoch = [0]

    def step():
        model.train()
        dg.begin_step(epoch[0])
        opt.zero_grad()
        logits = model(x, dg)
        loss = F.cross_entropy(logits[mask], y[mask], reduction="sum") / count
        loss.backward()
        opt.step()
        epoch[0] += 1

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", help="graphs of ../shared/data (default: all)")
    ap.add_argument("--scale", type=float, default=0.13, help="products stand-in (8M edges)")
    ap.add_argument("--epochs", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(numba.get_num_threads())
    names = tuple(args.graphs.split(",")) if args.graphs else None
    datasets = [complete(read_npz(p)) for p in (real_graphs(names) if names else real_graphs())]
    if args.scale:
        datasets.append(complete(resolve("products", scale=args.scale)))
    rows = []
    for ds in datasets:
        for name in ("gcn", "gin"):
            dg, data = prepare(ds, None, name)
            t = compare(
                {"native": native_step(dg, data, name), "torch": torch_step(dg, data, name)},
                repeat=args.epochs,
                warmup=2,
            )
            row = {
                "graph": ds.name,
                "edges": ds.graph.num_edges,
                "model": name,
                "native_ms": t["native"] * 1e3,
                "torch_ms": t["torch"] * 1e3,
                "torch_vs_native": t["torch"] / t["native"],
            }
            row["goal_met"] = row["torch_vs_native"] <= 1.15
            rows.append(row)
            print(
                f"{ds.name:>18} {name}: native {row['native_ms']:8.2f} ms  torch "
                f"{row['torch_ms']:8.2f} ms  ({row['torch_vs_native']:.2f}x)",
                flush=True,
            )
    worst = max(r["torch_vs_native"] for r in rows)
    write_results(
        "torch_vs_native",
        {"worst": worst, "threads": numba.get_num_threads()},
        rows,
        ["graph", "edges", "model", "native_ms", "torch_ms", "torch_vs_native", "goal_met"],
        notes=(
            f"Median training step, P = 1, {numba.get_num_threads()} threads, round-robin in one "
            "process. GCN 2 x 16; GIN 5 x 64 without batch norm (as the native one). "
            f"Worst torch / native: {worst:.2f}x (goal <= 1.15x)."
        ),
    )


if __name__ == "__main__":
    main()
