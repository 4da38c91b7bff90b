"""Where one mgg training step spends its time on the GPU: torch.profiler over a few
steps of a registered model on a stand-in, the top ops by device and by host time.

    python bench/gpu/profile_step.py [--graph reddit] [--scale 0.05] [--models gat,gcn]

Writes profile_<graph>_<model>.txt (the two tables) into $MGG_GPU_OUT (bench/gpu/stage.py
sets it) or bench/results/gpu/.
"""

from __future__ import annotations

import argparse
import sys

from common_gpu import GPU_RESULTS, standin_graph

from mgg.prepare import prepare

from common import default_trainer


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="reddit")
    ap.add_argument("--scale", type=float, default=0.05)
    ap.add_argument("--models", default="gat")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    ds = standin_graph(args.graph, args.scale, features=True)  # with a split
    GPU_RESULTS.mkdir(parents=True, exist_ok=True)
    for model in args.models.split(","):
        dg, data = prepare(ds, None, model, backend="cuda")
        t = default_trainer(dg, data, model)
        for _ in range(2):  # warm up: compile, upload, allocate
            t.train_step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                t.train_step()
            torch.cuda.synchronize()
        avg = prof.key_averages()
        text = (
            f"{args.graph} x{args.scale} {model}: {args.steps} steps\n"
            + avg.table(sort_by="self_cuda_time_total", row_limit=15)
            + "\n"
            + avg.table(sort_by="self_cpu_time_total", row_limit=12)
        )
        (GPU_RESULTS / f"profile_{args.graph}_{model}.txt").write_text(text)
        print(text, flush=True)
        dg.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
