"""CPU aggregation, one process on all cores: mgg's numba kernel vs torch.sparse and scipy.

    python bench/cpu_aggregation.py [--scale 18] [--dims 16,128] [--real]

Same graph, same features, same thread count; out = A @ X (sum) and the GCN-weighted
A_hat @ X. The designs are timed round-robin (medians), so they share the machine's noise.
Goal: mgg >= 1.1x torch at D = 16 and 128 on an R-MAT of about 8M edges.
Bandwidth: the traffic model counts every gathered row (E*(4+4D) + N*D*4 bytes); it is
an upper bound on DRAM traffic, so the fraction is of the machine's STREAM triad rate.
"""

from __future__ import annotations

import argparse
import warnings

import numba
import numpy as np

from mgg.graph.dataset import random_features
from mgg.graph.formats import read_npz
from mgg.graph.generators import rmat
from mgg.kernels import aggregate
from mgg.partition import build_plan

from common import compare, memory_bandwidth, real_graphs, write_results


def torch_csr(g):
    import torch

    w = g.weights if g.weights is not None else np.ones(g.num_edges, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(
            torch.from_numpy(g.indptr),
            torch.from_numpy(g.indices.astype(np.int64)),
            torch.from_numpy(w),
            size=(g.num_nodes,) * 2,
        )


def measure(name, g, dims, repeat, bw):
    import torch

    rows = []
    for op, gg in (("sum", g), ("gcn", g.gcn_norm())):
        plan = build_plan(gg, 1, 16, transposed=False)[0]
        whole = plan.with_ps(max(1, gg.max_in_degree()))  # one partition per node
        a = gg.to_scipy()
        if op == "sum":
            a.data[:] = 1.0
        at = torch_csr(gg)
        for d in dims:
            x = random_features(0, 0, gg.num_nodes, d)
            out = np.empty_like(x)
            xt = torch.from_numpy(x)
            t = compare(
                {
                    "mgg": lambda: aggregate(plan, x, op, out=out),
                    "mgg_node": lambda: aggregate(whole, x, op, out=out),
                    "torch": lambda: torch.sparse.mm(at, xt),
                    "scipy": lambda: a @ x,
                },
                repeat,
            )
            t_mgg, t_torch, t_scipy = t["mgg"], t["torch"], t["scipy"]
            ref = a @ x
            err = float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))
            traffic = gg.num_edges * (4 + 4 * d) + gg.num_nodes * d * 4
            rows.append(
                {
                    "graph": name,
                    "nodes": gg.num_nodes,
                    "edges": gg.num_edges,
                    "op": op,
                    "D": d,
                    "mgg_ms": t_mgg * 1e3,
                    "torch_ms": t_torch * 1e3,
                    "scipy_ms": t_scipy * 1e3,
                    "vs_torch": t_torch / t_mgg,
                    "mgg_node_ms": t["mgg_node"] * 1e3,
                    "node_vs_torch": t_torch / t["mgg_node"],
                    "vs_scipy": t_scipy / t_mgg,
                    "bw_fraction": traffic / t_mgg / bw,
                    "max_rel_error": err,
                }
            )
            print(
                f"{name:>14} {op:>3} D={d:<4} mgg {t_mgg * 1e3:8.2f} ms (node "
                f"{t['mgg_node'] * 1e3:.2f})  torch "
                f"{t_torch * 1e3:8.2f}  scipy {t_scipy * 1e3:8.2f}  -> {t_torch / t_mgg:.2f}x "
                f"torch, {traffic / t_mgg / bw:.0%} of triad",
                flush=True,
            )
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['graph']}\n{r['op']} D={r['D']}" for r in rows]
    xs = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    ax.bar(xs - 0.27, [r["vs_torch"] for r in rows], 0.27, label="ps=16 vs torch.sparse")
    ax.bar(xs, [r["node_vs_torch"] for r in rows], 0.27, label="ps=max deg vs torch.sparse")
    ax.bar(xs + 0.27, [r["vs_scipy"] for r in rows], 0.27, label="ps=16 vs scipy")
    ax.axhline(1.1, color="k", ls="--", lw=1, label="goal 1.1x torch")
    ax.set_xticks(xs, labels, fontsize=7)
    ax.set_ylabel("speedup of mgg (higher is better)")
    ax.set_title(f"CPU aggregation, {numba.get_num_threads()} threads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=18, help="R-MAT scale (18: ~7.6M edges)")
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--real", action="store_true", help="also the graphs of ../shared/data")
    args = ap.parse_args()
    threads = numba.get_num_threads()
    torch.set_num_threads(threads)
    dims = [int(d) for d in args.dims.split(",")]
    bw = memory_bandwidth()
    print(f"threads {threads}, STREAM triad {bw / 1e9:.1f} GB/s")
    rows = measure(f"rmat-s{args.scale}", rmat(args.scale, 16), dims, args.repeat, bw)
    if args.real:
        for p in real_graphs():
            rows += measure(p.stem, read_npz(p).graph, dims, args.repeat, bw)
    from common import RESULTS

    plot(rows, RESULTS / "cpu_aggregation.png")
    write_results(
        "cpu_aggregation",
        {"threads": threads, "triad_bytes_per_s": bw},
        rows,
        [
            "graph",
            "edges",
            "op",
            "D",
            "mgg_ms",
            "mgg_node_ms",
            "torch_ms",
            "scipy_ms",
            "vs_torch",
            "node_vs_torch",
            "vs_scipy",
            "bw_fraction",
        ],
        notes=f"{threads} threads for mgg and torch; scipy is single-threaded. mgg "
        "runs its plan at ps=16 (mgg_ms) and with one partition per node "
        "(mgg_node_ms, the CPU's better setting). "
        f"STREAM triad {bw / 1e9:.1f} GB/s. bw_fraction counts every "
        "gathered row (E*(4+4D) + N*D*4 bytes) against the triad rate.",
    )


if __name__ == "__main__":
    main()
