"""`mgg check`: every design verified against scipy and timed (mgg.harness.check)."""

from __future__ import annotations

from .common import (
    device_plan,
    emit,
    format_table,
    graph_args,
    integer,
    job_args,
    knob_args,
    knobs_of,
    open_dataset,
    order_file_arg,
    quiet,
    renamed,
    sizes,
)

KNOBS = ("ps", "dist", "wpb", "threads", "window", "split", "remote", "dtype", "order")
EVERY_WINDOW = ("all", "each design on every window it takes that the job can use")


def add(sub):
    s = sub.add_parser("check", help="verify every design against scipy and time it")
    graph_args(s)
    s.add_argument("--dim", type=integer(1), default=16, help="feature width D")
    s.add_argument("--op", default="sum", help="sum|mean|gcn|gin, or 'all'")
    s.add_argument("--designs", default="all", help="comma-separated design names, or 'all'")
    job_args(s, "check")
    knob_args(s, KNOBS, extra={"window": EVERY_WINDOW})
    order_file_arg(s)
    renamed(s, "--mode", "remote")
    s.add_argument("--repeat", type=integer(1), default=5, help="timed runs per design (median)")
    s.add_argument("--outputs", help="rank 0 saves each output as DIR/DESIGN-OP-WINDOW.npy")
    s.add_argument("--json", action="store_true")
    return s


def main(args) -> int:
    from ..backend import get_backend
    from ..footprint import check_host, checked_estimate
    from ..harness.check import check
    from ..kernels import OPS
    from ..memory import peak_rss_mb

    backend = get_backend(args.backend)
    every = args.window == "all"
    if every:
        args.window = None
    names = None if args.designs == "all" else args.designs.split(",")
    known = [n for n in names or backend.designs() if n in backend.designs()]
    knobs = knobs_of(args, backend.takes(*known), backend.job(*known))
    if every and backend.gpu:
        raise ValueError("--window all compares the MPI windows of the cpu backend")
    comm = backend.comm(knobs)  # first: from here on a failing rank aborts the job
    ds = open_dataset(args.graph, args.scale, args.seed)
    ops = list(OPS) if args.op == "all" else args.op.split(",")
    order = "file" if args.order_file else knobs.order
    job = dict(dim=args.dim, dtype=knobs.dtype, order=order, designs=len(known), ops=tuple(ops))
    job["backend"] = backend.name
    if backend.gpu:  # the host holds the data, the plan and the oracle; the GPU the designs
        device = device_plan(args, ds, comm.size, "check", job)
        planned = check_host(device, args.graph, f"mgg check on {comm.size} rank(s)")
    else:
        planned = checked_estimate(ds, comm.size, "check", source=args.graph, **job)
    result = check(
        ds,
        backend,
        comm,
        ops=ops,
        names=names,
        knobs=knobs,
        every_window=every,
        dim=args.dim,
        repeat=args.repeat,
        seed=args.seed,
        outputs=args.outputs,
        order_file=args.order_file,
    )
    peaks = comm.allgather(peak_rss_mb())
    if comm.rank == 0:
        if not quiet(args):
            n, e = sizes(ds)
            print(
                f"{ds.name}: {n:,} nodes, {e:,} edges, P={comm.size}, D={args.dim}, "
                f"ps={result['ps']}, dist={result['dist']}, {result['dtype']}"
                + ("" if result["order"] == "natural" else f", {result['order']} order")
            )
            rows = [
                [r["design"], r["op"], r["window"], "ok" if r["ok"] else "MISMATCH"]
                + [f"{r[k] * 1e3:.2f}" for k in ("seconds", "wait_seconds")]
                + [f"{r['remote_bytes'] / 1e6:.2f}"]
                for r in result["runs"]
            ]
            heads = ["design", "op", "window", "check", "ms (median)", "wait ms (rank mean)"]
            print(format_table(rows, heads + ["MB fetched (all ranks)"]))
        mem = round(planned["total"] / 2**20, 1)
        emit(args, {**result, "memory_estimate_mb": mem, "peak_rss_mb": peaks})
    return 0 if all(d["ok"] for d in result["designs"].values()) else 1
