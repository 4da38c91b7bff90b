"""``mgg tune``: the tuner's driver (mgg.tuner.drive) on one graph and width, each sample
one aggregation on designs built for it alone, timed as the check harness times one
(mgg.harness.timing); then, optionally, the whole grid and a confirmation round."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from ..atomic import atomic_write, make_folder
from ..backend import assign, get_backend
from ..graph.dataset import Dataset, random_features
from ..knobs import DEFAULTS, TUNABLE, Knobs
from ..partition import build_plan
from ..partition import order as node_order
from ..partition.shards import ShardedDataset
from ..precision import row_dtype
from ..tuner import Protocol, Workload, drive
from ..tuner.search import confirm_medians, exhaustive
from .check import sharded_plan
from .timing import fresh_sample, time_round_robin


def tune(
    dataset: Dataset,
    backend,
    comm,
    *,
    dim: int = 16,
    op: str = "gcn",
    knobs: Knobs = DEFAULTS,
    start: str = "model",
    protocol: Protocol | None = None,
    full_grid: bool = False,
    grid_rounds: int = 5,
    confirm: int = 5,
    seed: int = 0,
    order_file=None,
) -> dict:
    """Search this backend's device's space (mgg.knobs.space) for the pipelined design
    with the tuner's driver; collective, every rank takes the same decisions. ``knobs``:
    the job's fixed knobs (split, remote, order (or ``order_file``); a window fixes it,
    else one is chosen where the job has a choice) and the point where the search's
    default is.

    start 'model' (the analytical model's guess, its ranking ordering the moves) or
    'origin' (the paper's (1, 1, 1), moves knob by knob); full_grid also measures every
    configuration of the space, ``grid_rounds`` times round-robin, independently of the
    search; ``confirm`` rounds then re-measure the start, the default, the model's guess,
    the tuned (and the grid's best) configurations round-robin, and the ratios use those.

    returns the search's JSON (best, trace, samples, noise, confidence, ...) plus space,
    default, model_guess, window, confirmed latencies, "knobs" (the tuned knobs' JSON, as
    --config takes it), and with full_grid "exhaustive_best", "exhaustive_best_latency_s",
    "exhaustive_measured", "vs_exhaustive" (confirmed tuned / confirmed grid best) and
    "model_guess_vs_exhaustive"; the measured medians (config tuple -> seconds) under
    "table"
    """
    import numba

    backend = get_backend(backend)
    cls = backend.design("pipelined")
    knobs.check_taken(backend.takes(cls), backend.job("pipelined"))
    protocol = protocol or Protocol()
    if isinstance(dataset, ShardedDataset):
        base, ids = sharded_plan(dataset, comm, op == "gcn", knobs, order_file)
    else:
        order = node_order.for_job(
            dataset.graph, knobs.order, comm, path=order_file, seed=seed, split=knobs.split
        )
        g = order.apply(dataset.graph)
        g = g.gcn_norm() if op == "gcn" else g
        base = build_plan(
            g, comm.size, knobs.ps, rank=comm.rank, split=knobs.split, transposed=False
        )
        ids = order.ids(base.lb, base.ub)
    dtype = row_dtype(knobs.dtype)
    x = random_features(seed, base.lb, base.ub, dim, ids=ids).astype(dtype)
    dev = backend.device()

    def build(cfg):
        these = replace(knobs, **{k: v for k, v in cfg.items() if k != "threads"})
        return cls(base.with_ps(cfg["ps"]), comm, dim, dtype, **these.options(cls.knobs))

    def warm(agg):
        assign(agg.x, x)
        agg(op)

    def timed(agg):  # the slowest rank's seconds: every rank sees the same number
        return time_round_robin({"agg": lambda: agg(op)}, comm, 1, backend.sync)["agg"][0]

    chosen = {}  # the window the driver chose, in every sample after its search

    def measure(cfg):
        if "threads" in cfg:
            numba.set_num_threads(cfg["threads"])
        return fresh_sample(build, warm, timed, {**cfg, **chosen})

    t0 = time.perf_counter()
    fixed_window = knobs.window is not None or backend.gpu
    tuned = drive(
        measure,
        device=dev,
        work=Workload.of(base, dim, dtype.itemsize),
        mode="p2p" if backend.gpu else "get",
        knobs=knobs,
        windows=() if fixed_window else cls.window_choices(comm),
        start=start,
        protocol=protocol,
    )
    res, default, guess = tuned.result, tuned.default, tuned.model_guess
    window = tuned.window or (None if backend.gpu else knobs.window or comm.window)
    result = {
        "graph": dataset.name,
        "np": comm.size,
        "dim": dim,
        "op": op,
        "dtype": knobs.dtype,
        "backend": backend.name,
        "protocol": asdict(protocol),
        "window": window,
        **tuned.to_json(),
        "search_seconds": time.perf_counter() - t0,
        "knobs": replace(knobs, **res.best, window=window).to_json(
            k for k in TUNABLE if k in backend.takes(cls)
        ),
    }
    if tuned.window:
        chosen["window"] = tuned.window
    table = res.table()
    contenders = {"start": res.start, "default": default, "model_guess": guess}
    contenders["tuned"] = res.best
    if full_grid:
        grid = exhaustive(tuned.space, measure, grid_rounds)
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


def write_report(result: dict, out) -> tuple[Path, Path, Path]:
    """The trace JSON, the tuned knobs (STEM-knobs.json, what ``--config`` takes) and the
    heatmaps (Fig. 10) of a tune() result in folder ``out``, each written atomically."""
    from ..tuner.plot import heatmaps

    out = report_folder(out)
    stem = f"{result['graph']}-P{result['np']}-D{result['dim']}"
    trace, knobs = out / f"{stem}-trace.json", out / f"{stem}-knobs.json"
    text = json.dumps({k: v for k, v in result.items() if k != "table"}, indent=1)
    with atomic_write(trace, knobs) as (tmp, tmp_knobs):
        Path(tmp).write_text(text)
        Path(tmp_knobs).write_text(json.dumps(result["knobs"]) + "\n")
    png = heatmaps(
        result["space"],
        result["table"],
        result["best"],
        out / f"{stem}.png",
        f"{result['graph']}, P={result['np']}, D={result['dim']}",
    )
    return trace, knobs, Path(png)


def in_training(g, measure, width: int, budget: int, space: dict, start, log) -> dict:
    """The tuner's driver (mgg.tuner.drive) inside a training run: each sample
    ``measure(config)`` (a real training step's seconds, the slowest rank's) on ``g``
    (DistGraph) at layer ``width``, within ``budget`` steps, from the model's guess unless
    ``start`` is given; ``g`` is left at the best knobs. Returns the result's JSON."""
    be = g.backend
    # epochs are dear: fewer samples each (three: the run's first epoch is slow)
    protocol = Protocol(min_samples=3, max_samples=5, max_configs=10, final_rounds=1, budget=budget)
    tuned = drive(
        measure,
        device=be.device(),
        work=Workload.of(g.plan, width, g.dtype.itemsize),
        mode="p2p" if be.gpu else "get",
        knobs=replace(g.knobs, **g.config),  # threads as numba runs them
        search_space=space,
        windows=g.window_choices,
        start=start or "model",
        protocol=protocol,
    )
    res = tuned.result
    if tuned.window and log:
        times = ", ".join(f"{w} {t * 1e3:.1f} ms" for w, t in tuned.window_latency.items())
        log(f"window {tuned.window} ({times} a step)")
    g.configure(**tuned.best)
    tuning = res.to_json()
    if tuned.window:
        tuning.update(window=tuned.window, window_latency_s=tuned.window_latency)
    if log:
        log(
            f"tuned {res.best} in {res.samples} steps over {res.measured} configurations: "
            f"{res.best_latency * 1e3:.1f} ms (start {res.start_latency * 1e3:.1f} ms, "
            f"noise {res.noise:.1%}, confidence {res.confidence:.0%})"
        )
    return tuning
