"""`mgg train`: full-graph training of a registered model (mgg.train), launched with
mggrun; per-epoch progress, the final metrics, and ``--json``'s summary."""

from __future__ import annotations

import sys
import time
import warnings

from ..memory import peak_rss_mb, reset_peak_rss
from .common import (
    CONFIG,
    GRAPH,
    SHARDED,
    config,
    device_memory_arg,
    device_plan,
    emit,
    integer,
    job_args,
    job_of,
    knob_args,
    knobs_of,
    open_dataset,
    order_file_arg,
    quiet,
    scale_arg,
    sizes,
)

KNOBS = ("ps", "dist", "wpb", "threads", "window", "split", "remote", "dtype", "order")


DEVICE_MEMORY = (
    "a rank's device memory to plan against (default on cuda: the GPU's): dense input "
    "features that do not fit beside the rest stay in host memory and stream through the "
    "device in chunks (refused, naming what would fit, when even that does not fit); on "
    "cpu, a simulated device of this size"
)


def add(sub):
    s = sub.add_parser("train", help="full-graph GCN/SAGE/GIN/GAT training (launch with mggrun)")
    train_args(s)
    return s


def train_args(s, dataset=None, epochs=200, eval_every=1) -> None:
    """The flags of `mgg train` (and of `mgg demo`, with its defaults)."""
    s.add_argument("--dataset", required=dataset is None, default=dataset, help=GRAPH + SHARDED)
    scale_arg(s)
    s.add_argument("--epochs", type=integer(0), default=epochs, help="0: only evaluate")
    s.add_argument("--seed", type=integer(0), default=0)
    job_args(s, "train")
    device_memory_arg(s, DEVICE_MEMORY)
    knob_args(s, KNOBS)
    order_file_arg(s)
    s.add_argument("--config", type=config, default=None, help=CONFIG)
    s.add_argument(
        "--tune",
        action="store_true",
        help="search ps, dist, ... in the first epochs (those --config or a flag sets are held)",
    )
    s.add_argument("--eval-every", type=integer(0), default=eval_every, help="0: only at the end")
    s.add_argument(
        "--checkpoint-dir",
        default=None,
        help="write checkpoints here: every --checkpoint-every epochs and after the last",
    )
    s.add_argument(
        "--checkpoint-every",
        type=integer(0),
        default=0,
        help="epochs between checkpoints (0: only after the last)",
    )
    s.add_argument("--resume", default=None, help="a checkpoint file to continue from")
    s.add_argument(
        "--save",
        default=None,
        help="write the trained model (at the selected epoch) to this new folder, for mgg "
        "predict/embed and mgg.torch.load_model",
    )
    s.add_argument(
        "--select",
        default=None,
        help="best-val|last: the weights the run ends with, reports and saves (default "
        "best-val where a validation split exists)",
    )
    s.add_argument(
        "--patience",
        type=integer(0),
        default=0,
        help="stop once this many epochs passed without a better validation score (0: never)",
    )
    s.add_argument(
        "--log-dir",
        default=None,
        help="write each epoch's metrics (metrics.jsonl, a TensorBoard event file) and at "
        "the end curves.png here",
    )
    s.add_argument("--check-sync", action="store_true", help="check weights agree every step")
    s.add_argument(
        "--cuda-graph",
        action="store_true",
        help="on one GPU, capture the training step as a CUDA graph after a few eager steps "
        "and replay it (no host work per step)",
    )
    s.add_argument("--json", action="store_true")


def main(args) -> int:
    from ..arrays import is_sparse
    from ..atomic import check_paths
    from ..backend import get_backend
    from ..footprint import check_host, checked_estimate, job_kw
    from ..footprint import planned as planned_job
    from ..graph.specs import dataset_source
    from ..memory import available, format_bytes, pss_mb, usable_words
    from ..metrics import metric
    from ..partition.shards import ShardedDataset
    from ..prepare import prepare
    from ..process import fit_allocator
    from ..torch.saved import check_target
    from ..train import Trainer

    backend = get_backend(args.backend)
    design = backend.design(args.design).name  # an unknown design: refused before MPI
    knobs = knobs_of(args, backend.takes(design), backend.job(design))
    comm = backend.comm(knobs)  # first: a failing rank now aborts the job
    lead = comm.rank == 0
    check_paths(  # before any work: empty or clashing --save, --log-dir, ...
        {"--save": args.save, "--log-dir": args.log_dir, "--checkpoint-dir": args.checkpoint_dir},
        {"--dataset": args.dataset, "--resume": args.resume, "--order-file": args.order_file},
        new=("--save",),
    )
    if args.save:
        check_target(args.save)  # before the run, not after it
    job = job_of(args, knobs, "train")
    t0 = time.perf_counter()
    ds = open_dataset(args.dataset, args.scale, args.seed)
    kw = job_kw(job, order="file" if args.order_file else None)
    if isinstance(ds, ShardedDataset):  # the largest rank's rows of its split
        bounds = ds.manifest["bounds"]
        kw["rows"] = max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
    device = None
    if backend.gpu:  # the host holds the data, the plan and what is offloaded; the GPU the run
        device = device_plan(args, ds, comm.size, "train", kw)
        planned = check_host(device, args.dataset, f"mgg train on {comm.size} rank(s)")
    else:
        planned = checked_estimate(ds, comm.size, "train", source=args.dataset, **kw)
        if args.device_memory is not None:
            device = device_plan(args, ds, comm.size, "train", kw)
    fit_allocator(planned.returns_freed)
    job = planned_job(job, device, comm.rank)
    num_nodes, num_edges = sizes(ds)
    source = None
    if not isinstance(ds, ShardedDataset):
        source = dataset_source(args.dataset, args.scale, args.seed)
    dg, data = prepare(ds, comm, job, seed=args.seed, source=source, order_file=args.order_file)
    setup_s = time.perf_counter() - t0
    model = job.build_model(data.num_features, data.num_classes, args.seed).to(data.y.device)
    opt = job.build_optimizer(model)
    say = print if lead and not quiet(args) else None
    if say:
        say(
            f"{ds.name}: {num_nodes:,} nodes, {num_edges:,} edges, "
            f"{data.num_features} features{' (sparse)' if is_sparse(data.x) else ''}, "
            f"{data.num_classes} classes; {job.model.upper()} on {comm.size} rank(s); "
            f"setup {setup_s:.1f} s{'; ' + data.notes if data.notes else ''}"
        )
        big = sorted((v, k) for k, v in planned.items() if k not in ("total", "baseline"))[-3:]
        have, how = available()
        say(
            f"memory plan per rank: {format_bytes(planned['total'])} ("
            + ", ".join(f"{k} {format_bytes(v)}" for v, k in reversed(big))
            + f") of {usable_words(have, how)}; mgg plan has every part"
        )
        if device:
            big = max(device["per_rank"], key=lambda r: r["device"]["total_bytes"])["device"]
            say(
                f"device plan per rank: {format_bytes(big['total_bytes'])} of "
                + usable_words(device["budget"]["device"], device["budget_how"])
                + ("; activations kept in host memory" if big.get("offload") else "")
            )
    trainer = Trainer(
        dg,
        data,
        model,
        opt,
        tune=args.tune,
        check_sync=args.check_sync,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        select=args.select,
        patience=args.patience,
        log_dir=args.log_dir,
        log=say,
        cuda_graph=args.cuda_graph,
        output_rows=job.output_rows,
    )
    if args.resume:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.load_checkpoint(args.resume, epochs=args.epochs)
        for w in caught:  # e.g. a checkpoint that does not record its data
            print(f"mgg {args.command}: warning: {w.message}", file=sys.stderr)
        if say:
            say(f"resumed from {args.resume} at epoch {trainer.epoch}")
    setup_peak = peak_rss_mb()
    own = reset_peak_rss()  # training's own peak, apart from the setup's
    trainer.fit(args.epochs)
    fit_peak = peak_rss_mb() if own else None  # before the final evaluation
    summary = trainer.summary()
    if args.save:
        trainer.save_model(args.save)
    dg.free()
    result = {
        "model": job.model,
        "dataset": ds.name,
        "np": comm.size,
        "epochs": args.epochs,
        "dtype": dg.knobs.dtype,
        "output_rows": job.output_rows,
        "order": data.order,
        "order_seconds": data.order_seconds,
        "num_nodes": num_nodes,
        "num_edges": num_edges,
        "setup_s": setup_s,
        **summary,
        "saved": args.save,
        "notes": data.notes,
        "peak_rss_mb": comm.allgather(max(setup_peak, fit_peak or 0, peak_rss_mb())),
        "fit_peak_rss_mb": comm.allgather(fit_peak),
        "memory_estimate_mb": round(planned["total"] / 2**20, 1),
        "planned_bytes": int(planned["total"]),
        "planned_device_bytes": _most(device, "total_bytes"),
        "stream_rows": _most(device, "stream_rows"),
        "offload": job.offload,
        "offloaded_bytes": comm.allgather(model.offloaded.bytes if model.offloaded else None),
        "pss_mb": comm.allgather(pss_mb()),
        "peak_device_bytes": comm.allgather(backend.peak_device_bytes(comm)),
    }
    result["peak_bytes"] = int(max(result["peak_rss_mb"]) * 2**20)  # the largest rank's
    if say:
        peer, epoch = result["bytes_per_epoch"], result["epoch_time_s"]
        say(
            f"final: train {metric(result['train_acc'])}  val {metric(result['val_acc'])}  "
            f"test {metric(result['test_acc'])}"
            + (
                f"  (epoch {result['selected_epoch']}, best validation)"
                if result["select"] == "best-val"
                else ""
            )
            + (f"  ·  median epoch {epoch * 1e3:.1f} ms" if epoch is not None else "")
            + (f"  ·  peer rows per epoch {peer / 1e6:.1f} MB" if peer is not None else "")
        )
    if lead:
        emit(args, result)
    return 0


def _most(device: dict | None, key: str):
    """The largest rank's ``key`` of the device plan (None without one or where no rank has it)."""
    values = [r["device"][key] for r in (device or {}).get("per_rank", ()) if key in r["device"]]
    return max(values) if values else None
