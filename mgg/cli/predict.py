"""`mgg predict`: every node's class and probabilities from a model that `mgg train
--save` wrote, full-graph at any rank count (launch with mggrun); `mgg embed` (its twin
in cli/embed.py) writes a layer's output instead. Both write by original node id
(mgg.infer) and report the model's scores on the dataset's splits."""

from __future__ import annotations

import time

from .common import (
    CONFIG,
    GRAPH,
    SHARDED,
    config,
    emit,
    job_args,
    knob_args,
    knobs_of,
    open_dataset,
    order_file_arg,
    quiet,
    scale_arg,
)

KNOBS = ("ps", "dist", "wpb", "threads", "window", "split", "remote", "dtype", "order")
WHAT = {"predict": "pred.npy (classes) and prob.npy", "embed": "emb.npy"}


def add(sub):
    s = sub.add_parser(
        "predict", help="every node's class and probabilities from a saved model (mggrun)"
    )
    inference_args(s, "predict")
    return s


def inference_args(s, what: str) -> None:
    """The flags of `mgg predict` and `mgg embed`."""
    s.add_argument("--model", required=True, help="a folder written by mgg train --save")
    s.add_argument("--dataset", required=True, help=GRAPH + SHARDED + " (the model's data)")
    s.add_argument(
        "--out", required=True, help=f"a new folder: {WHAT[what]} by node id, manifest.json"
    )
    scale_arg(s)
    job_args(s, what)
    knob_args(s, KNOBS)
    order_file_arg(s)
    s.add_argument("--config", type=config, default=None, help=CONFIG)
    s.add_argument("--json", action="store_true")


def main(args) -> int:
    import torch

    from ..atomic import check_paths
    from ..backend import get_backend
    from ..checkpoint import check_data
    from ..errors import ModelError
    from ..graph.specs import dataset_source
    from ..infer import check_target, embeddings, predictions, write_output
    from ..knobs import Knobs
    from ..memory import peak_rss_mb
    from ..metrics import metric
    from ..partition.shards import ShardedDataset
    from ..prepare import prepare
    from ..progress import progress
    from ..torch import load_model
    from ..torch.saved import INFO
    from ..train import Trainer

    embed = args.command == "embed"
    backend = get_backend(args.backend)
    design = backend.design(args.design).name
    knobs = knobs_of(args, backend.takes(design), backend.job(design))
    comm = backend.comm(knobs)
    lead = comm.rank == 0
    check_paths(  # before any work: an empty --out, or one inside the model or the data
        {"--out": args.out},
        {"--model": args.model, "--dataset": args.dataset, "--order-file": args.order_file},
        new=("--out",),
    )
    check_target(args.out)  # before any work
    bar = progress(total=4, desc=args.command, unit="step")
    times = {}
    t0 = time.perf_counter()
    model = load_model(args.model, comm)
    saved, cfg = model.saved, model.config
    info = f"{args.model}/{INFO}"
    layers = cfg["num_layers"]
    layer = getattr(args, "layer", None)
    if embed:
        layer = max(layers - 1, 1) if layer is None else layer
        if not 1 <= layer <= layers:
            raise ValueError(f"--layer {layer}: the model has layers 1..{layers}")
    if "dtype" not in knobs.given and saved.get("dtype"):  # as it was trained
        knobs = Knobs.parse({"dtype": saved["dtype"]}, base=knobs)
    times["load_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    bar.update()
    trained_on = saved.get("data") or {}
    ds = open_dataset(args.dataset, args.scale, cfg.get("seed", 0))
    dg, data = prepare(
        ds,
        comm,
        cfg["model"],
        knobs=knobs,
        seed=cfg.get("seed", 0),
        row_normalize=bool(trained_on.get("row_normalize")),
        design=design,
        backend=backend,
        source=None
        if isinstance(ds, ShardedDataset)
        else dataset_source(args.dataset, args.scale, cfg.get("seed", 0)),
        order_file=args.order_file,
    )
    check_data(info, saved, data.identity, what="model", use="use it")
    for what, mine, theirs in (
        ("features", data.num_features, cfg["in_dim"]),
        ("classes", data.num_classes, cfg["out_dim"]),
    ):
        if mine != theirs:
            raise ModelError(f"{info}: the model takes {theirs} {what}; {ds.name} has {mine}")
    model = model.to(data.y.device)
    times["prepare_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    bar.update()
    with torch.no_grad():
        out = model(data.x, dg, upto=layer if embed else None)
    trainer = Trainer(dg, data, model, None, eval_every=0)
    # the logits (predict, or embed's last layer) scored as mgg train scored them
    scores = trainer.evaluate(out) if not embed or layer == layers else {}
    rows = embeddings(out) if embed else predictions(out, trainer.multilabel)
    times["forward_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    bar.update()
    manifest = {
        "what": args.command,
        "model": str(args.model),
        "model_digest": saved.get("digest"),
        "dataset": ds.name,
        **({"metric": trainer.metric} if scores else {}),
        **{k: scores[k] for k in ("train_acc", "val_acc", "test_acc") if scores},
        **({"layer": layer} if embed else {}),
        **({"dtypes": {"emb": "bfloat16"}} if embed and rows["emb"].dtype.name == "uint16" else {}),
    }
    written = write_output(args.out, rows, data.node_ids, dg.plan.num_nodes, manifest, comm)
    times["write_s"] = time.perf_counter() - t0
    bar.update()
    bar.close()
    dg.free()
    total = sum(times.values())
    result = {
        "command": args.command,
        "out": str(args.out),
        "np": comm.size,
        **{k: v for k, v in written.items() if k not in ("format", "version")},
        **times,
        "nodes_per_s": dg.plan.num_nodes / max(times["forward_s"], 1e-9),
        "seconds": total,
        "peak_rss_mb": comm.allgather(peak_rss_mb()),
    }
    if lead and not quiet(args):
        files = ", ".join(f"{k} {v['shape']}" for k, v in written["files"].items())
        print(
            f"{args.out}: {files} for {dg.plan.num_nodes:,} nodes on {comm.size} rank(s) in "
            f"{total:.1f} s (forward {times['forward_s']:.2f} s)"
            + (
                f"; train {metric(scores['train_acc'])}  val {metric(scores['val_acc'])}  "
                f"test {metric(scores['test_acc'])}"
                if scores
                else ""
            )
        )
    if lead:
        emit(args, result)
    return 0
