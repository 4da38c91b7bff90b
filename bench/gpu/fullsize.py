"""The graphs one GPU cannot hold (issue 59, stage 1): a stand-in at full size (or any
scale), every model in float32 and bfloat16, on P PEs: the epoch, and the peak device
memory of the largest PE against the memory plan's estimate (goal 0.8-1.2x).

    python bench/gpu/fullsize.py [--graph reddit] [--scale 1] [--pes 1,2]
                                 [--models gcn,sage,gin,gat] [--dtypes float32,bfloat16]
                                 [--epochs 5] [--backend cuda|cpu]

For each P, one `mggrun -np P` job draws the graph once and trains each (model, dtype) in
turn in its processes (prepare, Trainer; the pools emptied and their peaks reset between
runs), so a scale-1 stand-in is generated P times, not once per run. Each run's row is
written as it ends (a job killed at its limit keeps what it measured): `graph`, `scale`,
`model`, `dtype`, `pes`, `epoch_s` (the median epoch), `peak_device_bytes` (the largest
PE's: torch's peak reserved, CuPy's pool, the NVSHMEM heap), `planned_device_bytes` (the
plan of the largest PE, mgg.footprint.plan), their ratio, and `oom` where a run ran out of
memory. PyG's step at these sizes: the e2e stage (`stage.py e2e --args "e2e=--scale 1"`).
`--backend cpu` runs the same jobs on CPU ranks (a smoke run; the device numbers are then
the plan's alone).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import RESULTS, ROOT, csv_list, write_results  # noqa: E402

COLUMNS = ["graph", "scale", "model", "dtype", "pes", "epoch_s", "peak_device_bytes",
           "planned_device_bytes", "peak_vs_plan", "test_acc", "oom"]  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="reddit")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--pes", default="1")
    ap.add_argument("--models", default="gcn,sage,gin,gat")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a job's rows file
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    out = results_dir(args.backend)
    rows: list[dict] = []
    for p in csv_list(args.pes, cast=int):
        rows_file = out / f"fullsize_p{p}.jsonl"
        rows_file.unlink(missing_ok=True)
        me = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
        argv = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(p), *me]
        argv += ["--worker", str(rows_file)]
        print(f"P = {p}: {' '.join(argv[3:])}", flush=True)
        job = subprocess.run(argv, cwd=ROOT, text=True, capture_output=True)
        print(job.stdout[-4000:], job.stderr[-4000:], sep="", flush=True)
        done = []
        if rows_file.exists():
            done = [json.loads(ln) for ln in rows_file.read_text().splitlines()]
        rows += done
        if job.returncode != 0:
            why = f"job failed (exit {job.returncode}) after {len(done)} run(s)"
            rows.append({"graph": args.graph, "scale": args.scale, "pes": p, "oom": why})
        write(args, rows, out)
        rows_file.unlink(missing_ok=True)
    return 0


def results_dir(backend: str) -> Path:
    """$MGG_GPU_OUT (a window's step folder) if set, else bench/results[/gpu]."""
    if backend == "cpu" and not os.environ.get("MGG_GPU_OUT"):
        return RESULTS
    from common_gpu import GPU_RESULTS

    GPU_RESULTS.mkdir(parents=True, exist_ok=True)
    return GPU_RESULTS


def worker(args) -> int:
    """One job of P ranks: every (model, dtype) in turn; rank 0 appends each row."""
    import torch

    from mgg.backend import get_backend
    from mgg.footprint import plan
    from mgg.graph.specs import resolve
    from mgg.prepare import prepare
    from mgg.torch import MODELS

    from common import default_trainer

    be = get_backend(args.backend)
    comm = be.comm()
    lead = comm.rank == 0
    spec = f"{args.graph}:scale={args.scale:g}"
    ds = resolve(spec, seed=0)
    budget = {"host": 2**62, "device": 2**62}
    for model in csv_list(args.models, allowed=list(MODELS)):
        for dtype in csv_list(args.dtypes, allowed=["float32", "bfloat16"]):
            row = {"graph": args.graph, "scale": args.scale, "model": model, "dtype": dtype,
                   "pes": comm.size}  # fmt: skip
            planned = plan(ds, comm.size, "train", budget=budget, device=True,
                           model=MODELS[model], dtype=dtype)  # fmt: skip
            row["planned_device_bytes"] = max(
                r["device"]["total_bytes"] for r in planned["per_rank"]
            )
            reset(be)
            try:
                dg, data = prepare(ds, comm, model, backend=be, dtype=dtype)
                t = default_trainer(dg, data, model)
                t.fit(args.epochs)
                s = t.summary()
                row.update(epoch_s=s["epoch_time_s"], test_acc=s["test_acc"])
                peak = comm.allgather(be.peak_device_bytes(comm))
                if peak[0] is not None:
                    row["peak_device_bytes"] = max(peak)
                    row["peak_vs_plan"] = max(peak) / row["planned_device_bytes"]
                del t
                dg.free()
            except (torch.OutOfMemoryError, MemoryError) as e:  # a PE's device (or host) is full
                row["oom"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            if lead:
                print(json.dumps(row), flush=True)
                with open(args.worker, "a") as f:
                    f.write(json.dumps(row, default=float) + "\n")
            comm.barrier()
    return 0


def reset(be) -> None:
    """Empty the pools and reset their peaks: each run's peak is its own."""
    gc.collect()
    if not be.gpu:
        return
    import cupy
    import torch

    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def write(args, rows: list[dict], out: Path) -> None:
    notes = (
        f"`{args.graph}:scale={args.scale:g}`, {args.epochs} epochs a run, {args.backend}. "
        "peak_device_bytes: the largest PE's (torch's peak reserved + CuPy's pool + the "
        "NVSHMEM heap; the CUDA context not counted); planned_device_bytes: mgg.footprint.plan's "
        "device total of the largest PE (its baseline counts the context)."
    )
    name = "fullsize" if args.backend == "cuda" else "fullsize_cpu"
    extra = {}
    if args.backend == "cuda":
        from common_gpu import device

        extra = {"device": device()["device"]}
    write_results(name, {"args": vars(args)}, rows, COLUMNS, notes=notes, out_dir=out,
                  extra_meta=extra)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
