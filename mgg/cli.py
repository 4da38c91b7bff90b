"""`mgg` command line: `mgg info | partition | check | tune | train | demo | convert`.

Thin: parse, resolve the backend, comm and dataset, call the library, print. Every
subcommand that reports results takes ``--json`` and then prints its result as one JSON
object on the last line of stdout. Errors print one line and exit 2; in a multi-rank job
a failing rank takes the whole job down.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .comm.mpi import WINDOWS
from .memory import peak_rss_mb
from .partition.node_split import MODES

GPU_PACKAGES = ("cupy", "cupyx", "nvshmem", "cuda")
GRAPH = (
    "a file (.npz, .graph, .txt/.gz edge list, *_beg_pos.bin) or a generator spec: "
    "reddit|enwiki|products|proteins|orkut[:scale=S], rmat:scale=K,ef=F, planted:nodes=N,classes=C"
)
DIST = (
    "interleaving distance (cpu: fetch batches in flight, or chunks with --window msg; "
    "cuda: partitions per warp)"
)
WINDOW = (
    "how peers' rows reach a rank (MPI backend): shm (loads, one node), rma (one-sided "
    "gets), msg (two-sided messages); auto: shm on one node, else msg; check: or 'all'"
)
REMOTE = "CUDA peer reads: loads via nvshmem_ptr (p2p), device gets (get), p2p if all map (auto)"
PART_MODEL = (
    "the graph the plans are of: a model's (gcn, sage, gin, gat) or a graph kind (as_is, "
    "gcn_norm, self_loops, no_self_loops); default gcn with --out, else the graph as given"
)
DISTRIBUTED = (
    "launched with mggrun -np P: each rank reads only its slice of FILE (edge list, MGG "
    "binary CSR or .npz) and builds its own plan"
)
SHARDED = "; or a sharded dataset folder written by mgg partition --out"
CONVERT_IN = "a file (.npz, .txt/.gz edge list, .graph, *_beg_pos.bin), an OGB directory or a spec"
CONVERT_OUT = ".npz (keeps node data), .txt/.gz (edge list), .graph (METIS) or *_beg_pos.bin"
BALANCE = "balance edges (Algorithm 1), node counts, or both shares (mixed)"
START = "start at the model's guess (its ranking orders the moves), or at (1, 1, 1) as the paper"
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
    from .comm import abort_job, finalize, job_rank
    from .errors import GraphError, MggError

    previous_hook, sys.unraisablehook = sys.unraisablehook, _interrupt_hook(args.command)
    try:
        code = args.func(args) or 0
        finalize()  # NVSHMEM, where the command used it
        return code
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except (MggError, ValueError, OSError, RuntimeError, MemoryError) as e:
        msg = _message(e)
        if isinstance(e, GraphError) and _INPUT and _INPUT[-1] not in msg:
            msg = f"{_INPUT[-1]}: {msg}"  # found past the reader: name the input anyway
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in GPU_PACKAGES:
            raise
        msg = (
            f"{e}: the cuda backend needs the gpu extra "
            "(pip install 'mgg[gpu]', or 'mgg[gpu-cu12]' with CUDA 12 drivers)"
        )
    finally:
        sys.unraisablehook = previous_hook
    if job_rank() > 0:  # every rank usually hits the same error: let rank 0's abort end
        from .comm.mpi import ABORT_GRACE_SECONDS  # this one before it repeats it

        time.sleep(ABORT_GRACE_SECONDS + 0.5)
    print(f"mgg {args.command}: error: {msg}", file=sys.stderr)
    sys.stderr.flush()
    abort_job(2)
    return 2


def _interrupt_hook(command: str):
    """An unraisable-exception hook: Python only reports a Ctrl-C that lands in a __del__
    (numba's compiler has many), so act on it here."""
    default = sys.unraisablehook

    def hook(u):
        if issubclass(u.exc_type, KeyboardInterrupt):
            _interrupted(command, exit_now=True)
        default(u)

    return hook


def _interrupted(command: str, exit_now: bool = False) -> int:
    """Ctrl-C: no traceback, exit code 130, and one line, from rank 0 (under mggrun from
    mggrun, which alone is sure to outlive every rank). In a multi-rank job the rank aborts
    the job, skipping MPI_Finalize (which could wait on a peer still inside a collective);
    an abort, unlike a bare exit, ends the others without mpiexec's failure banner."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    env = os.environ
    if env.get("MGG_LAUNCHER") != "mggrun" and int(env.get("PMI_RANK") or 0) == 0:
        print(f"mgg {command}: interrupted", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if exit_now or int(env.get("MGG_SIZE") or env.get("PMI_SIZE") or 1) > 1:
        from .comm import abort_job

        abort_job(130)
        os._exit(130)
    return 130


def _message(e: BaseException) -> str:
    """One line: the error's text, or for an OSError without one its strerror and file."""
    if isinstance(e, OSError) and e.filename is not None and not isinstance(e, MemoryError):
        return f"{e.filename}: {e.strerror or e}"
    return str(e) or type(e).__name__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mgg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")

    s = sub.add_parser("info", help="versions, backends and devices")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser(
        "partition", help="partition a graph: report the plans, or write a sharded dataset"
    )
    _graph_args(s)
    s.add_argument(
        "--np", type=_integer(1), default=None, help="number of ranks P (--distributed: the job's)"
    )
    s.add_argument("--ps", type=_integer(1), default=16, help="neighbor partition size")
    s.add_argument("--mode", choices=MODES, default="edges", help=BALANCE)
    s.add_argument("--no-transposed", action="store_true", help="skip the backward plans")
    s.add_argument("--out", help="write a sharded dataset to this folder (each rank opens its own)")
    s.add_argument("--model", default=None, help=PART_MODEL)
    s.add_argument("--force", action="store_true", help="replace --out if it exists")
    s.add_argument("--distributed", action="store_true", help=DISTRIBUTED)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_partition)

    s = sub.add_parser("check", help="verify every design against scipy and time it")
    _graph_args(s)
    s.add_argument("--dim", type=_integer(1), default=16, help="feature width D")
    s.add_argument("--op", default="sum", help="sum|mean|gcn|gin, or 'all'")
    s.add_argument("--ps", type=_integer(1), default=16, help="neighbor partition size")
    s.add_argument("--dist", type=_integer(1), default=4, help=DIST)
    s.add_argument("--designs", default="all", help="comma-separated design names, or 'all'")
    s.add_argument("--window", choices=["auto", *WINDOWS, "all"], default="auto", help=WINDOW)
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--mode", choices=["auto", "p2p", "get"], default="auto", help=REMOTE)
    s.add_argument("--repeat", type=_integer(1), default=5, help="timed runs per design (median)")
    s.add_argument("--outputs", help="rank 0 saves each output as DIR/DESIGN-OP-WINDOW.npy")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("tune", help="search ps, dist and wpb/threads for a graph and width")
    _graph_args(s)
    s.add_argument("--dim", type=_integer(1), default=16, help="feature width D")
    s.add_argument("--op", default="gcn", help="sum|mean|gcn|gin")
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--start", choices=["model", "origin"], default="model", help=START)
    s.add_argument(
        "--budget", type=_integer(1), default=15, help="most configurations measured (15)"
    )
    s.add_argument(
        "--repeat", type=_integer(1), default=3, help="fewest timed runs per configuration (3)"
    )
    s.add_argument(
        "--max-repeat", type=_integer(1), default=12, help="most timed runs per configuration (12)"
    )
    s.add_argument(
        "--precision",
        type=_number(0),
        default=0.03,
        help="wanted relative error of a configuration's median (0.03)",
    )
    s.add_argument(
        "--exhaustive", action="store_true", help="also measure the whole grid, on its own"
    )
    s.add_argument(
        "--grid-rounds", type=_integer(1), default=5, help="rounds over the grid (--exhaustive)"
    )
    s.add_argument("--confirm", type=_integer(0), default=5, help="rounds re-measuring the winners")
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

    s = sub.add_parser("convert", help="convert a graph or dataset between file formats")
    s.add_argument("input", help=CONVERT_IN)
    s.add_argument("output", help=CONVERT_OUT)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_convert)
    return p


def _train_args(s, dataset=None, epochs=200, eval_every=1):
    s.add_argument("--dataset", required=dataset is None, default=dataset, help=GRAPH + SHARDED)
    s.add_argument("--scale", type=_number(0), default=None, help="scale factor for stand-ins")
    s.add_argument("--model", default="gcn", help=MODEL)
    s.add_argument("--epochs", type=_integer(0), default=epochs, help="0: only evaluate")
    s.add_argument("--seed", type=_integer(0), default=0)
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
    s.add_argument("--hidden", type=_integer(1), default=None, help="default: the model's")
    s.add_argument("--layers", type=_integer(1), default=None, help="default: the model's")
    s.add_argument(
        "--heads", type=_integer(1), default=None, help="attention heads (gat; default 8)"
    )
    s.add_argument(
        "--input-dropout", type=_fraction, default=None, help="on the features (gin; default 0.9)"
    )
    s.add_argument("--dropout", type=_fraction, default=None, help="default: the model's")
    s.add_argument("--lr", type=_number(0), default=None, help="default: the model's")
    s.add_argument(
        "--weight-decay",
        type=_number(0, open_low=False),
        default=None,
        help="L2, default the model's (5e-4)",
    )
    s.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    s.add_argument("--row-normalize", action="store_true", help="feature rows sum to 1")
    s.add_argument("--ps", type=_integer(1), default=None, help="neighbor partition size (16)")
    s.add_argument("--dist", type=_integer(1), default=4, help=DIST)
    s.add_argument("--design", default="pipelined", help="pipelined|bulk_halo|direct (cpu)")
    s.add_argument("--split", choices=MODES, default=None, help=f"{BALANCE} (default edges)")
    s.add_argument("--window", choices=["auto", *WINDOWS], default="auto", help=WINDOW)
    s.add_argument("--eval-every", type=_integer(0), default=eval_every, help="0: only at the end")
    s.add_argument("--checkpoint-dir", default=None)
    s.add_argument(
        "--checkpoint-every", type=_integer(0), default=0, help="epochs between checkpoints"
    )
    s.add_argument("--resume", default=None, help="a checkpoint file to continue from")
    s.add_argument("--tune", action="store_true", help="search ps, dist, ... in the first epochs")
    s.add_argument(
        "--config", type=_config, help='a tuned configuration, e.g. \'{"ps": 32, "dist": 4}\''
    )
    s.add_argument("--check-sync", action="store_true", help="check weights agree every step")
    s.add_argument("--json", action="store_true")


def _graph_args(s):
    s.add_argument("graph", help=GRAPH + SHARDED)
    s.add_argument("--scale", type=_number(0), default=None, help="scale factor for stand-ins")
    s.add_argument("--seed", type=_integer(0), default=0)


def _integer(low: int):
    """argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def _number(low: float, open_low: bool = True):
    """argparse type: a finite number > low (>= low when not open_low)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if not np.isfinite(value) or value < low or (open_low and value == low):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'>' if open_low else '>='} {low:g}, got {text}"
            )
        return value

    return parse


def _fraction(text: str) -> float:
    """argparse type: a probability in [0, 1)."""
    value = _number(0, open_low=False)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text}")
    return value


def _config(text: str) -> dict:
    """argparse type: a JSON object of the tuner's knobs (mgg.distgraph.KNOBS)."""
    from .distgraph import check_config
    from .errors import InputError

    try:
        return check_config(json.loads(text))
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg}, column {e.colno}): {text}") from None
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_INPUT: list[str] = []  # the graphs this command opened, for its error messages


def open_dataset(spec: str, scale=None, seed: int = 0):
    """A Dataset from a spec, or a ShardedDataset for a folder written by --out."""
    from .partition.shards import ShardedDataset, is_sharded

    _INPUT.append(spec)

    if is_sharded(spec):
        return ShardedDataset(spec)
    from .graph.specs import resolve

    return resolve(spec, scale=scale, seed=seed)


def _load(args):
    return open_dataset(args.graph, args.scale, args.seed)


def _sizes(ds) -> tuple[int, int]:
    """Nodes and edges of the dataset as read (a sharded one's plans add GCN's self loops)."""
    g = getattr(ds, "graph", ds)
    source = getattr(ds, "manifest", {}).get("source", {})
    return g.num_nodes, source.get("num_edges", g.num_edges)


def _graph_kind(model: str | None, default: str) -> str:
    from .graph.core import GRAPH_KINDS

    if model is None:
        return default
    if model in GRAPH_KINDS:
        return model
    from .train import graph_kind

    return graph_kind(model)


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
    from .graph.core import job_graph
    from .memory import check_job
    from .partition import build_plan, plan_stats
    from .partition.shards import ShardedDataset, write_sharded

    if args.out and args.no_transposed:
        raise ValueError("--out writes shards to train on, which need the transposed plans")
    kind = _graph_kind(args.model, "gcn_norm" if args.out else "as_is")
    if args.distributed:
        return _partition_distributed(args, kind)
    if args.np is None:
        raise ValueError("--np P is required (the number of ranks to partition for)")
    t0 = time.perf_counter()
    ds = _load(args)
    if isinstance(ds, ShardedDataset):
        raise ValueError(f"{args.graph}: already a sharded dataset (partitioned for np={ds.np})")
    load_s = time.perf_counter() - t0
    mem = check_job(ds, args.np, "partition", source=args.graph)
    t0 = time.perf_counter()
    plans = build_plan(
        job_graph(ds.graph, kind),
        args.np,
        args.ps,
        mode=args.mode,
        transposed=not args.no_transposed,
    )
    stats = [q.stats() for q in plans]
    st = {**plan_stats(stats, time.perf_counter() - t0), "graph": ds.name, "kind": kind}
    st["load_seconds"] = load_s
    if args.out:
        t0 = time.perf_counter()
        rows = [ds.rows(p.lb, p.ub, args.seed) for p in plans]
        source = {**_source(args), "num_edges": ds.graph.num_edges}
        write_sharded(args.out, plans, rows, kind, source, force=args.force)
        st.update(out=args.out, write_seconds=time.perf_counter() - t0)
    st["peak_rss_mb"] = [peak_rss_mb()]
    st["memory_estimate_mb"] = mem
    _report_partition(args, st, stats)
    return 0


def _source(args) -> dict:
    from .graph.formats.slices import source_checksum

    if os.path.exists(args.graph) or os.path.exists(args.graph + "_beg_pos.bin"):
        return source_checksum(args.graph)
    return {"spec": args.graph, "scale": args.scale, "seed": args.seed}


def _partition_distributed(args, kind: str) -> int:
    from .backend import get_backend
    from .graph.dataset import check_train_selects
    from .graph.formats.slices import read_edge_slice, read_node_rows
    from .partition import plan_stats
    from .partition.distributed import build_plan_distributed
    from .partition.shards import begin, commit, node_info, plan_info, write_shard
    from .progress import progress

    comm = get_backend("cpu").comm()  # first: from here on a failing rank aborts the job
    _INPUT.append(args.graph)
    if args.np is not None and args.np != comm.size:
        raise ValueError(
            f"--np {args.np} but the job has {comm.size} ranks: --distributed partitions for "
            "the job's ranks (mggrun -np P)"
        )
    if not (os.path.isfile(args.graph) or os.path.isfile(args.graph + "_beg_pos.bin")):
        raise ValueError(
            f"{args.graph}: --distributed reads a file (edge list, MGG binary CSR or .npz); "
            "generators and folders are partitioned in one process (drop --distributed)"
        )
    bar = progress(total=4 if args.out else 3, desc="partition")
    with bar:
        bar.set_postfix_str("read slices")
        t0 = time.perf_counter()
        part = read_edge_slice(args.graph, comm.rank, comm.size)
        load_s = comm.allreduce(np.array([time.perf_counter() - t0]), "max")[0]
        source_edges = int(comm.allreduce(np.array([len(part.src)]), "sum")[0])
        bar.update()
        bar.set_postfix_str("exchange edges, build plans")
        t0 = time.perf_counter()
        plan = build_plan_distributed(
            part, comm, args.ps, kind=kind, mode=args.mode, transposed=not args.no_transposed
        )
        del part
        plan_s = comm.allreduce(np.array([time.perf_counter() - t0]), "max")[0]
        bar.update()
        bar.set_postfix_str("node data")
        stats = comm.allgather(plan.stats())
        rows = read_node_rows(args.graph, plan.lb, plan.ub, args.seed)
        if rows.masks is not None:  # each rank checked its rows; emptiness is the job's
            check_train_selects(args.graph, comm.allreduce(rows.masks[0].sum(keepdims=True))[0])
        st = {**plan_stats(stats, plan_s), "graph": rows.name, "kind": kind}
        st["load_seconds"] = load_s
        bar.update()
        if args.out:
            bar.set_postfix_str("write shards")
            t0 = time.perf_counter()
            tmp_run = begin(args.out, args.force) if comm.rank == 0 else None
            tmp, run = comm.bcast(tmp_run)
            tables = comm.gather(write_shard(tmp, run, plan, rows))
            infos = comm.gather(plan_info(plan))
            if comm.rank == 0:
                source = {**_source(args), "num_edges": source_edges}
                info = {"graph_kind": kind, "source": source, **node_info(rows)}
                commit(args.out, tmp, run, infos, tables, info, args.force)
            comm.barrier()
            st.update(out=args.out, write_seconds=time.perf_counter() - t0)
            bar.update()
    st["peak_rss_mb"] = comm.allgather(peak_rss_mb())
    if comm.rank == 0:
        _report_partition(args, st, stats)
    return 0


def _report_partition(args, st, stats) -> None:
    if not _quiet(args):
        print(
            f"{st['graph']} ({st['kind']}): {st['num_nodes']:,} nodes, {st['num_edges']:,} "
            f"edges, P={st['np']}, ps={st['ps']}; plans {st['plan_seconds']:.3f} s "
            f"(load {st['load_seconds']:.2f} s)"
        )
        rows = [
            [s["rank"], f"[{s['lb']}, {s['ub']})", s["nodes"]]
            + [s["local_edges"] + s["remote_edges"]]
            + [s[k] for k in ("local_edges", "remote_edges", "halo_rows", "lnp", "rnp")]
            + [s["digest"][:12]]
            for s in stats
        ]
        heads = ["rank", "range", "nodes", "edges", "local", "remote", "halo rows", "LNP", "RNP"]
        print(format_table(rows, heads + ["fingerprint"]))
        print(
            f"imbalance (max/mean edges) {st['imbalance']:.3f} · remote fraction "
            f"{st['remote_fraction']:.3f} · remote rows fetched once: {st['halo_rows']:,} of "
            f"{st['remote_edges']:,} remote edges ({st['dedup_saving']:.2f}x fewer)"
        )
        if "out" in st:
            print(f"sharded dataset written to {st['out']}/ in {st['write_seconds']:.2f} s")
    if args.json:
        print(json.dumps(st))


# ---- check -------------------------------------------------------------------------------
def cmd_check(args) -> int:
    from .backend import get_backend
    from .designs.check import check
    from .kernels import OPS
    from .memory import check_job

    if args.mode != "auto" and args.backend != "cuda":
        raise ValueError("--mode chooses how the CUDA kernel reads peers: use --backend cuda")
    backend = get_backend(args.backend)
    comm = backend.comm(mode=args.mode)  # first: from here on a failing rank aborts the job
    ds = _load(args)
    mem = check_job(ds, comm.size, "check", source=args.graph, dim=args.dim)
    result = check(
        ds,
        backend,
        comm,
        ops=list(OPS) if args.op == "all" else args.op.split(","),
        names=None if args.designs == "all" else args.designs.split(","),
        windows=[args.window],
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
            n, e = _sizes(ds)
            print(
                f"{ds.name}: {n:,} nodes, {e:,} edges, "
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
            print(json.dumps({**result, "memory_estimate_mb": mem}))
    return 0 if all(d["ok"] for d in result["designs"].values()) else 1


# ---- tune --------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    from .backend import get_backend
    from .errors import InputError
    from .tuner.search import Protocol
    from .tuner.tune import report_folder, tune, write_report

    backend = get_backend(args.backend)
    comm = backend.comm()  # first: from here on a failing rank aborts the job
    if comm.rank == 0:
        report_folder(args.out)
    if args.repeat > args.max_repeat:
        raise InputError(f"--repeat {args.repeat} is more than --max-repeat {args.max_repeat}")
    if args.precision >= 1:
        raise InputError(f"--precision is a relative error below 1, got {args.precision}")
    res = tune(
        _load(args),
        backend,
        comm,
        dim=args.dim,
        op=args.op,
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
    )
    if comm.rank != 0:
        return 0
    _, png = write_report(res, args.out)
    res.pop("table")
    res["heatmaps"] = str(png)
    if not _quiet(args):
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
            f"{grid}\ntrace and heatmaps in {args.out}/"
        )
    if args.json:
        print(json.dumps(res))
    return 0


# ---- train -------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from .arrays import is_sparse
    from .backend import get_backend
    from .memory import check_job
    from .torch import MODELS, build_model
    from .train import Trainer, build_optimizer, metric, prepare

    backend = get_backend(args.backend)
    comm = backend.comm(window=args.window)  # first: a failing rank now aborts the job
    lead = comm.rank == 0
    if args.model not in MODELS:
        raise ValueError(f"unknown model {args.model!r}; choose one of {', '.join(MODELS)}")
    t0 = time.perf_counter()
    ds = open_dataset(args.dataset, args.scale, args.seed)
    mem = check_job(ds, comm.size, "train", source=args.dataset, model=MODELS[args.model],
                    hidden=args.hidden, layers=args.layers, heads=args.heads)  # fmt: skip
    num_nodes, num_edges = _sizes(ds)
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
        split=args.split,
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
            f"{ds.name}: {num_nodes:,} nodes, {num_edges:,} edges, "
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
        config=args.config,
        check_sync=args.check_sync,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        log=say,
    )
    if args.resume:
        trainer.load_checkpoint(args.resume, epochs=args.epochs)
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
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "setup_s": setup_s,
        **summary,
        "notes": data.notes,
        "peak_rss_mb": comm.allgather(peak_rss_mb()),
        "memory_estimate_mb": mem,
    }
    if say:
        peer = result["bytes_per_epoch"]
        epoch = result["epoch_time_s"]
        say(
            f"final: train {metric(result['train_acc'])}  val {metric(result['val_acc'])}  "
            f"test {metric(result['test_acc'])}"
            + (f"  ·  median epoch {epoch * 1e3:.1f} ms" if epoch is not None else "")
            + (f"  ·  peer rows per epoch {peer / 1e6:.1f} MB" if peer is not None else "")
        )
    if lead and args.json:
        print(json.dumps(result))
    return 0


# ---- convert -----------------------------------------------------------------------------


def cmd_convert(args) -> int:
    import warnings

    from .graph.formats import check_folder, dropped_on_write, format_name, write_graph
    from .graph.specs import resolve

    check_folder(args.output)
    if all(map(os.path.exists, (args.input, args.output))) and os.path.samefile(
        args.input, args.output
    ):
        raise ValueError(f"{args.output}: is the input itself: write to another path")
    t0 = time.perf_counter()
    ds = resolve(args.input)
    lost = dropped_on_write(ds, args.output)
    if lost:
        print(
            f"mgg convert: warning: {args.output} ({format_name(args.output)}) cannot hold "
            f"the {', '.join(lost)} of {args.input}: dropped",
            file=sys.stderr,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what is dropped was reported above
        write_graph(ds, args.output)
    res = {
        "in": args.input,
        "out": args.output,
        "num_nodes": ds.graph.num_nodes,
        "num_edges": ds.graph.num_edges,
        "seconds": time.perf_counter() - t0,
    }
    if not _quiet(args):
        print(
            f"{args.input} -> {args.output} ({format_name(args.output)}): "
            f"{res['num_nodes']:,} nodes, {res['num_edges']:,} edges in {res['seconds']:.2f} s"
        )
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
