"""``mgg tune``: MGG's search over (ps, dist, wpb or threads) on one graph and width,
each configuration measured with the check harness's protocol (mgg.designs.check)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from ..backend import assign, get_backend
from ..designs import knobs_for
from ..designs.check import median_seconds, sharded_plan
from ..graph.dataset import Dataset, random_features
from ..graph.formats import atomic_write
from ..partition import build_plan
from ..partition.shards import ShardedDataset
from .model import Workload, default_space, rank_configs
from .search import exhaustive, model_guess, search


def tune(
    dataset: Dataset,
    backend,
    comm,
    *,
    dim: int = 16,
    op: str = "gcn",
    start: str = "origin",
    budget: int | None = None,
    repeat: int = 3,
    full_grid: bool = False,
    confirm: int = 3,
    seed: int = 0,
) -> dict:
    """Search the default space of this backend's device; collective.

    start 'origin' (the paper's (1, 1, 1)) or 'model' (the model's best guess);
    full_grid also measures every configuration of the space, afresh (not reusing the
    search's measurements), to judge the search; confirm rounds re-measure the start,
    the default, the tuned (and the grid's best) configurations round-robin, since the
    minimum of many noisy measurements is biased low.

    returns the search's JSON (best, trace, ...) plus space, default, confirmed
    latencies, and with full_grid "exhaustive_best", "exhaustive_best_latency_s",
    "exhaustive_measured"; the measured table (config tuple -> seconds) under "table"
    """
    import numba

    backend = get_backend(backend)
    if isinstance(dataset, ShardedDataset):
        base = sharded_plan(dataset, comm, op == "gcn").with_ps(16)
    else:
        g = dataset.graph.gcn_norm() if op == "gcn" else dataset.graph
        base = build_plan(g, comm.size, 16, rank=comm.rank, transposed=False)
    x = random_features(seed, base.lb, base.ub, dim)
    dev = backend.device()
    space = default_space(dev)
    cls = backend.design("pipelined")

    def measure(cfg):
        if "threads" in cfg:
            numba.set_num_threads(cfg["threads"])
        with cls(base.with_ps(cfg["ps"]), comm, dim, **knobs_for(cls, cfg)) as agg:
            assign(agg.x, x)
            # every rank must see the same number, or the ranks would walk apart
            return median_seconds(lambda: agg(op), comm, repeat, backend.sync)

    ranked = rank_configs(space, Workload.of(base, dim), dev, "p2p" if backend.gpu else "get")
    t0 = time.perf_counter()
    res = search(
        space,
        measure,
        start=model_guess(ranked) if start == "model" else None,
        max_measurements=budget,
    )
    third = list(space)[2]
    default = {"ps": 16, "dist": 4, third: 4 if backend.gpu else max(space[third])}
    table = res.table()
    result = {
        "graph": dataset.name,
        "np": comm.size,
        "dim": dim,
        "op": op,
        "backend": backend.name,
        "space": space,
        **res.to_json(),
        "search_seconds": time.perf_counter() - t0,
        "model_guess": model_guess(ranked),
        "default": default,
        "default_latency_s": table.get(tuple(default.values())) or measure(default),
    }
    contenders = {"start": res.start, "default": default, "tuned": res.best}
    if full_grid:
        grid = exhaustive(space, measure)
        table = grid.table()
        result["exhaustive_best"] = grid.best
        result["exhaustive_best_latency_s"] = grid.best_latency
        result["exhaustive_measured"] = grid.measured
        contenders["exhaustive_best"] = grid.best
    again = {k: [] for k in contenders}
    for _ in range(confirm):
        for k, cfg in contenders.items():
            again[k].append(measure(cfg))
    result["confirmed_latency_s"] = {k: float(np.median(v)) for k, v in again.items() if v}
    result["table"] = table
    return result


def write_report(result: dict, out) -> tuple[Path, Path]:
    """The trace JSON and the heatmaps (Fig. 10) of a tune() result in folder ``out``, each
    written atomically."""
    from .plot import heatmaps

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{result['graph']}-P{result['np']}-D{result['dim']}"
    trace = out / f"{stem}-trace.json"
    text = json.dumps({k: v for k, v in result.items() if k != "table"}, indent=1)
    with atomic_write(trace) as tmp:
        Path(tmp).write_text(text)
    png = heatmaps(
        result["space"],
        result["table"],
        result["best"],
        out / f"{stem}.png",
        f"{result['graph']}, P={result['np']}, D={result['dim']}",
    )
    return trace, Path(png)
