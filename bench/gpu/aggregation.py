"""Single-PE aggregation on the GPU: mgg's kernel vs cuSPARSE and PyG.

    python bench/gpu/aggregation.py [--dims 16,128] [--nodes 232965] [--edges 114615892]

A Reddit-size R-MAT (233K nodes, 114M edges) by default. mgg runs its kernel at the
default configuration and at the best of a small (ps, dist, wpb) sweep; cuSPARSE is
torch.sparse CSR @ dense; PyG is SimpleConv (sum) propagation. All in one process,
timed round-robin with CUDA events (medians). The bandwidth bound counts the bytes an
aggregation must move at least: indices (+ weights) once, every gathered row
(E * D * 4), the output once; its fraction is held against the measured device copy
rate and the datasheet HBM rate. Goals: >= 1.3x cuSPARSE, >= 70% of the bound.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from common_gpu import copy_bandwidth, cuda_compare, device, raw_log, write_gpu

from mgg.baselines.cuda import Pipelined
from mgg.graph.generators import random_features, rmat_n
from mgg.kernels import reference
from mgg.partition import build_plan

SWEEP = [(16, 4, 4), (8, 4, 8), (16, 1, 8), (32, 2, 4), (16, 8, 8), (4, 8, 16)]


def main():
    import cupy
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--nodes", type=int, default=232_965)
    ap.add_argument("--edges", type=int, default=114_615_892)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    with raw_log("aggregation"):
        dev = device()
        copy_bw = copy_bandwidth()
        print(
            f"{dev['device']}: copy {copy_bw / 1e12:.2f} TB/s, datasheet "
            f"{(dev['nominal_hbm_bytes_per_s'] or 0) / 1e12:.2f} TB/s",
            flush=True,
        )
        g = rmat_n(args.nodes, args.edges, seed=0)
        print(f"graph: {g}", flush=True)
        rows = []
        for op, gg in (("sum", g), ("gcn", g.gcn_norm())):
            plan = build_plan(gg, 1, 16, transposed=False)[0]
            w = gg.weights if op == "gcn" else np.ones(gg.num_edges, np.float32)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a_t = torch.sparse_csr_tensor(
                    torch.from_numpy(gg.indptr),
                    torch.from_numpy(gg.indices.astype(np.int64)),
                    torch.from_numpy(w),
                    size=(gg.num_nodes,) * 2,
                ).cuda()
            src, dst = gg.edges()
            edge_index = torch.from_numpy(np.stack([src, dst]).astype(np.int64)).cuda()
            edge_w = torch.from_numpy(w).cuda()
            from torch_geometric.nn import SimpleConv

            pyg = SimpleConv(aggr="sum")
            for d in (int(v) for v in args.dims.split(",")):
                x = random_features(0, 0, gg.num_nodes, d)
                xt = torch.from_numpy(x).cuda()
                designs = {
                    cfg: Pipelined([plan], d, ps=cfg[0], dist=cfg[1], wpb=cfg[2]) for cfg in SWEEP
                }
                for des in designs.values():
                    des.load(x)
                fns = {
                    f"mgg ps={c[0]} dist={c[1]} wpb={c[2]}": (lambda des=des: des.run(op))
                    for c, des in designs.items()
                }
                fns["cusparse"] = lambda: a_t @ xt
                fns["pyg"] = lambda: pyg(xt, edge_index, edge_w)
                t = cuda_compare(fns, repeat=args.repeat)
                got = designs[SWEEP[0]].gather(designs[SWEEP[0]].run(op))
                ref = reference.aggregate(gg, x, op)
                err = float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))
                mgg_times = {k: v for k, v in t.items() if k.startswith("mgg")}
                best = min(mgg_times, key=mgg_times.get)
                moved = (
                    gg.num_edges * (4 + (4 if op == "gcn" else 0) + 4 * d) + gg.num_nodes * d * 4
                )
                row = {
                    "op": op,
                    "D": d,
                    "edges": gg.num_edges,
                    "mgg_default_ms": t[
                        f"mgg ps={SWEEP[0][0]} dist={SWEEP[0][1]} wpb={SWEEP[0][2]}"
                    ]
                    * 1e3,
                    "mgg_best_ms": mgg_times[best] * 1e3,
                    "mgg_best": best[4:],
                    "cusparse_ms": t["cusparse"] * 1e3,
                    "pyg_ms": t["pyg"] * 1e3,
                    "max_rel_error": err,
                }
                row["vs_cusparse"] = row["cusparse_ms"] / row["mgg_best_ms"]
                row["vs_pyg"] = row["pyg_ms"] / row["mgg_best_ms"]
                row["bw_of_copy"] = moved / (mgg_times[best]) / copy_bw
                if dev["nominal_hbm_bytes_per_s"]:
                    row["bw_of_datasheet"] = (
                        moved / mgg_times[best] / dev["nominal_hbm_bytes_per_s"]
                    )
                rows.append(row)
                print(
                    f"{op} D={d}: mgg {row['mgg_best_ms']:.3f} ms ({best}) cuSPARSE "
                    f"{row['cusparse_ms']:.3f} PyG {row['pyg_ms']:.3f} -> "
                    f"{row['vs_cusparse']:.2f}x cuSPARSE, {row['bw_of_copy']:.0%} of copy "
                    f"bandwidth; max error {err:.1e}",
                    flush=True,
                )
                designs.clear()
                cupy.get_default_memory_pool().free_all_blocks()
        write_gpu(
            "aggregation",
            {
                "nodes": g.num_nodes,
                "edges": g.num_edges,
                "copy_bandwidth_bytes_per_s": copy_bw,
                "sweep": SWEEP,
            },
            rows,
            [
                "op",
                "D",
                "mgg_default_ms",
                "mgg_best_ms",
                "mgg_best",
                "cusparse_ms",
                "pyg_ms",
                "vs_cusparse",
                "vs_pyg",
                "bw_of_copy",
                "bw_of_datasheet",
                "max_rel_error",
            ],
            notes="One PE. bw_of_copy: the bytes an aggregation must move (indices, "
            "weights, E*D*4 gathered, N*D*4 written) per second, over the "
            "measured device copy rate.",
        )


if __name__ == "__main__":
    main()
