"""Fig. 10: the tuner on the Reddit stand-in: the search's walk, the exhaustive grid and
the heatmaps (ps x dist, wpb x dist).

    python bench/gpu/fig10_tuner.py [--np 4] [--dim 16] [--scale 1.0]

The paper: about 10 iterations to converge, up to 68% below the start (1, 1, 1).
"""

from __future__ import annotations

import argparse

from common_gpu import GPU_RESULTS, cuda_median, raw_log, standin_graph, write_gpu

from mgg.baselines.cuda import Pipelined
from mgg.graph.generators import random_features
from mgg.kernels.cuda import current_device
from mgg.partition import build_plan
from mgg.tuner import Workload, default_space, exhaustive, model_guess, rank_configs, search
from mgg.tuner.plot import heatmaps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--graph", default="reddit")
    args = ap.parse_args()
    with raw_log("fig10_tuner"):
        g = standin_graph(args.graph, args.scale).graph.gcn_norm()
        plans = build_plan(g, args.np, 16, transposed=False)
        x = random_features(0, 0, g.num_nodes, args.dim)
        dev = current_device()[1]
        space = default_space(dev)

        def measure(cfg):
            d = Pipelined(plans, args.dim, ps=cfg["ps"], dist=cfg["dist"], wpb=cfg["wpb"])
            d.load(x)
            return cuda_median(lambda: d.run("gcn"), repeat=5, warmup=1)

        ranked = rank_configs(space, Workload.of(plans[0], args.dim), dev, "p2p")
        origin = search(space, measure)
        from_model = search(space, measure, start=model_guess(ranked))
        full = exhaustive(space, lambda c: origin.table().get(tuple(c.values())) or measure(c))
        rows = []
        for label, res in (("origin (1,1,1)", origin), ("model guess", from_model)):
            rows.append(
                {
                    "start": label,
                    "measured": res.measured,
                    "best": res.best,
                    "best_ms": res.best_latency * 1e3,
                    "start_ms": res.start_latency * 1e3,
                    "below_start": 1 - res.best_latency / res.start_latency,
                    "vs_exhaustive": res.best_latency / full.best_latency,
                }
            )
            print(
                f"{label}: {res.measured} measured, best {res.best} "
                f"{res.best_latency * 1e3:.3f} ms, {rows[-1]['below_start']:.0%} below the "
                f"start, {rows[-1]['vs_exhaustive']:.3f}x the exhaustive best "
                f"{full.best}",
                flush=True,
            )
        heatmaps(
            space,
            full.table(),
            full.best,
            GPU_RESULTS / "fig10_tuner.png",
            f"{args.graph} stand-in, P={args.np}, D={args.dim} (latency per call)",
        )
        write_gpu(
            "fig10_tuner",
            {
                "np": args.np,
                "dim": args.dim,
                "graph": args.graph,
                "exhaustive_best": full.best,
                "exhaustive_best_ms": full.best_latency * 1e3,
                "trace_origin": origin.trace,
                "trace_model": from_model.trace,
            },
            rows,
            ["start", "measured", "best", "best_ms", "start_ms", "below_start", "vs_exhaustive"],
        )


if __name__ == "__main__":
    main()
