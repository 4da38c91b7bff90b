"""papers100M-class on one GPU machine (issue 59): the `papers100m` stand-in drawn,
partitioned and trained in one process from memory (no shards, no files), or (--shards)
drawn and partitioned by the ranks into shards, then trained from them; the preparation,
the first epoch and the others timed apart, and the peak device memory against the plan.

    python bench/gpu/papers_gpu.py [--scale 1] [--models gcn] [--hidden 128,64] [--layers 2]
                                   [--epochs 3] [--device-memory SIZE] [--flags "..."]
                                   [--backend cuda|cpu] [--shards [--pes 1,2] [--work DIR]]

In memory (the default), per model: `mgg plan papers100m:scale=S --np 1 --backend cuda`
with the training flags (what the plan says of the GPU: fits, streamed rows, offload),
for each ``--hidden`` in turn until one fits (the last if none does), then
`mggrun -np 1 mgg train --dataset papers100m:scale=S --model M --layers L --hidden H
--dtype bfloat16 --output-rows labeled --epochs E --eval-every 0 --json`: its setup_s is
the generation and partition (the graph drawn, the plan built, the features drawn in
bf16: the time to the first epoch). ``--device-memory 80G``: both under an H100's budget
(the features streamed, activations offloaded where the plan says). ``--shards``: the
earlier protocol, `mggrun -np P mgg partition ... --out DIR --distributed` then training
from DIR. Rows: `graph`, `scale`, `model`, `hidden`, `mode`, `pes`, `device_memory`, `prepare_s`
(setup_s, or the partition's wall seconds with --shards), `train_wall_s`, `first_epoch_s`,
`epoch_s`, `peak_device_bytes` (largest PE), `planned_device_bytes`, `stream_rows`,
`offload`, `fits`, `peak_rss_mb`, `test_acc`, `refused`. `--backend cpu` is a smoke run
of the same commands (`--scale 0.001`: well under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import RESULTS, ROOT, csv_list, write_results  # noqa: E402

COLUMNS = ["model", "hidden", "mode", "pes", "device_memory", "prepare_s", "first_epoch_s",
           "epoch_s", "peak_device_bytes", "planned_device_bytes", "stream_rows", "offload", "fits",
           "peak_rss_mb", "test_acc", "refused"]  # fmt: skip


def mggrun(p: int, *argv) -> tuple[int, dict | None, str]:
    """(exit status, the last JSON line or None, stderr's tail) of `mggrun -np P ARGV`."""
    cmd = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(p), *map(str, argv)]
    print("$ " + " ".join(cmd[2:]), flush=True)
    r = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    return r.returncode, json.loads(lines[-1]) if lines else None, r.stderr.strip()[-2000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--models", default="gcn")
    ap.add_argument("--hidden", default="128,64", help="the first the plan fits, in order")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--device-memory", default=None, help="a GPU budget for plan and train")
    ap.add_argument("--flags", default="--output-rows labeled", help="more mgg train flags")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shards", action="store_true", help="partition into shards first")
    ap.add_argument("--pes", default="1", help="with --shards: the rank counts")
    ap.add_argument("--work", default="/tmp/mgg-papers-gpu", help="with --shards: where")
    args = ap.parse_args()
    if not args.scale > 0:
        raise SystemExit(f"papers_gpu: --scale must be > 0, got {args.scale:g}")
    if args.epochs < 1:
        raise SystemExit(f"papers_gpu: --epochs must be >= 1, got {args.epochs}")
    pes = csv_list(args.pes, cast=int)
    args.hiddens = csv_list(args.hidden, cast=int)
    if not args.hiddens or min(args.hiddens) < 1:
        raise SystemExit(f"papers_gpu: --hidden must be positive widths, got {args.hidden!r}")
    if not args.shards and pes != [1]:
        raise SystemExit("papers_gpu: --pes: the in-memory job is one process; add --shards")
    rows = []
    for p in pes:
        for model in csv_list(args.models, allowed=["gcn", "sage", "gin", "gat"]):
            row = sharded(args, p, model) if args.shards else in_memory(args, model)
            rows.append(row)
            print(json.dumps(row), flush=True)
            write(args, rows)
    return 0


def train_flags(args, model: str, hidden: int) -> list:
    out = ["--model", model, "--layers", args.layers, "--hidden", hidden]
    out += ["--dtype", "bfloat16", *shlex.split(args.flags)]
    return out + (["--device-memory", args.device_memory] if args.device_memory else [])


def base_row(args, model: str, p: int) -> dict:
    return {"graph": "papers100m", "scale": args.scale, "model": model, "dtype": "bfloat16",
            "mode": "shards" if args.shards else "memory", "pes": p,
            "device_memory": args.device_memory}  # fmt: skip


def in_memory(args, model: str) -> dict:
    """The plan of the job, then the job itself, drawn in its one process."""
    spec = f"papers100m:scale={args.scale:g}"
    row = base_row(args, model, 1)
    flags = first_fit(args, row, 1, spec, model)
    t0 = time.perf_counter()
    rc, res, err = job(args, 1, spec, flags)
    row["train_wall_s"] = time.perf_counter() - t0
    if res is None:
        row["refused"] = f"train: {err.splitlines()[-1] if err else f'exit {rc}'}"
        return row
    row["prepare_s"] = res["setup_s"]
    return trained(row, res)


def sharded(args, p: int, model: str) -> dict:
    """Partition by the ranks into shards, then train from them (the earlier protocol)."""
    spec = f"papers100m:scale={args.scale:g}"
    out = Path(args.work) / f"{model}-p{p}"
    row = base_row(args, model, p)
    t0 = time.perf_counter()
    part = ["--out", out, "--distributed", "--force", "--model", model, "--dtype", "bfloat16"]
    rc, _, err = mggrun(p, "mgg", "partition", spec, *part)
    row["prepare_s"] = time.perf_counter() - t0
    if rc != 0:
        row["refused"] = f"partition: {err.splitlines()[-1] if err else rc}"
        return row
    flags = first_fit(args, row, p, out, model)
    t0 = time.perf_counter()
    rc, res, err = job(args, p, out, flags)
    row["train_wall_s"] = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    if res is None:
        row["refused"] = err.splitlines()[-1] if err else f"exit {rc}"
        return row
    return trained(row, res)


def first_fit(args, row: dict, p: int, dataset, model: str) -> list:
    """The training flags at the first --hidden whose plan fits (the last if none does),
    its plan in row."""
    for hidden in args.hiddens:
        flags = train_flags(args, model, hidden)
        planned(row, p, dataset, flags)
        row["hidden"] = hidden
        if row.get("fits"):
            break
    return flags


def job(args, p: int, dataset, flags: list) -> tuple[int, dict | None, str]:
    """`mggrun -np P mgg train --dataset DATASET` with the training flags."""
    run = ["--backend", args.backend, "--epochs", args.epochs, "--eval-every", "0"]
    return mggrun(p, "mgg", "train", "--dataset", dataset, *run, *flags, "--json")


def planned(row: dict, p: int, dataset, flags: list) -> None:
    """`mgg plan DATASET --np P --backend cuda` with the job's flags, into row."""
    _, plan, _ = mggrun(1, "mgg", "plan", dataset, "--np", p, "--backend", "cuda", *flags,
                        "--json")  # fmt: skip
    if plan is not None:
        big = max(plan["per_rank"], key=lambda r: r["device"]["total_bytes"])
        row.update(fits=plan["fits"], plan_fixes=plan["fixes"])
        row["planned_device_bytes"] = big["device"]["total_bytes"]
        row["planned_host_bytes"] = big["total_bytes"]
        row["planned_stream_rows"] = big["device"].get("stream_rows")
        row["planned_offload"] = big["device"].get("offload")


def trained(row: dict, res: dict) -> dict:
    """A training run's JSON into row: epochs, memory, accuracy."""
    secs = [h["seconds"] for h in res["history"]]
    row.update(first_epoch_s=secs[0] if secs else None, epoch_s=res["epoch_time_s"])
    row.update(test_acc=res["test_acc"], stream_rows=res.get("stream_rows"))
    row["offload"] = res.get("offload")
    peak = [b for b in res.get("peak_device_bytes") or [] if b is not None]
    row["peak_device_bytes"] = max(peak) if peak else None
    if res.get("planned_device_bytes"):
        row["planned_device_bytes"] = res["planned_device_bytes"]
    row["peak_rss_mb"] = max(res["peak_rss_mb"])
    row["planned_host_bytes"] = res.get("planned_bytes", row.get("planned_host_bytes"))
    return row


def write(args, rows: list[dict]) -> None:
    name = "papers_gpu" if args.backend == "cuda" else "papers_gpu_cpu"
    if args.device_memory:
        name += f"-{args.device_memory.lower()}"
    out, extra = RESULTS, {}
    if args.backend == "cuda" or os.environ.get("MGG_GPU_OUT"):  # a window's step folder
        from common_gpu import GPU_RESULTS, device

        out = GPU_RESULTS
        extra = {"device": device()["device"]} if args.backend == "cuda" else {}
    how = (
        "drawn and partitioned by the ranks into shards (`mgg partition --distributed`), "
        "trained from them"
        if args.shards
        else "drawn, partitioned and trained in one process from memory (no files); "
        "prepare_s: `mgg train`'s setup_s, the time to the first epoch (graph drawn, "
        "plan built, features drawn in bf16)"
    )
    budget = f", --device-memory {args.device_memory}" if args.device_memory else ""
    notes = (
        f"`papers100m:scale={args.scale:g}` {how}; {args.layers} layers, hidden "
        f"{args.hidden} (the first the plan fits: the hidden column), bf16, flags "
        f"`{args.flags}`{budget}, {args.epochs} epochs "
        f"({args.backend}). first_epoch_s apart from the median epoch_s; planned: `mgg "
        "plan` with the same flags (--backend cuda); refused: the job's one-line reason "
        "where it did not run."
    )
    write_results(name, {"args": vars(args)}, rows, COLUMNS, notes=notes, out_dir=out,
                  extra_meta=extra)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
