"""Node orders before Algorithm 1 (issue 53): what each order buys in rows that cross
ranks, aggregation time and epoch time, and what it costs to compute.

    python bench/locality.py [--graphs cora,...] [--products-scale 0.1] [--ranks 2,4,8]
        [--orders natural,degree,rcm,metis] [--parts partition,time] [--epochs 20]
        [--dim 64] [--repeat 20] [--work DIR]

- partition: every graph (the seven of ../shared/data and the products stand-in), every
  order, P = 2, 4, 8: halo rows (the rows each layer fetches from peers), remote-edge
  fraction and edge imbalance of GCN's graph, as `mgg partition --json` reports them;
  the order's own time against build_plan's (warm, medians of 3). Goals: halo rows of
  the best order <= 0.4x natural's at P = 4 (geomean over the real graphs); rcm's time
  <= 3x build_plan's (METIS's reported).
- time: per graph and P (1, 2, 4), one job prepares the graph in every order (GCN's
  graph, each order's DistGraph and Trainer side by side) and times them round-robin:
  the pipelined gcn aggregation at D = --dim (median of --repeat) and GCN training steps
  (median of --epochs, after one warm-up; each the slowest rank's). Goal: >= 1.15x epoch
  speed-up at P = 4 where the natural order is poor (halo rows > 2x the best order's).
  Graphs without labels train on seeded random ones (the timing does not depend on
  them). This machine has 2 cores: P = 4 runs two ranks per core.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from common import RESULTS, SHARED_DATA, job_json, real_graphs, write_results

ORDERS = ("natural", "degree", "rcm", "metis")
GOALS = {"halo_p4": 0.4, "rcm_vs_plan": 3.0, "epoch_p4": 1.15}
POOR = 2.0  # natural's halo rows over the best order's, at P = 4: a poor natural order


def graphs(names, products_scale: float) -> list[tuple[str, str]]:
    """(name, spec) of each graph: the real files, then the products stand-in."""
    out = [(p.stem, str(p)) for p in real_graphs(names)]
    if products_scale:
        out.append((f"products-{products_scale:g}", f"products:scale={products_scale:g}"))
    return out


def variant(order: str, split: str) -> tuple[str, str]:
    """(order, split) of an --orders entry: ORDER, or ORDER/SPLIT (e.g. metis/mixed: METIS
    balancing, and the ranks cut by, both shares)."""
    name, _, own = order.partition("/")
    return name, own or split


def partition(named, ranks, orders, split: str) -> list[dict]:
    """Each order's plan facts at each P, and its time against build_plan's."""
    from mgg.graph.specs import resolve
    from mgg.partition import build_plan, plan_stats
    from mgg.partition import order as node_order

    rows = []
    for name, spec in named:
        g = resolve(spec).graph
        for p in ranks:
            base = None
            for o in orders:
                times, order = [], None
                for _ in range(1 if o == "natural" else 3):
                    name_, split_ = variant(o, split)
                    order = node_order.compute(g, name_, parts=p, split=split_)
                    times.append(order.seconds)
                job = order.apply(g).gcn_norm()
                plan_s = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    st = plan_stats(build_plan(job, p, 16, split=split_))
                    plan_s.append(time.perf_counter() - t0)
                row = {
                    "graph": name,
                    "np": p,
                    "order": o,
                    "nodes": g.num_nodes,
                    "edges": g.num_edges,
                    "halo_rows": st["halo_rows"],
                    "max_halo_rows": max(st["halo_rows_per_rank"]),
                    "remote_fraction": st["remote_fraction"],
                    "imbalance": st["imbalance"],
                    "order_s": float(np.median(times)),
                    "plan_s": float(np.median(plan_s)),
                }
                row["order_vs_plan"] = row["order_s"] / row["plan_s"]
                base = base or row
                row["halo_vs_natural"] = row["halo_rows"] / max(base["halo_rows"], 1)
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(row) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())


def labeled(name: str, spec: str, work: Path) -> str:
    """``spec``, or for a graph without labels a copy with seeded random ones."""
    from mgg.graph.dataset import Dataset
    from mgg.graph.formats import write_graph
    from mgg.graph.specs import resolve

    ds = resolve(spec)
    if ds.y is not None:
        return spec
    path = work / f"{name}-labeled.npz"
    if not path.exists():
        y = np.random.default_rng(0).integers(0, 16, ds.graph.num_nodes)
        write_graph(Dataset(name, ds.graph, y=y, num_classes=16), path)
    return str(path)


def timing(
    named, orders, epochs: int, dim: int, repeat: int, work: Path, ranks, windows, split: str
) -> list[dict]:
    """Per graph, P and window (P > 1), one job (this script's worker under mggrun) that
    prepares the graph in every order and times them round-robin."""
    import sys

    rows = []
    for name, spec in named:
        data = labeled(name, spec, work)
        for p, window in [(q, w) for q in ranks for w in (windows if q > 1 else ["-"])]:
            got = job_json(
                p, sys.executable, __file__, "--worker", data, "--orders", ",".join(orders),
                "--epochs", epochs, "--dim", dim, "--repeat", repeat, "--window", window,
                "--split", split,
            )  # fmt: skip
            base = got["natural"]
            for o in orders:
                row = {"graph": name, "np": p, "window": window, "order": o, **got[o]}
                row["agg_speedup"] = base["agg_ms"] / row["agg_ms"]
                row["epoch_speedup"] = base["epoch_ms"] / row["epoch_ms"]
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def worker(data: str, orders, epochs: int, dim: int, repeat: int, window: str, split: str) -> None:
    """One job: the graph prepared in each order (GCN; ``window``: the MPI window of
    P > 1, '-' for P = 1), then round-robin over the orders
    the pipelined gcn aggregation at width ``dim`` (``repeat`` rounds) and ``epochs``
    training steps (each the slowest rank's time); prints one JSON line on rank 0:
    {order: {agg_ms, epoch_ms, peer_mb_per_epoch, halo_rows}} (medians)."""
    import json

    from mgg.backend import get_backend
    from mgg.graph.dataset import random_features
    from mgg.graph.specs import resolve
    from mgg.harness.timing import slowest, time_round_robin
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.torch import build_model
    from mgg.train import Trainer

    comm = get_backend("cpu").comm()
    ds = resolve(data)
    jobs = {}
    for o in orders:
        kw = {} if window == "-" else {"window": window}
        name_, split_ = variant(o, split)
        dg, d = prepare(ds, comm, "gcn", order=name_, split=split_, **kw)
        model = build_model("gcn", d.num_features, d.num_classes, seed=0)
        t = Trainer(dg, d, model, build_optimizer("adam", model, 0.01, 5e-4), eval_every=0)
        x = random_features(0, dg.lb, dg.ub, dim, ids=d.node_ids)
        jobs[o] = (dg, t, x)
    calls = {o: (lambda dg=dg, x=x: dg.aggregate(x, "gcn")) for o, (dg, _, x) in jobs.items()}
    for f in calls.values():  # warm: designs built, kernels compiled
        f()
    agg = time_round_robin(calls, comm, repeat)
    steps = {o: [] for o in orders}
    for e in range(epochs + 1):  # the first, warm-up, is not counted
        for o in orders[e % len(orders) :] + orders[: e % len(orders)]:
            dg, t, _ = jobs[o]
            before = dg.stats["remote_bytes"]
            comm.barrier()
            t0 = time.perf_counter()
            t.train_step()
            t.read_losses()
            secs = float(slowest(comm, [time.perf_counter() - t0])[0])
            if e:
                mine = dg.stats["remote_bytes"] - before
                steps[o].append((secs, comm.allreduce(np.array([mine], np.float64))[0]))
    out = {}
    for o, (dg, _, _) in jobs.items():
        halo = comm.allreduce(np.array([dg.plan.num_halo], np.int64))[0]
        out[o] = {
            "agg_ms": float(np.median(agg[o])) * 1e3,
            "epoch_ms": float(np.median([s for s, _ in steps[o]])) * 1e3,
            "peer_mb_per_epoch": float(np.median([b for _, b in steps[o]])) / 1e6,
            "halo_rows": int(halo),
        }
        dg.free()
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


def summary(part_rows, time_rows, real: set) -> dict:
    """The goals' numbers: the best order's halo rows vs natural at P = 4 (geomean over
    the real graphs), rcm's and METIS's time vs build_plan's (largest), the epoch speed-up
    at P = 4 where natural is poor."""
    out = {}
    p4 = [r for r in part_rows if r["np"] == 4 and r["graph"] in real]
    by_order = {}
    for r in p4:
        by_order.setdefault(r["order"], []).append(r["halo_vs_natural"])
    geo = {o: float(np.exp(np.mean(np.log(v)))) for o, v in by_order.items()}
    best = min(geo, key=geo.get) if geo else None
    out["halo_vs_natural_p4_geomean"] = geo
    out["best_order"] = best
    for o in ("rcm", "metis"):
        ratios = [r["order_vs_plan"] for r in part_rows if r["order"] == o]
        if ratios:
            out[f"{o}_vs_plan_max"] = max(ratios)
            out[f"{o}_vs_plan_median"] = float(np.median(ratios))
    poor = set()
    for g in {r["graph"] for r in part_rows}:
        rows = {r["order"]: r for r in part_rows if r["graph"] == g and r["np"] == 4}
        if "natural" in rows and rows["natural"]["halo_rows"] > POOR * min(
            r["halo_rows"] for r in rows.values()
        ):
            poor.add(g)
    out["poor_natural"] = sorted(poor)
    for w in sorted({r["window"] for r in time_rows if r["np"] == 4}):
        for key in ("epoch_speedup", "agg_speedup"):
            sp = [
                r[key]
                for r in time_rows
                if (r["np"], r["window"], r["order"]) == (4, w, best) and r["graph"] in poor
            ]
            if sp:  # fmt: skip
                geo_sp = float(np.exp(np.mean(np.log(sp))))
                out.setdefault(f"{key}_p4_best_on_poor_geomean", {})[w] = geo_sp
    return out


def plot(part_rows, time_rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["graph"] for r in part_rows))
    orders = list(dict.fromkeys(r["order"] for r in part_rows))
    windows = sorted({r["window"] for r in time_rows if r["np"] == 4})
    fig, axes = plt.subplots(1 + len(windows), 2, figsize=(14, 4.2 * (1 + len(windows))))
    axes = np.atleast_2d(axes)
    width = 0.8 / len(orders)
    x = np.arange(len(names))

    def bars(ax, rows, key, title, log=False):
        for i, o in enumerate(orders):
            v = [next((r[key] for r in rows if r["graph"] == n and r["order"] == o), np.nan)
                 for n in names]  # fmt: skip
            ax.bar(x + i * width, v, width, label=o)
        if not key.endswith("fraction"):
            ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(x + width * (len(orders) - 1) / 2, names, rotation=30, ha="right")
        ax.set_title(title)
        if log:
            ax.set_yscale("log")

    p4 = [r for r in part_rows if r["np"] == 4]
    bars(axes[0, 0], p4, "halo_vs_natural", "halo rows vs natural, P = 4 (lower is better)", True)
    bars(axes[0, 1], p4, "remote_fraction", "remote-edge fraction, P = 4")
    axes[0, 0].legend()
    for i, w in enumerate(windows, 1):
        t4 = [r for r in time_rows if r["np"] == 4 and r["window"] == w]
        bars(axes[i, 0], t4, "agg_speedup", f"pipelined gcn aggregation speed-up, P = 4, {w}")
        bars(axes[i, 1], t4, "epoch_speedup", f"GCN epoch speed-up, P = 4, {w}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default=None, help="comma-separated; default the seven")
    ap.add_argument("--products-scale", type=float, default=0.1, help="0: no stand-in")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--orders", default=",".join(ORDERS), help="ORDER or ORDER/SPLIT, ...")
    ap.add_argument("--parts", default="partition,time")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--work", default="/tmp/mgg-locality")
    ap.add_argument("--time-ranks", default="1,2,4", help="P of the timing jobs")
    ap.add_argument("--windows", default="shm,msg", help="the timing jobs' windows (P > 1)")
    ap.add_argument("--window", default="-", help=argparse.SUPPRESS)  # the worker's
    ap.add_argument("--split", default="edges", help="the node split (METIS balances it too)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # one timing job's graph
    args = ap.parse_args()
    if args.worker:
        orders = args.orders.split(",")
        return worker(
            args.worker, orders, args.epochs, args.dim, args.repeat, args.window, args.split
        )
    names = args.graphs.split(",") if args.graphs else None
    named = graphs(names, args.products_scale) if names else graphs(
        ("cora", "pubmed", "amazon_photo", "amazon_computers", "coauthor_cs", "ego_twitter",
         "cnr_2000"), args.products_scale)  # fmt: skip
    orders = args.orders.split(",")
    parts = args.parts.split(",")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    part_rows = partition(named, [int(p) for p in args.ranks.split(",")], orders, args.split)
    time_ranks = [int(p) for p in args.time_ranks.split(",")]
    windows = args.windows.split(",")
    time_rows = timing(
        named, orders, args.epochs, args.dim, args.repeat, work, time_ranks, windows, args.split
    ) if "time" in parts else []  # fmt: skip
    real = {p.stem for p in SHARED_DATA.glob("*.npz")}
    summ = summary(part_rows, time_rows, real)
    summ["goals"] = GOALS
    print(summ, flush=True)
    table = part_rows + time_rows
    cols = ["graph", "np", "window", "order", "halo_rows", "halo_vs_natural", "remote_fraction"]
    cols += ["imbalance", "order_s", "plan_s", "order_vs_plan", "agg_ms", "agg_speedup"]
    cols += ["epoch_ms", "epoch_speedup", "peer_mb_per_epoch"]
    geo = ", ".join(f"{o} {v:.3f}x" for o, v in summ["halo_vs_natural_p4_geomean"].items())
    notes = (
        f"Halo rows vs natural at P = 4, geomean over the real graphs: {geo} (goal: the best "
        f"<= {GOALS['halo_p4']}x). rcm's time vs build_plan's: up to "
        f"{summ.get('rcm_vs_plan_max', float('nan')):.2f}x (goal <= {GOALS['rcm_vs_plan']}x); "
        f"METIS: up to {summ.get('metis_vs_plan_max', float('nan')):.2f}x. Natural order poor "
        f"(halo > {POOR}x the best order's at P = 4) on: {', '.join(summ['poor_natural'])}; "
        "the best order's GCN epoch speed-up at P = 4 there, geomean by window: "
        + ", ".join(
            f"{w} {v:.2f}x"
            for w, v in summ.get("epoch_speedup_p4_best_on_poor_geomean", {}).items()
        )
        + f" (goal >= {GOALS['epoch_p4']}x). agg_ms and epoch_ms: the orders of a graph timed "
        "round-robin in one job per P and window (pipelined gcn aggregation; GCN training "
        "steps, slowest rank). Window shm: peers' rows are loads from one node's shared "
        "memory; msg: two-sided messages, what a job across nodes uses (here on one node). "
        "With 2 cores, P = 4 runs two ranks per core. At P = 1 metis is the natural order "
        "(one part)."
    )
    name = "locality" if not args.graphs else f"locality-{args.graphs.replace(',', '-')}"
    name += "" if args.split == "edges" else f"-split-{args.split}"
    write_results(name, {"summary": summ, "partition": part_rows, "time": time_rows}, table,
                  cols, notes)  # fmt: skip
    plot(part_rows, time_rows, RESULTS / f"{name}.png")
    print(f"wrote {RESULTS / name}.json, .md, .png")


if __name__ == "__main__":
    main()
