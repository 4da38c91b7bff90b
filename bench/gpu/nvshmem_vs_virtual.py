"""NVSHMEM timed: MGG's aggregation on P real PEs (one process each, sharing the one GPU,
peers reached through NVSHMEM by p2p loads or device gets) against P virtual PEs in one
process, on the same graph, so the results say what the NVSHMEM path costs.

    python bench/gpu/nvshmem_vs_virtual.py [--graph products:scale=0.25] [--dim 64]
                                           [--nps 2,4] [--modes p2p,get] [--repeat 20]

Real PEs: `mggrun -np P mgg check GRAPH --backend cuda --remote MODE --designs pipelined
--op sum --json`, whose time is the slowest rank's median call (barrier, call, device
synchronized). Virtual PEs: the same graph, split and knobs in this process, timed by
the same protocol (mgg.harness.timing). Without MPS the PEs' kernels take turns on the
GPU (time slices), so real_over_virtual also holds the context switches; the JSON says
whether an MPS daemon was running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

import numpy as np
from common_gpu import ROOT, Results, grouped_bars, raw_log


def real_seconds(graph: str, nprocs: int, mode: str, dim: int, repeat: int) -> dict:
    """{'seconds', 'remote_path'} of one `mgg check` job on ``nprocs`` NVSHMEM PEs."""
    argv = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(nprocs)]
    argv += [sys.executable, "-m", "mgg", "check", graph, "--backend", "cuda"]
    argv += ["--remote", mode, "--designs", "pipelined", "--op", "sum"]
    argv += ["--dim", str(dim), "--repeat", str(repeat), "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        raise RuntimeError(f"mgg check -np {nprocs} --remote {mode} failed:\n{r.stderr[-2000:]}")
    res = json.loads(lines[-1])
    if res["np"] != nprocs:
        raise RuntimeError(f"the job ran with {res['np']} ranks, not {nprocs}")
    (run,) = [x for x in res["runs"] if x["design"] == "pipelined" and x["op"] == "sum"]
    if not run["ok"]:
        raise RuntimeError(f"-np {nprocs} --remote {mode}: the output differs from scipy")
    return {"seconds": run["seconds"], "remote_path": run.get("remote_path")}


def virtual_seconds(graph, nprocs: int, dim: int, repeat: int) -> float:
    """Median seconds of one call of P virtual PEs (every PE's aggregation, one after
    another), timed as `mgg check` times a call."""
    import cupy

    t = _time_virtual(graph, nprocs, dim, repeat, cupy.cuda.Device().synchronize)
    cupy.get_default_memory_pool().free_all_blocks()  # the design is gone
    return float(np.median(t))


def _time_virtual(graph, nprocs, dim, repeat, sync) -> list:
    from mgg.backend import assign
    from mgg.designs import get_design
    from mgg.graph.dataset import random_features
    from mgg.harness.timing import time_round_robin
    from mgg.knobs import DEFAULTS
    from mgg.partition import build_plan

    plans = build_plan(graph, nprocs, DEFAULTS.ps, transposed=False)
    d = get_design("virtual", "pipelined")(plans, None, dim)
    assign(d.x, random_features(0, 0, graph.num_nodes, dim))
    for _ in range(3):
        d("sum")
    sync()
    return time_round_robin({"v": lambda: d("sum")}, None, repeat, sync=sync)["v"]


def mps_running() -> bool:
    """Whether an MPS control daemon runs on this machine."""
    if shutil.which("pgrep") is None:
        return False
    return subprocess.run(["pgrep", "-f", "nvidia-cuda-mps"], capture_output=True).returncode == 0


def plot(rows, path):
    grouped_bars(
        path,
        rows,
        lambda r: f"P={r['np']}",
        lambda r: {f"real PEs, {r['mode']}": r["real_over_virtual"]},
        "NVSHMEM PEs (one process each) vs virtual PEs on one GPU",
        "real PE time / virtual PE time",
        goal=1.0,
        line="equal",
    )


def main():
    from mgg.graph.specs import resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="products:scale=0.25")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--nps", default="2,4")
    ap.add_argument("--modes", default="p2p,get")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    res = Results(
        "nvshmem_vs_virtual",
        {"graph": args.graph, "dim": args.dim, "mps": mps_running()},
        ["np", "mode", "real_ms", "virtual_ms", "real_over_virtual", "remote_path"],
        notes="sum aggregation, pipelined design, default knobs. real_ms: the slowest "
        "rank's median call of `mggrun -np P mgg check --backend cuda`; virtual_ms: P "
        "virtual PEs in one process, same protocol. Without MPS the PEs time-slice "
        "the GPU.",
        plot=plot,
    )
    with raw_log("nvshmem_vs_virtual"):
        graph = resolve(args.graph).graph
        print(f"{args.graph}: {graph}; MPS daemon: {res.payload['mps']}", flush=True)
        for p in map(int, args.nps.split(",")):
            virtual = virtual_seconds(graph, p, args.dim, args.repeat)
            for mode in args.modes.split(","):
                real = real_seconds(args.graph, p, mode, args.dim, args.repeat)
                row = {
                    "np": p,
                    "mode": mode,
                    "real_ms": real["seconds"] * 1e3,
                    "virtual_ms": virtual * 1e3,
                    "real_over_virtual": real["seconds"] / virtual,
                    "remote_path": real["remote_path"],
                }
                res.add(row)
                print(row, flush=True)
        return res.finish()


if __name__ == "__main__":
    sys.exit(main())
