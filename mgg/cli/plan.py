"""`mgg plan`: what a job will hold per rank, part by part, on the host and (``--backend
cuda``) on each GPU, against what a rank has, before anything is allocated; whether it
fits (within ``memory.usable``: all but ``memory.HEADROOM`` of a budget), and what would
make it fit. Generated graphs (papers100m, stand-ins) and sharded datasets are planned
from their counts alone; other inputs are read first."""

from __future__ import annotations

from ..knobs import flag_help
from .common import (
    DEVICE_DEFAULT,
    device_budget,
    device_memory_arg,
    emit,
    format_table,
    graph_args,
    integer,
    job_args,
    job_of,
    knob_type,
    knobs_of,
    open_dataset,
    quiet,
    size,
)

COMMANDS = ("train", "check", "partition")


def add(sub):
    s = sub.add_parser("plan", help="a job's memory per rank, part by part, before it runs")
    graph_args(s)
    s.add_argument("--np", type=integer(1), default=1, help="ranks P of the job")
    s.add_argument(
        "--command", dest="job", choices=COMMANDS, default="train", help="the job to plan"
    )
    job_args(s, "plan")
    s.add_argument("--dim", type=integer(1), default=16, help="check's width D")
    s.add_argument("--dtype", type=knob_type("dtype"), default=None, help=flag_help("dtype"))
    s.add_argument("--order", type=knob_type("order"), default=None, help=flag_help("order"))
    s.add_argument(
        "--ranks-per-node",
        type=integer(1),
        default=None,
        help="ranks sharing this host's memory (default: all P)",
    )
    s.add_argument(
        "--host-memory", type=size, default=None, help="a rank's host memory (default: measured)"
    )
    device_memory_arg(s, f"a rank's GPU memory (default: the GPU's, else {DEVICE_DEFAULT})")
    s.add_argument(
        "--sharded",
        action="store_true",
        help="the job reads its shards (mgg partition --out; a sharded folder is)",
    )
    s.add_argument("--json", action="store_true")
    return s


def main(args) -> int:
    from ..backend import get_backend
    from ..footprint import job_kw, plan
    from ..graph.facts import job_facts
    from ..graph.specs import spec_facts
    from ..job import check_ranks
    from ..partition.shards import ShardedDataset

    check_ranks(args.np)  # before any loop over the ranks
    backend = get_backend(args.backend)  # the knobs as train takes them
    design = backend.design(args.design).name
    job = job_of(args, knobs_of(args, backend.takes(design), backend.job(design)), "plan")
    facts = spec_facts(args.graph, args.scale, args.seed)
    bounds = None
    if facts is None:
        ds = open_dataset(args.graph, args.scale, args.seed)
        if isinstance(ds, ShardedDataset):
            if ds.np != args.np:
                raise ValueError(f"{args.graph}: partitioned for {ds.np} ranks, not --np {args.np}")
            bounds = ds.manifest["bounds"]
        name, facts = ds.name, ds
    else:
        name = facts["name"]
    if args.sharded:
        facts = {**job_facts(facts), "sharded": True}
    budget, how = _budget(args, args.np)
    if args.job == "train":
        kw = job_kw(job)
    else:
        kw = dict(dim=args.dim, dtype=job.dtype, order=job.knobs.order, backend=job.backend)
    out = plan(
        facts,
        args.np,
        args.job,
        budget=budget,
        device=args.backend == "cuda",
        bounds=bounds,
        budget_of=lambda p: _budget(args, p)[0],
        **kw,
    )
    out.update(graph=name, backend=args.backend, budget_how=how)
    if not quiet(args):
        _print(args, out)
    emit(args, out)
    return 0


def _budget(args, ranks: int) -> tuple[dict, dict]:
    """(bytes a rank of a ``ranks``-rank job has: host, and device for cuda; how each was
    found): the ranks on this node (--ranks-per-node, else all) share its memory and GPUs,
    so a --np fix is planned against its own, smaller share."""
    from ..memory import available, parse_size

    local = min(args.ranks_per_node or ranks, ranks)
    if args.host_memory is not None:
        host, host_how = parse_size(args.host_memory), f"--host-memory {args.host_memory}"
    else:
        host, host_how = available(local)
    budget, how = {"host": host}, {"host": host_how}
    if args.backend == "cuda":
        ranks = local
        budget["device"], how["device"] = device_budget(args.device_memory, DEVICE_DEFAULT, ranks)
    return budget, how


def _print(args, out: dict) -> None:
    from ..memory import format_bytes, usable_words

    big = max(out["per_rank"], key=lambda r: r["total_bytes"])
    gpu = "device" in big
    names = list(big["parts"]) + [
        k for k in big.get("device", {}).get("parts", {}) if k not in big["parts"]
    ]
    rows = []
    for k in names:
        row = [k, format_bytes(big["parts"].get(k, 0))]
        if gpu:
            row.append(format_bytes(big["device"]["parts"].get(k, 0)))
        rows.append(row)
    total = ["peak" if not gpu else "total", format_bytes(big["total_bytes"])]
    has = ["a rank has", format_bytes(out["budget"]["host"])]
    use = [f"usable ({1 - out['headroom']:.0%})", format_bytes(out["usable"]["host"])]
    if gpu:
        total.append(format_bytes(big["device"]["total_bytes"]))
        has.append(format_bytes(out["budget"]["device"]))
        use.append(format_bytes(out["usable"]["device"]))
    heads = ["part", "host"] + (["GPU"] if gpu else [])
    print(
        f"{out['graph']}: mgg {out['command']} on {out['np']} rank(s) ({out['backend']}); "
        f"rank {big['rank']} of {out['np']}, {big['rows']:,} node rows, the largest:"
    )
    print(format_table([*rows, total, has, use], heads))
    print(
        "budget: "
        + "; ".join(f"{k} from {v}" for k, v in out["budget_how"].items())
        + f"; a plan fits within {1 - out['headroom']:.0%} of it, {out['headroom']:.0%} kept "
        "for what no estimate counts (fragmentation, the CUDA context, NCCL/NVSHMEM heaps)"
    )
    for key, side in (("host", "host"), ("device", "GPU")):
        if out["fits"] or key not in out["budget"]:
            continue
        need = max(
            r["total_bytes"] if key == "host" else r[key]["total_bytes"] for r in out["per_rank"]
        )
        if need > out["usable"][key]:
            has = usable_words(out["budget"][key], out["budget_how"][key])
            print(f"a rank's {side} needs {format_bytes(need)} but has {has}")
    chunk = big.get("device", {}).get("stream_rows")
    off = " and the activations kept there" if big.get("device", {}).get("offload") else ""
    if out["fits"] and chunk:
        print(f"fits, the input features streamed from host memory {chunk:,} rows at a time{off}")
    elif out["fits"] and off:
        print("fits, the activations kept in host memory")
    elif out["fits"]:
        print("fits")
    elif out["fixes"]:
        print(f"does not fit; it would with {' or '.join(out['fixes'])}")
    else:
        print("does not fit, and no single change (bfloat16, fewer hidden units, more ranks) fits")
