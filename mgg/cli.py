"""`mgg` command line: `mgg info | partition | check | tune | train | demo`.

Thin: parse, resolve the backend, comm and dataset, call the library, print. Every
subcommand that reports results takes ``--json`` and then prints its result as one JSON
object on the last line of stdout. Errors print one line and exit 2; in a multi-rank job
a failing rank takes the whole job down.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

GPU_PACKAGES = ("cupy", "cupyx", "nvshmem", "cuda")
GRAPH = (
    "a file (.npz, .graph, .txt/.gz edge list, *_beg_pos.bin) or a generator spec: "
    "reddit|enwiki|products|proteins|orkut[:scale=S], rmat:scale=K,ef=F, planted:nodes=N,classes=C"
)
DIST = "interleaving distance (cpu: fetch batches in flight; cuda: partitions per warp)"
REMOTE = "CUDA peer reads: loads via nvshmem_ptr (p2p), device gets (get), p2p if all map (auto)"
BALANCE = "balance edges (Algorithm 1) or node counts"
START = "start at (1, 1, 1) as the paper, or at the model's best guess"
MODEL = (
    "gcn, sage, gin or gat, each with the paper's defaults, or any model registered in "
    "mgg.torch.MODELS"
)


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from .comm import abort_job, finalize

    try:
        code = args.func(args) or 0
        finalize()  # NVSHMEM, where the command used it
        return code
    except (ValueError, FileNotFoundError, KeyError, RuntimeError, MemoryError) as e:
        print(f"mgg {args.command}: error: {e}", file=sys.stderr)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in GPU_PACKAGES:
            raise
        print(
            f"mgg {args.command}: error: {e}: the cuda backend needs the gpu extra "
            "(pip install 'mgg[gpu]', or 'mgg[gpu-cu12]' with CUDA 12 drivers)",
            file=sys.stderr,
        )
    sys.stderr.flush()
    abort_job(2)
    return 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mgg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")

    s = sub.add_parser("info", help="versions, backends and devices")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("partition", help="partition a graph and report the plan's statistics")
    _graph_args(s)
    s.add_argument("--np", type=int, required=True, help="number of ranks P")
    s.add_argument("--ps", type=int, default=16, help="neighbor partition size")
    s.add_argument("--mode", choices=["edges", "nodes"], default="edges", help=BALANCE)
    s.add_argument("--no-transposed", action="store_true", help="skip the backward plans")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_partition)

    s = sub.add_parser("check", help="verify every design against scipy and time it")
    _graph_args(s)
    s.add_argument("--dim", type=int, default=16, help="feature width D")
    s.add_argument("--op", default="sum", help="sum|mean|gcn|gin, or 'all'")
    s.add_argument("--ps", type=int, default=16, help="neighbor partition size")
    s.add_argument("--dist", type=int, default=4, help=DIST)
    s.add_argument("--designs", default="all", help="comma-separated design names, or 'all'")
    s.add_argument("--window", default="auto", help="auto|shm|rma, or 'all' (MPI backend)")
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--mode", choices=["auto", "p2p", "get"], default="auto", help=REMOTE)
    s.add_argument("--repeat", type=int, default=5, help="timed runs per design (median)")
    s.add_argument("--outputs", help="rank 0 saves each output as DIR/DESIGN-OP-WINDOW.npy")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("tune", help="search ps, dist and wpb/threads for a graph and width")
    _graph_args(s)
    s.add_argument("--dim", type=int, default=16, help="feature width D")
    s.add_argument("--op", default="gcn", help="sum|mean|gcn|gin")
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--start", choices=["origin", "model"], default="origin", help=START)
    s.add_argument("--budget", type=int, default=None, help="most configurations measured")
    s.add_argument("--repeat", type=int, default=3, help="timed runs per configuration")
    s.add_argument("--exhaustive", action="store_true", help="also measure the whole grid")
    s.add_argument("--confirm", type=int, default=3, help="rounds re-measuring the winners")
    s.add_argument("--out", default="mgg-tune", help="folder for the trace JSON and heatmaps")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_tune)

    s = sub.add_parser("train", help="full-graph GCN/SAGE/GIN/GAT training (launch with mggrun)")
    _train_args(s)
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("demo", help="4-rank GCN training on a generated graph (make demo)")
    _train_args(
        s, dataset="planted:nodes=250000,classes=8,degree=12,features=32", epochs=40, eval_every=5
    )
    s.set_defaults(func=cmd_train)
    return p


def _train_args(s, dataset=None, epochs=200, eval_every=1):
    s.add_argument("--dataset", required=dataset is None, default=dataset, help=GRAPH)
    s.add_argument("--scale", type=float, default=None, help="scale factor for stand-ins")
    s.add_argument("--model", default="gcn", help=MODEL)
    s.add_argument("--epochs", type=int, default=epochs)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--hidden", type=int, default=None, help="default: the model's")
    s.add_argument("--layers", type=int, default=None, help="default: the model's")
    s.add_argument("--heads", type=int, default=None, help="attention heads (gat; default 8)")
    s.add_argument(
        "--input-dropout", type=float, default=None, help="on the features (gin; default 0.9)"
    )
    s.add_argument("--dropout", type=float, default=None, help="default: the model's")
    s.add_argument("--lr", type=float, default=None, help="default: the model's")
    s.add_argument(
        "--weight-decay", type=float, default=None, help="L2, default the model's (5e-4)"
    )
    s.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    s.add_argument("--row-normalize", action="store_true", help="feature rows sum to 1")
    s.add_argument("--ps", type=int, default=16, help="neighbor partition size")
    s.add_argument("--dist", type=int, default=4, help=DIST)
    s.add_argument("--design", default="pipelined", help="pipelined|bulk_halo|direct (cpu)")
    s.add_argument("--window", choices=["auto", "shm", "rma"], default="auto")
    s.add_argument("--eval-every", type=int, default=eval_every, help="0: only at the end")
    s.add_argument("--checkpoint-dir", default=None)
    s.add_argument("--checkpoint-every", type=int, default=0)
    s.add_argument("--resume", default=None, help="a checkpoint file to continue from")
    s.add_argument("--tune", action="store_true", help="search ps, dist, ... in the first epochs")
    s.add_argument("--config", help='a tuned configuration, e.g. \'{"ps": 32, "dist": 4}\'')
    s.add_argument("--check-sync", action="store_true", help="check weights agree every step")
    s.add_argument("--json", action="store_true")


def _graph_args(s):
    s.add_argument("graph", help=GRAPH)
    s.add_argument("--scale", type=float, default=None, help="scale factor for stand-ins")
    s.add_argument("--seed", type=int, default=0)


def _load(args):
    from .graph.specs import resolve

    return resolve(args.graph, scale=args.scale, seed=args.seed)


def _quiet(args) -> bool:
    """--json to a pipe: only the JSON line."""
    return args.json and not sys.stdout.isatty()


def format_table(rows, headers) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c) -> str:
    if isinstance(c, float):
        return f"{c:.4g}"
    if isinstance(c, (int, np.integer)):
        return f"{c:,}"
    return str(c)


# ---- info --------------------------------------------------------------------------------
def cmd_info(args) -> int:
    from .backend import describe

    info = describe()
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:>14}: {v}")
    return 0


# ---- partition ---------------------------------------------------------------------------
def cmd_partition(args) -> int:
    from .partition import build_plan, plan_stats

    t0 = time.perf_counter()
    ds = _load(args)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plans = build_plan(
        ds.graph, args.np, args.ps, mode=args.mode, transposed=not args.no_transposed
    )
    st = {**plan_stats(plans, time.perf_counter() - t0), "graph": ds.name, "load_seconds": load_s}
    if not _quiet(args):
        print(
            f"{st['graph']}: {st['num_nodes']:,} nodes, {st['num_edges']:,} edges, "
            f"P={st['np']}, ps={st['ps']}; build_plan {st['plan_seconds']:.3f} s "
            f"(load {st['load_seconds']:.2f} s)"
        )
        rows = [
            [s["rank"], f"[{s['lb']}, {s['ub']})", s["nodes"]]
            + [s["local_edges"] + s["remote_edges"]]
            + [s[k] for k in ("local_edges", "remote_edges", "halo_rows", "lnp", "rnp")]
            for s in (q.stats() for q in plans)
        ]
        heads = ["rank", "range", "nodes", "edges", "local", "remote", "halo rows", "LNP", "RNP"]
        print(format_table(rows, heads))
        print(
            f"imbalance (max/mean edges) {st['imbalance']:.3f} · remote fraction "
            f"{st['remote_fraction']:.3f} · remote rows fetched once: {st['halo_rows']:,} of "
            f"{st['remote_edges']:,} remote edges ({st['dedup_saving']:.2f}x fewer)"
        )
    if args.json:
        print(json.dumps(st))
    return 0


# ---- check -------------------------------------------------------------------------------
def cmd_check(args) -> int:
    from .backend import get_backend
    from .designs.check import check
    from .kernels import OPS

    if args.mode != "auto" and args.backend != "cuda":
        raise ValueError("--mode chooses how the CUDA kernel reads peers: use --backend cuda")
    backend = get_backend(args.backend)
    comm = backend.comm(mode=args.mode)  # first: from here on a failing rank aborts the job
    ds = _load(args)
    result = check(
        ds,
        backend,
        comm,
        ops=list(OPS) if args.op == "all" else args.op.split(","),
        names=None if args.designs == "all" else args.designs.split(","),
        windows=["shm", "rma"] if args.window == "all" else [args.window],
        dim=args.dim,
        ps=args.ps,
        dist=args.dist,
        mode=None if args.mode == "auto" else args.mode,
        repeat=args.repeat,
        seed=args.seed,
        outputs=args.outputs,
    )
    if comm.rank == 0:
        if not _quiet(args):
            print(
                f"{ds.name}: {ds.graph.num_nodes:,} nodes, {ds.graph.num_edges:,} edges, "
                f"P={comm.size}, D={args.dim}, ps={args.ps}, dist={args.dist}"
            )
            rows = [
                [r["design"], r["op"], r["window"], "ok" if r["ok"] else "MISMATCH"]
                + [f"{r[k] * 1e3:.2f}" for k in ("seconds", "wait_seconds")]
                + [f"{r['remote_bytes'] / 1e6:.2f}"]
                for r in result["runs"]
            ]
            heads = ["design", "op", "window", "check", "ms (median)", "wait ms (rank mean)"]
            print(format_table(rows, heads + ["MB fetched (all ranks)"]))
        if args.json:
            print(json.dumps(result))
    return 0 if all(d["ok"] for d in result["designs"].values()) else 1


# ---- tune --------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    from .backend import get_backend
    from .tuner.tune import tune, write_report

    backend = get_backend(args.backend)
    comm = backend.comm()  # first: from here on a failing rank aborts the job
    res = tune(
        _load(args),
        backend,
        comm,
        dim=args.dim,
        op=args.op,
        start=args.start,
        budget=args.budget,
        repeat=args.repeat,
        full_grid=args.exhaustive,
        confirm=args.confirm,
        seed=args.seed,
    )
    if comm.rank != 0:
        return 0
    _, png = write_report(res, args.out)
    res.pop("table")
    res["heatmaps"] = str(png)
    if not _quiet(args):
        trace = [
            [i, t["phase"], *t["config"].values(), f"{t['latency'] * 1e3:.3f}"]
            for i, t in enumerate(res["trace"], 1)
        ]
        print(format_table(trace, ["#", "phase", *res["space"], "ms (median)"]))
        grid = ""
        if args.exhaustive:
            ms = res["exhaustive_best_latency_s"] * 1e3
            grid = f"; exhaustive best {res['exhaustive_best']} {ms:.3f} ms"
        print(
            f"best {res['best']}: {res['best_latency_s'] * 1e3:.3f} ms after {res['measured']} "
            f"measured configs; start {res['start_latency_s'] * 1e3:.3f} ms, default "
            f"{res['default']} {res['default_latency_s'] * 1e3:.3f} ms{grid}\n"
            f"trace and heatmaps in {args.out}/"
        )
    if args.json:
        print(json.dumps(res))
    return 0


# ---- train -------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from .backend import get_backend, is_sparse
    from .graph.specs import resolve
    from .torch import MODELS, build_model
    from .train import Trainer, build_optimizer, prepare

    backend = get_backend(args.backend)
    comm = backend.comm(window=args.window)  # first: a failing rank now aborts the job
    lead = comm.rank == 0
    if args.model not in MODELS:
        raise ValueError(f"unknown model {args.model!r}; choose one of {', '.join(MODELS)}")
    t0 = time.perf_counter()
    ds = resolve(args.dataset, scale=args.scale, seed=args.seed)
    knobs = {"dist": args.dist} if args.design == "pipelined" else {}
    dg, data = prepare(
        ds,
        comm,
        args.model,
        ps=args.ps,
        seed=args.seed,
        row_normalize=args.row_normalize,
        design=args.design,
        backend=backend,
        **knobs,
    )
    setup_s = time.perf_counter() - t0
    spec = MODELS[args.model]
    extra = {}
    for flag, model in (("heads", "gat"), ("input_dropout", "gin")):
        if getattr(args, flag) is not None:
            if args.model != model:
                raise ValueError(f"--{flag.replace('_', '-')} is an option of --model {model}")
            extra[flag] = getattr(args, flag)
    model = build_model(
        args.model,
        data.num_features,
        data.num_classes,
        hidden=args.hidden,
        layers=args.layers,
        dropout=args.dropout,
        seed=args.seed,
        **extra,
    ).to(data.y.device)
    opt = build_optimizer(
        args.optimizer,
        model,
        spec.lr if args.lr is None else args.lr,
        spec.weight_decay if args.weight_decay is None else args.weight_decay,
    )
    say = print if lead and not _quiet(args) else None
    if say:
        say(
            f"{ds.name}: {ds.graph.num_nodes:,} nodes, {ds.graph.num_edges:,} edges, "
            f"{data.num_features} features{' (sparse)' if is_sparse(data.x) else ''}, "
            f"{data.num_classes} classes; {args.model.upper()} on {comm.size} rank(s); "
            f"setup {setup_s:.1f} s{'; ' + data.notes if data.notes else ''}"
        )
    trainer = Trainer(
        dg,
        data,
        model,
        opt,
        tune=args.tune,
        config=json.loads(args.config) if args.config else None,
        check_sync=args.check_sync,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        log=say,
    )
    if args.resume:
        trainer.load_checkpoint(args.resume)
        if say:
            say(f"resumed from {args.resume} at epoch {trainer.epoch}")
    trainer.fit(args.epochs)
    summary = trainer.summary()
    dg.free()
    result = {
        "model": args.model,
        "dataset": ds.name,
        "np": comm.size,
        "epochs": args.epochs,
        "num_nodes": ds.graph.num_nodes,
        "num_edges": ds.graph.num_edges,
        "setup_s": setup_s,
        **summary,
    }
    if say:
        peer = result["bytes_per_epoch"]
        say(
            f"final: train {result['train_acc']:.3f}  val {result['val_acc']:.3f}  test "
            f"{result['test_acc']:.3f}  ·  median epoch {result['epoch_time_s'] * 1e3:.1f} ms"
            + (f"  ·  peer rows per epoch {peer / 1e6:.1f} MB" if peer is not None else "")
        )
    if lead and args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
