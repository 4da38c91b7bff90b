"""``mgg tune``: the tuner's search over (ps, dist, wpb or threads) on one graph and
width; each sample one aggregation timed as the check harness times one (mgg.designs.check),
the sampling decided by the tuner's protocol (mgg.tuner.search)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from ..backend import assign, get_backend
from ..designs import knobs_for
from ..designs.check import sharded_plan, time_round_robin
from ..graph.dataset import Dataset, random_features
from ..graph.formats import atomic_write, make_folder
from ..partition import build_plan
from ..partition.shards import ShardedDataset
from .model import Workload, default_space, rank_configs
from .search import (
    Protocol,
    choose_window,
    confirm_medians,
    exhaustive,
    model_guess,
    model_table,
    search,
)


def fresh_sample(build, warm, call, cfg: dict):
    """One sample of configuration ``cfg`` on a design built for it alone: ``build(cfg)``
    (entered if it is a context manager), ``warm(design)`` untimed, then the seconds of
    ``call(design)``. A design's speed varies from one allocation to the next (up to 15%
    between builds on a busy CPU against 2% between calls of one build), so every sample
    is of a new one and the medians average over allocations too."""
    design = build(cfg)
    ctx = hasattr(design, "__enter__")
    if ctx:
        design.__enter__()
    try:
        warm(design)
        return call(design)
    finally:
        if ctx:
            design.__exit__(None, None, None)


def tune(
    dataset: Dataset,
    backend,
    comm,
    *,
    dim: int = 16,
    op: str = "gcn",
    start: str = "model",
    protocol: Protocol | None = None,
    full_grid: bool = False,
    grid_rounds: int = 5,
    confirm: int = 5,
    seed: int = 0,
) -> dict:
    """Search the default space of this backend's device with the tuner's protocol
    (mgg.tuner.search); collective, every rank takes the same decisions.

    start 'model' (the analytical model's guess, its ranking ordering the moves) or
    'origin' (the paper's (1, 1, 1), moves knob by knob); full_grid also measures every
    configuration of the space, ``grid_rounds`` times round-robin, independently of the
    search; ``confirm`` rounds then re-measure the start, the default, the model's guess,
    the tuned (and the grid's best) configurations round-robin, and the ratios use those.

    returns the search's JSON (best, trace, samples, noise, confidence, ...) plus space,
    default, model_guess, confirmed latencies, and with full_grid "exhaustive_best",
    "exhaustive_best_latency_s", "exhaustive_measured", "vs_exhaustive" (confirmed tuned
    / confirmed grid best) and "model_guess_vs_exhaustive"; the measured medians (config
    tuple -> seconds) under "table"
    """
    import numba

    backend = get_backend(backend)
    protocol = protocol or Protocol()
    if isinstance(dataset, ShardedDataset):
        base = sharded_plan(dataset, comm, op == "gcn").with_ps(16)
    else:
        g = dataset.graph.gcn_norm() if op == "gcn" else dataset.graph
        base = build_plan(g, comm.size, 16, rank=comm.rank, transposed=False)
    x = random_features(seed, base.lb, base.ub, dim)
    dev = backend.device()
    space = default_space(dev)
    cls = backend.design("pipelined")

    def build(cfg):
        return cls(base.with_ps(cfg["ps"]), comm, dim, **knobs_for(cls, cfg))

    def warm(agg):
        assign(agg.x, x)
        agg(op)

    def timed(agg):  # the slowest rank's seconds: every rank sees the same number
        return time_round_robin({"agg": lambda: agg(op)}, comm, 1, backend.sync)["agg"][0]

    window = {}  # the window chosen across nodes, added to every sample's knobs

    def measure(cfg):
        if "threads" in cfg:
            numba.set_num_threads(cfg["threads"])
        return fresh_sample(build, warm, timed, {**cfg, **window})

    ranked = rank_configs(space, Workload.of(base, dim), dev, "p2p" if backend.gpu else "get")
    guess = model_guess(ranked)
    third = list(space)[2]
    default = {"ps": 16, "dist": 4, third: 4 if backend.gpu else max(space[third])}
    t0 = time.perf_counter()
    choices = cls.window_choices(comm)
    picked, window_latency = choose_window(choices, default, measure, protocol.min_samples)
    if picked:
        window["window"] = picked
    if start == "model":
        res = search(space, measure, model=model_table(ranked), protocol=protocol)
    else:
        res = search(space, measure, protocol=protocol)
    result = {
        "graph": dataset.name,
        "np": comm.size,
        "dim": dim,
        "op": op,
        "backend": backend.name,
        "space": space,
        "protocol": asdict(protocol),
        "window": picked or (None if backend.gpu else comm.window),
        "window_latency_s": window_latency,
        **res.to_json(),
        "search_seconds": time.perf_counter() - t0,
        "model_guess": guess,
        "default": default,
    }
    table = res.table()
    contenders = {"start": res.start, "default": default, "model_guess": guess}
    contenders["tuned"] = res.best
    if full_grid:
        grid = exhaustive(space, measure, grid_rounds)
        table = grid.table()
        result["exhaustive_best"] = grid.best
        result["exhaustive_best_latency_s"] = grid.best_latency
        result["exhaustive_measured"] = grid.measured
        result["exhaustive_rounds"] = grid_rounds
        result["exhaustive_noise"] = grid.noise
        contenders["exhaustive_best"] = grid.best
    confirmed = confirm_medians(contenders, measure, confirm)
    if not confirmed:  # --confirm 0: the medians already measured (the grid's, if any)
        names = contenders if full_grid else ("start", "tuned")  # what the search measured
        confirmed = {k: table[tuple(contenders[k].values())] for k in names}
    result["confirmed_latency_s"] = confirmed
    result["default_latency_s"] = confirmed.get("default")
    if full_grid:
        best = confirmed["exhaustive_best"]
        result["vs_exhaustive"] = confirmed["tuned"] / best
        result["model_guess_vs_exhaustive"] = confirmed["model_guess"] / best
    result["table"] = table
    return result


def report_folder(out) -> Path:
    """The folder of write_report, made (checked before a search, so it is not lost)."""
    return make_folder(out, "the trace and heatmaps")


def write_report(result: dict, out) -> tuple[Path, Path]:
    """The trace JSON and the heatmaps (Fig. 10) of a tune() result in folder ``out``, each
    written atomically."""
    from .plot import heatmaps

    out = report_folder(out)
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
