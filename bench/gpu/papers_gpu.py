"""papers100M-class on one GPU machine (issue 59, stage 2): the `papers100m` stand-in drawn
and partitioned by the ranks, then full-graph training from its shards; the partition, the
first epoch and the others timed apart, and the peak device memory against the plan.

    python bench/gpu/papers_gpu.py [--scale 1] [--pes 1] [--models gcn,sage] [--hidden 128]
                                   [--epochs 3] [--flags "--output-rows labeled"]
                                   [--backend cuda|cpu] [--work DIR]

For each (P, model): `mggrun -np P mgg partition papers100m:scale=S --out DIR --distributed
--model M --dtype bfloat16` (no process holds the graph), `mgg plan DIR --np P --backend
cuda` with the training flags (does it fit the GPU, and else what would), then `mggrun
-np P mgg train --dataset DIR` in bf16 with ``--flags``. A job the plan refuses is
recorded with the plan's reason and fixes: the measured obstacle. Rows: `graph`,
`scale`, `model`, `dtype`, `pes`, `partition_s`, `first_epoch_s`, `epoch_s`,
`peak_device_bytes` (largest PE), `planned_device_bytes`, `stream_rows`, `test_acc`,
`refused`. `--backend cpu` is a smoke run of the same commands.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from common import RESULTS, ROOT, csv_list, write_results  # noqa: E402

COLUMNS = ["model", "pes", "partition_s", "first_epoch_s", "epoch_s", "peak_device_bytes",
           "planned_device_bytes", "stream_rows", "fits", "test_acc", "refused"]  # fmt: skip


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
    ap.add_argument("--pes", default="1")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--flags", default="--output-rows labeled", help="more mgg train flags")
    ap.add_argument("--backend", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--work", default="/tmp/mgg-papers-gpu")
    args = ap.parse_args()
    spec = f"papers100m:scale={args.scale:g}"
    flags = shlex.split(args.flags)
    rows = []
    for p in csv_list(args.pes, cast=int):
        for model in csv_list(args.models, allowed=["gcn", "sage", "gin", "gat"]):
            out = Path(args.work) / f"{model}-p{p}"
            row = {"graph": "papers100m", "scale": args.scale, "model": model,
                   "dtype": "bfloat16", "pes": p}  # fmt: skip
            t0 = time.perf_counter()
            part_args = ["--out", out, "--distributed", "--force", "--model", model]
            rc, _, err = mggrun(p, "mgg", "partition", spec, *part_args, "--dtype", "bfloat16")
            row["partition_s"] = time.perf_counter() - t0
            if rc != 0:
                row["refused"] = f"partition: {err.splitlines()[-1] if err else rc}"
                rows.append(row)
                write(args, rows)
                continue
            train = ["--hidden", args.hidden, "--dtype", "bfloat16", *flags]
            rc, planned, _ = mggrun(1, "mgg", "plan", out, "--np", p, "--backend", "cuda",
                                    "--model", model, *train, "--json")  # fmt: skip
            if planned is not None:
                big = max(planned["per_rank"], key=lambda r: r["device"]["total_bytes"])
                row["fits"] = planned["fits"]
                row["plan_fixes"] = planned["fixes"]
                row["planned_device_bytes"] = big["device"]["total_bytes"]
            rc, res, err = mggrun(p, "mgg", "train", "--dataset", out, "--model", model,
                                  "--backend", args.backend, "--epochs", args.epochs,
                                  "--eval-every", "0", *train, "--json")  # fmt: skip
            if res is None:
                row["refused"] = err.splitlines()[-1] if err else f"exit {rc}"
            else:
                secs = [h["seconds"] for h in res["history"]]
                row.update(first_epoch_s=secs[0] if secs else None, epoch_s=res["epoch_time_s"])
                row.update(test_acc=res["test_acc"], stream_rows=res.get("stream_rows"))
                peak = [b for b in res.get("peak_device_bytes") or [] if b is not None]
                row["peak_device_bytes"] = max(peak) if peak else None
                if res.get("planned_device_bytes"):
                    row["planned_device_bytes"] = res["planned_device_bytes"]
                row["peak_rss_mb"] = max(res["peak_rss_mb"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            write(args, rows)
            shutil.rmtree(out, ignore_errors=True)
    return 0


def write(args, rows: list[dict]) -> None:
    name = "papers_gpu" if args.backend == "cuda" else "papers_gpu_cpu"
    out, extra = RESULTS, {}
    if args.backend == "cuda":
        from common_gpu import GPU_RESULTS, device

        out, extra = GPU_RESULTS, {"device": device()["device"]}
    notes = (
        f"`papers100m:scale={args.scale:g}` drawn and partitioned by the ranks "
        f"(`mgg partition --distributed`), trained from its shards in bf16, hidden "
        f"{args.hidden}, flags `{args.flags}`, {args.epochs} epochs ({args.backend}). "
        "first_epoch_s apart from the median epoch_s; refused: the plan's or the job's "
        "one-line reason where it did not run."
    )
    write_results(name, {"args": vars(args)}, rows, COLUMNS, notes=notes, out_dir=out,
                  extra_meta=extra)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
