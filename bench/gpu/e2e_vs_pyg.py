"""End to end on one GPU: the training step of mgg's registered models (GCN, SAGE, GIN,
GAT with their defaults) against PyG at its best (bench/pyg_models.py).

    python bench/gpu/e2e_vs_pyg.py [--scale 0.25] [--epochs 20] [--graphs A,B] [--models M,N]

Same stand-in graph, features, labels and model; Adam; one training step (forward,
backward, optimizer) timed with CUDA events, every side round-robin, medians. PyG runs on
each graph form its layers take (pyg_models.PATHS: edge_index as its examples pass it;
the transposed sparse adjacency for GCN, SAGE and GIN, one cuSPARSE product per layer
and GCN's normalization cached; GAT's self loops added once) and the fastest is its
best. mgg runs twice: in its own order (aggregating at the narrower width) and in PyG's
(mgg.torch.pyg_widths), so same_widths_vs_pyg_best compares kernels at equal widths and
vs_pyg_best adds the algebra. mgg_graph: mgg's step captured as a CUDA graph and
replayed (`mgg train --cuda-graph`). host_ms: per step, the wall time the GPU had no
kernel, copy or memset of the step to run (torch.profiler's device activity over a few
steps): the host floor. Goals: >= 2x PyG's best on every pair; host_ms < 1.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import numpy as np
from common_gpu import PAPER_GRAPHS, Results, cuda_compare, grouped_bars, raw_log, standin_graph
from pyg_models import PATHS, pyg_graph, pyg_model, pyg_optimizer

import mgg.torch as mt
from mgg.train import prepare

from common import default_trainer  # as pyg_models: bench/, put on the path by common_gpu


def pyg_steps(name, ds) -> dict:
    """{'pyg_<path>': builder} for each graph form of ``name``; a builder returns the
    training step (the inputs are shared, each form has its own model)."""
    import torch

    x = torch.from_numpy(np.asarray(ds.x)).cuda()
    y = torch.from_numpy(ds.y).cuda()
    train = torch.from_numpy(ds.train_mask).cuda()

    def build(path):
        adj = pyg_graph(ds.graph, path, "cuda")
        model = pyg_model(name, x.shape[1], ds.num_classes, path).cuda()
        opt = pyg_optimizer(name, model)

        def step():
            model.train()
            opt.zero_grad()
            out = model(x, adj)
            torch.nn.functional.cross_entropy(out[train], y[train]).backward()
            opt.step()

        return step

    return {f"pyg_{p}": (lambda p=p: build(p)) for p in PATHS[name]}


def busy_seconds(intervals) -> float:
    """Seconds covered by the union of (start, end) intervals."""
    total, reach = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def host_ms(step, steps: int = 5) -> float | None:
    """Per step, the milliseconds of wall time the GPU had nothing of the step's to run:
    wall time of ``steps`` steps minus the union of their device activity (kernels,
    copies, memsets, as CUPTI records them through torch.profiler). None if the profiler
    recorded no device activity."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = [
        (e.time_range.start / 1e6, e.time_range.end / 1e6)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]
    if not spans:
        return None
    return max(wall - busy_seconds(spans), 0.0) / steps * 1e3


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: r["graph"],
        lambda r: {r["model"]: r["vs_pyg_best"]},
        "Training step on one GPU: mgg's speedup over PyG at its best",
        "PyG's best time / mgg time",
        goal=2.0,
    )


COLUMNS = [
    "graph",
    "scale",
    "nodes",
    "edges",
    "model",
    "mgg_ms",
    "mgg_same_widths_ms",
    "mgg_graph_ms",
    "pyg_ms",
    "pyg_best_ms",
    "pyg_best_path",
    "vs_pyg",
    "vs_pyg_best",
    "same_widths_vs_pyg_best",
    "graph_vs_pyg_best",
    "host_ms",
    "graph_host_ms",
    "pyg_host_ms",
    "skipped",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--graphs", default=",".join(PAPER_GRAPHS))
    ap.add_argument("--models", default=",".join(mt.MODELS))
    args = ap.parse_args()
    res = Results(
        "e2e_vs_pyg",
        {"scale": args.scale, "pyg_paths": PATHS},
        COLUMNS,
        notes="One GPU, P = 1. Training step: forward, backward, Adam. pyg_ms: PyG on "
        "edge_index as its examples run it; pyg_best_ms: the fastest graph form "
        "(pyg_best_path); pyg_<form>_ms in the JSON. mgg_same_widths_ms: mgg aggregating "
        "at PyG's widths (GAT: the same order, not timed twice). mgg_graph_ms: mgg's step "
        "captured as a CUDA graph and replayed (--cuda-graph). host_ms: per step, wall "
        "time with no device activity of the step (the host floor; the profiler's own "
        "overhead included).",
        plot=plot,
    )
    with raw_log("e2e_vs_pyg"):
        for gname in args.graphs.split(","):
            ds = standin_graph(gname, args.scale, features=True)  # with a split
            for model in args.models.split(","):
                dg, data = prepare(ds, None, model, backend="cuda")
                t = default_trainer(dg, data, model)
                row = {
                    "graph": gname,
                    "scale": args.scale,
                    "nodes": ds.graph.num_nodes,
                    "edges": ds.graph.num_edges,
                    "model": model,
                    **measure(t, model, ds, args.epochs),
                }
                res.add(row)
                print(f"{gname} {model}: {row}", flush=True)
                del t
                dg.free()
                while JOBS:
                    JOBS.pop().free()
                free_gpu()
        code = res.finish()
    for line in FAILED:  # measured what it could; the run still fails
        print(f"FAILED {line}", file=sys.stderr)
    return code or (1 if FAILED else 0)


def measure(trainer, model, ds, epochs) -> dict:
    """One row's times: every side that fits in GPU memory, round-robin."""
    builders = {"mgg": lambda: trainer.train_step, "mgg_graph": captured(model, ds)}
    if model != "gat":  # GAT aggregates at the same width in both orders

        def same_widths():
            def step():
                with mt.pyg_widths():
                    trainer.train_step()

            return step

        builders["mgg_same_widths"] = same_widths
    builders.update(pyg_steps(model, ds))
    fns, skipped = build_sides(builders)
    try:
        t = cuda_compare(fns, repeat=epochs)
    except oom():  # the sides fit alone but not together
        return {"skipped": f"{', '.join(fns)} ran out of GPU memory together"}
    ms = {k: v * 1e3 for k, v in t.items()}
    pyg = {k[4:]: v for k, v in ms.items() if k.startswith("pyg_")}
    best = min(pyg, key=pyg.get) if pyg else None
    row = {
        "mgg_ms": ms.get("mgg"),
        "mgg_same_widths_ms": ms.get("mgg_same_widths", ms.get("mgg") if model == "gat" else None),
        "mgg_graph_ms": ms.get("mgg_graph"),
        "pyg_ms": pyg.get("edge_index"),
        "pyg_best_ms": pyg.get(best),
        "pyg_best_path": best,
        **{f"pyg_{k}_ms": v for k, v in pyg.items()},
        "skipped": "; ".join(f"{k}: {v}" for k, v in skipped.items()),
    }
    for key, num, den in (
        ("vs_pyg", "pyg_ms", "mgg_ms"),
        ("vs_pyg_best", "pyg_best_ms", "mgg_ms"),
        ("same_widths_vs_pyg_best", "pyg_best_ms", "mgg_same_widths_ms"),
        ("graph_vs_pyg_best", "pyg_best_ms", "mgg_graph_ms"),
    ):
        row[key] = row[num] / row[den] if row[num] and row[den] else None
    if "mgg" in fns:
        row["host_ms"] = host_ms(fns["mgg"])
    if "mgg_graph" in fns:
        row["graph_host_ms"] = host_ms(fns["mgg_graph"])
    if best is not None:
        row["pyg_host_ms"] = host_ms(fns[f"pyg_{best}"])
    return row


def captured(model, ds):
    """The builder of the mgg_graph side: its own job and trainer with cuda_graph, past
    its eager warm-up steps and its capture, so that each timed step is one replay."""
    from mgg.torch.graphs import WARMUP

    def build():
        dg, data = prepare(ds, None, model, backend="cuda")
        t = default_trainer(dg, data, model, cuda_graph=True)
        for _ in range(WARMUP + 1):
            t.train_step()
        step = t.train_step
        JOBS.append(dg)  # freed with the row's other sides
        return step

    return build


JOBS: list = []  # the graph sides' jobs of the row being measured
FAILED: list = []  # "side: failed: why" of every side that failed in this run


def build_sides(builders: dict) -> tuple[dict, dict]:
    """({side: step} for the sides that built and ran one step, {side: why not}). A side
    that fails otherwise than for memory is recorded as failed (its traceback printed,
    and in FAILED) and the others still run: one broken side costs its own cell only."""
    fns, skipped = {}, {}
    for name, build in builders.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn = build()
                fn()
            fns[name] = fn
        except oom():
            skipped[name] = "ran out of GPU memory"
        except Exception as e:
            traceback.print_exc()
            skipped[name] = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            FAILED.append(f"{name}: {skipped[name]}")
        if name in skipped:  # outside the handler: its traceback holds the side's tensors
            free_gpu()
    return fns, skipped


def oom() -> tuple:
    """The exceptions of a full GPU: torch's and CuPy's (a MemoryError)."""
    import torch

    return (torch.OutOfMemoryError, MemoryError)


def free_gpu():
    import cupy
    import torch

    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
