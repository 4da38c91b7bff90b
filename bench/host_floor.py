"""A training step's host cost: mgg at 1 and 2 ranks, PyG at its best and DGL, on graphs
so small that the kernels cost almost nothing (a 2,000-node planted graph, Cora).

    python bench/host_floor.py [--models gcn,sage,gin,gat] [--graphs planted,cora]
                               [--steps 60] [--rounds 3] [--np 1,2] [--peers pyg,dgl]

Each side runs in a process of its own, in alternating rounds (mgg P = 1, mgg P = 2, PyG,
DGL per model and round); a side's figure is the median over rounds of its median step.
Per step (bench/step_costs.py): wall time; python_ms, the wall time less the time cProfile
finds in compiled code (numba's kernels, torch's and numpy's builtins); the torch calls
and ATen ops dispatched; the autograd graph's nodes; numba kernel calls; and at 2 ranks
the collectives (mgg.comm's, by kind) and the time spent waiting in them. PyG runs each
graph form of its layers (pyg_models.PATHS) and counts on its fastest; DGL (its own
virtualenv, bench/peers) reports its step time. Goal: mgg's step <= PyG's and DGL's at
1 rank for every model.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from mgg.graph.formats import read_npz, write_npz

from common import RESULTS, SHARED_DATA, complete, csv_list, job_json, run_json, write_results

MODELS = ("gcn", "sage", "gin", "gat")
GRAPHS = ("planted", "cora")


def graph(name: str):
    """The dataset ``name``: 'planted' (2,000 nodes, 4 classes, 16 features), else a
    graph of ../shared/data."""
    if name == "planted":
        from mgg.graph.generators import planted_partition

        return planted_partition(2000, 4, avg_degree=10, num_features=16, seed=0)
    path = SHARED_DATA / f"{name}.npz"
    if not path.exists():
        raise SystemExit(f"host_floor: {path} not found (graphs: planted or ../shared/data)")
    return complete(read_npz(path))


def mgg_worker(path: str, name: str, steps: int) -> None:
    """Under mggrun: mgg's step on the dataset at ``path``; rank 0 prints the report."""
    import torch
    from step_costs import step_report

    import mgg.comm.mpi as mpi
    from mgg.comm import get_comm
    from mgg.prepare import prepare
    from mgg.torch import MODELS as SPECS

    from common import default_trainer

    comm = get_comm("mpi")  # as `mgg train` runs, at P = 1 too
    dg, data = prepare(read_npz(path), comm, name)
    t = default_trainer(dg, data, name)

    def step():
        t.train_step()

    def forward_loss():
        return t._forward_loss(t.epoch)

    colls, wait = collections.Counter(), [0.0]
    if comm.size > 1:
        enter, waiting = mpi.MPIComm._enter, mpi.MPIComm._wait

        def counted_enter(self, code):
            colls[code] += 1
            return enter(self, code)

        def timed_wait(self, req, n, code):
            t0 = time.perf_counter()
            waiting(self, req, n, code)
            wait[0] += time.perf_counter() - t0

        mpi.MPIComm._enter, mpi.MPIComm._wait = counted_enter, timed_wait
    rep = step_report(step, forward_loss, steps)
    t.read_losses()
    if comm.size > 1:  # one more counted pass: collectives per step, their wait
        colls.clear()
        wait[0] = 0.0
        for _ in range(steps):
            step()
        t.read_losses()
        names = {getattr(mpi, k.upper(), None): k for k in mpi.OPS}
        rep["collectives"] = {names.get(c, str(c)): n / steps for c, n in colls.items()}
        rep["collective_ms"] = wait[0] / steps * 1e3
        mpi.MPIComm._enter, mpi.MPIComm._wait = enter, waiting
    rep["threads"] = torch.get_num_threads()
    rep["model_spec"] = SPECS[name].cls.__name__
    if comm.rank == 0:
        print(json.dumps(rep))


def pyg_worker(path: str, name: str, steps: int) -> None:
    """PyG's step on each graph form of ``name``; the report of the fastest."""
    import torch
    from pyg_models import pyg_steps
    from step_costs import step_report

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = {f: step_report(s, loss, steps) for f, s, loss in pyg_steps(read_npz(path), name)}
    best = min(reports, key=lambda f: reports[f]["step_ms"])
    forms = {f: r["step_ms"] for f, r in reports.items()}
    print(json.dumps({**reports[best], "form": best, "forms_ms": forms}))


def sides(path: Path, peer: Path | None, name: str, steps: int, nps, peers) -> dict:
    """One round: every side's report on the dataset at ``path``."""
    out = {}
    for p in nps:
        out[f"mgg_p{p}"] = job_json(p, sys.executable, __file__, "--mgg-worker", path, name, steps)
    if "pyg" in peers:
        cmd = [sys.executable, __file__, "--pyg-worker", path, name, steps]
        out["pyg"] = run_json(cmd, "the PyG worker", timeout=1800)
    if "dgl" in peers:
        from peers.dgl_env import run_worker

        out["dgl"] = run_worker("time", peer, name, steps, timeout=1800)
    return out


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    xs = np.arange(len(rows))
    bars = [("mgg_ms", "mgg P=1"), ("mgg_python_ms", "mgg P=1, Python"), ("pyg_ms", "PyG best")]
    if any(r.get("dgl_ms") for r in rows):
        bars.append(("dgl_ms", "DGL"))
    w = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        ax.bar(xs + i * w - 0.4 + w / 2, [r.get(key) or 0 for r in rows], w, label=label)
    ax.set_xticks(xs, [f"{r['graph']} {r['model']}" for r in rows], rotation=30, ha="right")
    ax.set_ylabel("ms per training step (median)")
    ax.set_title("A training step's host cost on small graphs, one process each")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def median_report(reports: list[dict]) -> dict:
    """The per-key median of numeric entries over rounds (the first round's others)."""
    out = dict(reports[0])
    for k, v in reports[0].items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = float(np.median([r[k] for r in reports]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--np", default="1,2")
    ap.add_argument("--peers", default="pyg,dgl", help="the peers timed ('': mgg alone)")
    ap.add_argument("--stem", default="host_floor")
    ap.add_argument("--mgg-worker", nargs=3, metavar=("PATH", "MODEL", "STEPS"))
    ap.add_argument("--pyg-worker", nargs=3, metavar=("PATH", "MODEL", "STEPS"))
    args = ap.parse_args()
    if args.mgg_worker:
        return mgg_worker(args.mgg_worker[0], args.mgg_worker[1], int(args.mgg_worker[2]))
    if args.pyg_worker:
        return pyg_worker(args.pyg_worker[0], args.pyg_worker[1], int(args.pyg_worker[2]))
    models = csv_list(args.models, MODELS)
    nps = sorted(set(csv_list(args.np, (1, 2, 3, 4), int)) | {1})
    peers = csv_list(args.peers, ("pyg", "dgl")) if args.peers else []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for gname in csv_list(args.graphs):
            ds = graph(gname)
            path = Path(tmp) / f"{gname}.npz"
            write_npz(ds, path)
            peer = None
            if "dgl" in peers:
                from peers.check_dgl import write_peer_file

                peer = Path(tmp) / f"{gname}-peer.npz"
                write_peer_file(ds, peer)
            for name in models:
                rounds = []
                for r in range(args.rounds):
                    rounds.append(sides(path, peer, name, args.steps, nps, peers))
                    print(f"{gname} {name} round {r + 1}/{args.rounds}", file=sys.stderr)
                rep = {k: median_report([rd[k] for rd in rounds]) for k in rounds[0]}
                rows.append(row_of(gname, ds, name, rep, nps))
                print(json.dumps(rows[-1]), flush=True)
    plot(rows, RESULTS / f"{args.stem}.png")
    columns = ["graph", "model", "mgg_ms", "mgg_python_ms", "pyg_ms", "pyg_form", "dgl_ms"]
    columns += ["vs_pyg", "vs_dgl", "mgg_aten_ops", "pyg_aten_ops", "mgg_autograd_nodes"]
    columns += ["pyg_autograd_nodes", "mgg_kernel_calls"]
    if 2 in nps:
        columns += ["p2_ms", "p2_collectives", "p2_collective_share"]
    write_results(
        args.stem,
        {"steps": args.steps, "rounds": args.rounds, "np": nps, "peers": peers},
        rows,
        columns,
        notes="ms: the median over rounds of each process's median training step (forward, "
        "loss, backward, optimizer; mgg's at P = 2 with its gradient allreduce). "
        "python_ms: that step less the time cProfile finds in compiled code. aten_ops: "
        "ATen ops dispatched per step (torch's dispatch mode), autograd_nodes: the nodes "
        "of the loss's graph, kernel_calls: numba kernels called per step. vs_pyg, "
        "vs_dgl: the peer's step / mgg's at P = 1. p2_collectives: mgg.comm collectives "
        "per step at P = 2, p2_collective_share: the share of its step spent in them.",
    )


def row_of(gname, ds, name, rep, nps) -> dict:
    m, dgl = rep["mgg_p1"], rep.get("dgl")
    pyg = rep.get("pyg", {k: None for k in ("step_ms", "python_ms", "form", "aten_ops")})
    pyg.update({k: pyg.get(k) for k in ("torch_calls", "autograd_nodes", "python_calls")})
    row = {
        "graph": gname,
        "nodes": ds.graph.num_nodes,
        "edges": ds.graph.num_edges,
        "model": name,
        "mgg_ms": m["step_ms"],
        "mgg_python_ms": m["python_ms"],
        "pyg_ms": pyg["step_ms"],
        "pyg_python_ms": pyg["python_ms"],
        "pyg_form": pyg["form"],
        "dgl_ms": dgl["step_s"] * 1e3 if dgl else None,
        "mgg_aten_ops": m["aten_ops"],
        "pyg_aten_ops": pyg["aten_ops"],
        "mgg_torch_calls": m["torch_calls"],
        "pyg_torch_calls": pyg["torch_calls"],
        "mgg_autograd_nodes": m["autograd_nodes"],
        "pyg_autograd_nodes": pyg["autograd_nodes"],
        "mgg_kernel_calls": m["kernel_calls"],
        "mgg_python_calls": m["python_calls"],
        "pyg_python_calls": pyg["python_calls"],
    }
    row["vs_pyg"] = row["pyg_ms"] / row["mgg_ms"] if row["pyg_ms"] else None
    row["vs_dgl"] = row["dgl_ms"] / row["mgg_ms"] if dgl else None
    if 2 in nps:
        p2 = rep["mgg_p2"]
        row["p2_ms"] = p2["step_ms"]
        row["p2_collectives"] = sum(p2.get("collectives", {}).values())
        row["p2_collectives_by_kind"] = p2.get("collectives")
        row["p2_collective_ms"] = p2.get("collective_ms")
        row["p2_collective_share"] = p2.get("collective_ms", 0) / p2["step_ms"]
    return row


if __name__ == "__main__":
    main()
