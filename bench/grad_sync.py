"""How much of a training step the gradient allreduce takes across simulated nodes: the
most that overlapping it with the backward pass could win.

    python bench/grad_sync.py [--np 2] [--runs products:scale=0.05/gcn,...]

Each run is one `mggrun -np P` job of this script (--worker) with MPIR_CVAR_NOLOCAL=1 and
UCX_TLS=tcp,self (bench/network_designs.py says why): 12 epochs of `Trainer.fit`, the
median step and the median time of `sync_gradients` (one flat allreduce after
`loss.backward()`, which includes waiting for the slowest rank) over epochs 3-12.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from common import ROOT, SHARED_DATA, default_trainer, write_results

ENV = {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"}
RUNS = f"products:scale=0.05/gcn,products:scale=0.05/gin,{SHARED_DATA}/cora.npz/gat"


def worker(spec: str, name: str) -> None:
    import mgg.train
    from mgg.comm import get_comm
    from mgg.graph.specs import resolve
    from mgg.prepare import prepare

    comm = get_comm()
    dg, data = prepare(resolve(spec), comm, name)
    trainer = default_trainer(dg, data, name)
    sync, plain = [], mgg.train.sync_gradients

    def timed(params, c):
        t0 = time.perf_counter()
        plain(params, c)
        sync.append(time.perf_counter() - t0)

    mgg.train.sync_gradients = timed
    steps = [h["seconds"] for h in trainer.fit(12)][2:]
    if comm.rank == 0:
        print(json.dumps({
            "params": sum(p.numel() for p in trainer.model.parameters()),
            "step_ms": float(np.median(steps)) * 1e3,
            "allreduce_ms": float(np.median(sync[2:])) * 1e3,
        }))  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--runs", default=RUNS, help="GRAPH/MODEL, comma-separated")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    rows = []
    for run in args.runs.split(","):
        spec, model = run.rsplit("/", 1)
        cmd = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(args.np)]
        cmd += [sys.executable, __file__, "--worker", spec, model]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        row = {"graph": os.path.basename(spec), "model": model, "np": args.np, **res}
        row["share"] = row["allreduce_ms"] / row["step_ms"]
        rows.append(row)
        print(f"{row['graph']:>20} {model}: step {row['step_ms']:.1f} ms, allreduce "
              f"{row['allreduce_ms']:.2f} ms ({row['share']:.1%})", flush=True)  # fmt: skip
    write_results(
        "grad_sync",
        {"env": ENV},
        rows,
        ["graph", "model", "np", "params", "step_ms", "allreduce_ms", "share"],
        notes="Every rank its own node over loopback TCP (MPIR_CVAR_NOLOCAL=1, "
        "UCX_TLS=tcp,self). allreduce_ms: median time in sync_gradients (one flat "
        "allreduce of every gradient, waiting for the slowest rank included), epochs 3-12.",
    )


if __name__ == "__main__":
    main()
