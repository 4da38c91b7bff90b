"""Fig. 10: the tuner on the Reddit stand-in: the search's walk, the exhaustive grid and
the heatmaps (ps x dist, wpb x dist).

    python bench/gpu/fig10_tuner.py [--np 4] [--dim 16] [--scale 1.0]

The paper: about 10 iterations to converge, up to 68% below the start (1, 1, 1). Both walks
(from the paper's start and from the model's guess) use the tuner's sampling protocol
(mgg.tuner.search); the grid is measured on its own, 5 rounds round-robin, and the picks
are then re-measured side by side (9 rounds) for the ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys

from common_gpu import GPU_RESULTS, Results, cuda_median, raw_log, standin_graph

from mgg.backend import assign
from mgg.designs import get_design
from mgg.graph.dataset import random_features
from mgg.harness.timing import fresh_sample
from mgg.kernels.cuda import current_device
from mgg.knobs import space as knob_space
from mgg.partition import build_plan
from mgg.tuner import (
    Workload,
    exhaustive,
    model_guess,
    model_table,
    rank_configs,
    search,
)
from mgg.tuner.plot import heatmaps
from mgg.tuner.search import confirm_medians


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--graph", default="reddit")
    args = ap.parse_args()
    res = Results(
        "fig10_tuner",
        {"np": args.np, "dim": args.dim, "graph": args.graph},
        ["start", "measured", "samples", "noise", "confidence", "best", "best_ms", "start_ms"]
        + ["below_start", "vs_exhaustive"],
    )
    with raw_log("fig10_tuner"):
        g = standin_graph(args.graph, args.scale).graph.gcn_norm()
        base = build_plan(g, args.np, 16, transposed=False)
        by_ps = functools.cache(lambda ps: [p.with_ps(ps) for p in base])
        x = random_features(0, 0, g.num_nodes, args.dim)
        dev = current_device()[1]
        space = knob_space(dev)
        measured = []
        pipelined = get_design("virtual", "pipelined")

        def build(cfg):
            return pipelined(by_ps(cfg["ps"]), None, args.dim, dist=cfg["dist"], wpb=cfg["wpb"])

        def warm(d):
            assign(d.x, x)
            d("gcn")

        def measure(cfg):  # one sample; the tuner's protocol decides how many
            t = fresh_sample(build, warm, lambda d: cuda_median(lambda: d("gcn"), 1, 0), cfg)
            measured.append({**cfg, "ms": t * 1e3})
            if len(measured) % 50 == 0:
                res.payload["measurements"] = measured
                res.write(partial=True)
            return t

        work = Workload.of(base[0], args.dim)
        res.payload["workload"] = dataclasses.asdict(work)  # what the model ranked with
        ranked = rank_configs(space, work, dev, "p2p")
        origin = search(space, measure)  # the paper's walk from (1, 1, 1)
        from_model = search(space, measure, model=model_table(ranked))
        res.payload.update(trace_origin=origin.trace, trace_model=from_model.trace)
        full = exhaustive(space, measure, rounds=5)  # on its own, not from the searches
        picks = {"origin": origin.best, "model": from_model.best, "grid": full.best}
        picks["model_guess"] = model_guess(ranked)
        confirmed = confirm_medians(picks, measure, rounds=9)
        for label, r in (("origin (1,1,1)", origin), ("model guess", from_model)):
            key = "origin" if r is origin else "model"
            res.add(
                {
                    "start": label,
                    "measured": r.measured,
                    "samples": r.samples,
                    "noise": r.noise,
                    "confidence": r.confidence,
                    "best": r.best,
                    "best_ms": confirmed[key] * 1e3,
                    "start_ms": r.start_latency * 1e3,
                    "below_start": 1 - r.best_latency / r.start_latency,
                    "vs_exhaustive": confirmed[key] / confirmed["grid"],
                }
            )
            row = res.rows[-1]
            print(
                f"{label}: {r.measured} measured ({r.samples} samples), best {r.best} "
                f"{row['best_ms']:.3f} ms, {row['below_start']:.0%} below the start, "
                f"{row['vs_exhaustive']:.3f}x the exhaustive best {full.best}",
                flush=True,
            )
        heatmaps(
            space,
            full.table(),
            full.best,
            GPU_RESULTS / "fig10_tuner.png",
            f"{args.graph} stand-in, P={args.np}, D={args.dim} (latency per call)",
        )
        return res.finish(
            exhaustive_best=full.best,
            exhaustive_best_ms=confirmed["grid"] * 1e3,
            model_guess_vs_exhaustive=confirmed["model_guess"] / confirmed["grid"],
            measurements=measured,
        )


if __name__ == "__main__":
    sys.exit(main())
