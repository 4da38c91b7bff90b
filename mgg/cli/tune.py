"""`mgg tune`: the tuner's search for a graph and width (mgg.harness.tune), its trace,
pick and heatmaps, and the tuned knobs as ``--config`` takes them."""

from __future__ import annotations

from .common import (
    emit,
    format_table,
    graph_args,
    integer,
    job_args,
    knob_args,
    knobs_of,
    number,
    open_dataset,
    order_file_arg,
    quiet,
    renamed,
)

KNOBS = ("window", "split", "remote", "dtype", "order")  # fixed; ps, dist, wpb or threads searched
START = "start at the model's guess (its ranking orders the moves), or at (1, 1, 1) as the paper"


def add(sub):
    s = sub.add_parser("tune", help="search ps, dist and wpb/threads for a graph and width")
    graph_args(s)
    s.add_argument("--dim", type=integer(1), default=16, help="feature width D")
    s.add_argument("--op", default="gcn", help="sum|mean|gcn|gin")
    job_args(s, "tune")
    knob_args(s, KNOBS)
    order_file_arg(s)
    renamed(s, "--mode", "remote")
    s.add_argument("--start", choices=["model", "origin"], default="model", help=START)
    s.add_argument(
        "--budget", type=integer(1), default=15, help="most configurations measured (15)"
    )
    s.add_argument(
        "--repeat", type=integer(1), default=3, help="fewest timed runs per configuration (3)"
    )
    s.add_argument(
        "--max-repeat", type=integer(1), default=12, help="most timed runs per configuration (12)"
    )
    s.add_argument(
        "--precision",
        type=number(0),
        default=0.03,
        help="wanted relative error of a configuration's median (0.03)",
    )
    s.add_argument(
        "--exhaustive", action="store_true", help="also measure the whole grid, on its own"
    )
    s.add_argument(
        "--grid-rounds", type=integer(1), default=5, help="rounds over the grid (--exhaustive)"
    )
    s.add_argument("--confirm", type=integer(0), default=5, help="rounds re-measuring the winners")
    s.add_argument(
        "--out", default="mgg-tune", help="folder for the trace, the tuned knobs and heatmaps"
    )
    s.add_argument("--json", action="store_true")
    return s


def main(args) -> int:
    from ..atomic import check_paths
    from ..backend import get_backend
    from ..errors import InputError
    from ..harness.tune import report_folder, tune, write_report
    from ..tuner import Protocol

    backend = get_backend(args.backend)
    knobs = knobs_of(args, backend.takes("pipelined"), backend.job("pipelined"))
    comm = backend.comm(knobs)  # first: from here on a failing rank aborts the job
    check_paths({"--out": args.out}, {"graph": args.graph, "--order-file": args.order_file})
    if comm.rank == 0:
        report_folder(args.out)
    if args.repeat > args.max_repeat:
        raise InputError(f"--repeat {args.repeat} is more than --max-repeat {args.max_repeat}")
    if args.precision >= 1:
        raise InputError(f"--precision is a relative error below 1, got {args.precision}")
    ds = open_dataset(args.graph, args.scale, args.seed)
    if not backend.gpu:  # its sizes (--dim) against the plan before the first allocation:
        from ..footprint import checked_estimate  # check's, one design (and its oracle: more)

        order = "file" if args.order_file else knobs.order
        job = dict(dim=args.dim, dtype=knobs.dtype, order=order, ops=(args.op,))
        checked_estimate(ds, comm.size, "check", source=args.graph, backend="cpu", **job)
    res = tune(
        ds,
        backend,
        comm,
        dim=args.dim,
        op=args.op,
        knobs=knobs,
        start=args.start,
        protocol=Protocol(
            rel_error=args.precision,
            min_samples=args.repeat,
            max_samples=args.max_repeat,
            max_configs=args.budget,
        ),
        full_grid=args.exhaustive,
        grid_rounds=args.grid_rounds,
        confirm=args.confirm,
        seed=args.seed,
        order_file=args.order_file,
    )
    if comm.rank != 0:
        return 0
    _, config, png = write_report(res, args.out)
    res.pop("table")
    res.update(heatmaps=str(png), config_file=str(config))
    if not quiet(args):
        _print(args, res)
    emit(args, res)
    return 0


def _print(args, res: dict) -> None:
    trace = [
        [i, t["phase"], *t["config"].values(), f"{t['latency'] * 1e3:.3f}", t["samples"]]
        + [f"{t['spread']:.1%}"]
        for i, t in enumerate(res["trace"], 1)
    ]
    heads = ["#", "phase", *res["space"], "ms (median)", "samples", "spread"]
    print(format_table(trace, heads))
    ms = {k: f"{v * 1e3:.3f} ms" for k, v in res["confirmed_latency_s"].items()}
    grid = ""
    if args.exhaustive:
        grid = (
            f"; exhaustive best {res['exhaustive_best']} {ms['exhaustive_best']}: "
            f"tuned at {res['vs_exhaustive']:.3f}x, the model's guess alone at "
            f"{res['model_guess_vs_exhaustive']:.3f}x"
        )
    tuned = ms.get("tuned", f"{res['best_latency_s'] * 1e3:.3f} ms")
    if res["window_latency_s"]:
        each = ", ".join(f"{w} {t * 1e3:.3f} ms" for w, t in res["window_latency_s"].items())
        print(f"window {res['window']} ({each} at the default configuration)")
    print(
        f"best {res['best']}: {tuned} after {res['measured']} configs ({res['samples']} "
        f"samples, noise {res['noise']:.1%}, confidence {res['confidence']:.0%}); "
        f"start {ms.get('start', '-')}, default {res['default']} {ms.get('default', '-')}"
        f"{grid}\ntrace and heatmaps in {args.out}/; train with --config {res['config_file']}"
    )
