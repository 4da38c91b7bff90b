"""Full-graph training epoch: mgg against PyG at its best and DGL, each in its own process,
in alternating rounds; and mgg at P = 2 against P = 1.

    python bench/train_vs_peers.py [--models gcn,sage,gin,gat] [--graphs A,B]
                                   [--products 0.05,0.2] [--epochs 20] [--rounds 3]
                                   [--np 1,2] [--no-dgl] [--stem NAME]

Same graph, features, labels and model (mgg's defaults; bench/pyg_models.py, and their
DGL twins in bench/peers/dgl_worker.py), same thread count (all cores). Each side runs in
a process of its own, with its own best settings: mgg as `mggrun -np P mgg train` (the
median epoch it reports); PyG as a worker process of this script on each graph form its
layers take, the fastest reported as its best (pyg_models.PATHS: edge_index; the
transposed sparse adjacency with GCN's normalization cached; GAT's self loops added
once), dense features where they fit, the training rows as an index tensor; DGL 2.1 in a
virtualenv of its own (bench/peers/dgl_env.py builds it on first use), its graph and its
formats built before the clock starts, self loops added once where its layers need them.
A peer's step is the median of its steps after two warm-up steps. A round runs every
side of one model in turn; each side's figure is the median over rounds. Before timing,
DGL's model is run on PyG's weights (bench/peers/check_dgl.py) and its logits compared
with PyG's: dgl_check is the largest difference relative to PyG's largest logit.
The PyG worker imports mgg (to read the dataset) before torch, so PyG runs with mgg's
process settings: one OpenMP runtime for torch and numba, and glibc keeping freed
memory (docs/training.md). Graphs without features or labels get seeded random ones.
Goals: mgg >= 3x DGL and >= 5x PyG's best on every pair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from mgg.graph.formats import read_npz, write_npz
from mgg.graph.specs import resolve

from common import RESULTS, complete, csv_list, mgg_json, real_graphs, run_json, write_results

MODELS = ("gcn", "sage", "gin", "gat")
GRAPHS = ("amazon_computers", "coauthor_cs", "pubmed")


def pyg_worker(path: str, name: str, epochs: int) -> None:
    """Time PyG's training step on the dataset at ``path`` on each graph form of
    ``name`` (pyg_models.PATHS); print {"step_s": {form: median}, ...}: the median of
    ``epochs`` steps after two warm-up steps."""
    import torch
    from pyg_models import pyg_steps
    from step_costs import time_steps

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    step_s = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for form, step, _ in pyg_steps(complete(read_npz(path)), name):
            step_s[form] = float(np.median(time_steps(step, epochs, warmup=2)))
    gomp = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
    print(
        json.dumps(
            {
                "step_s": step_s,
                "threads": torch.get_num_threads(),
                "openmp_runtimes": len(gomp),
            }
        )
    )


def pyg_job(path: Path, name: str, epochs: int) -> dict:
    cmd = [sys.executable, __file__, "--pyg-worker", path, name, epochs]
    return run_json(cmd, "the PyG worker", timeout=7200)


def mgg_job(nprocs: int, path: Path, name: str, epochs: int) -> dict:
    return mgg_json(
        nprocs, "train", "--dataset", path, "--model", name, "--epochs", epochs, "--eval-every", 0
    )


def one_round(path, peer, name, epochs, nps) -> dict:
    """Every side's epoch (seconds) of model ``name``, one process each, in turn."""
    out = {}
    for p in nps:
        job = mgg_job(p, path, name, epochs)
        out[f"p{p}"], out[f"p{p}_acc"] = job["epoch_time_s"], job["test_acc"]
    pyg = pyg_job(path, name, epochs)
    out["pyg"] = pyg["step_s"]
    out["pyg_openmp_runtimes"] = pyg["openmp_runtimes"]
    if peer is not None:
        from peers.dgl_env import run_worker

        out["dgl"] = run_worker("time", peer, name, epochs, timeout=7200)["step_s"]
    return out


def measure(ds, models, epochs, rounds, nps, dgl, tmp: Path, rows):
    path = tmp / f"{ds.name}.npz"
    write_npz(ds, path)
    peer = None
    if dgl:
        from peers.check_dgl import check, write_peer_file

        peer = tmp / f"{ds.name}-peer.npz"
        write_peer_file(ds, peer)
    for name in models:
        checked = check(peer, name, ds.graph) if dgl else None
        runs = []
        for r in range(rounds):
            runs.append(one_round(path, peer, name, epochs, nps))
            print(f"  {ds.name} {name}: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        med = lambda key: float(np.median([run[key] for run in runs]))  # noqa: E731
        forms = {f: float(np.median([run["pyg"][f] for run in runs])) for f in runs[0]["pyg"]}
        best = min(forms, key=forms.get)
        row = {
            "graph": ds.name,
            "nodes": ds.graph.num_nodes,
            "edges": ds.graph.num_edges,
            "features": int(ds.x.shape[1]),
            "model": name,
            "mgg_ms": med("p1") * 1e3,
            "pyg_ms": forms["edge_index"] * 1e3,
            "pyg_best_ms": forms[best] * 1e3,
            "pyg_best_path": best,
            "dgl_ms": med("dgl") * 1e3 if dgl else None,
            "dgl_check": checked["max_rel"] if checked else None,
            "mgg_test_acc": runs[0]["p1_acc"],
            "pyg_openmp_runtimes": runs[0]["pyg_openmp_runtimes"],
            "rounds": rounds,
        }
        row["vs_pyg"] = row["pyg_ms"] / row["mgg_ms"]
        row["vs_pyg_best"] = row["pyg_best_ms"] / row["mgg_ms"]
        row["vs_dgl"] = row["dgl_ms"] / row["mgg_ms"] if dgl else None
        if 2 in nps:
            row["p2_ms"] = med("p2") * 1e3
            row["p2_vs_p1"] = row["mgg_ms"] / row["p2_ms"]
            row["p2_vs_pyg_best"] = row["pyg_best_ms"] / row["p2_ms"]
            row["p2_vs_dgl"] = row["dgl_ms"] / row["p2_ms"] if dgl else None
        rows.append(row)
        dgl_text = f"  DGL {row['dgl_ms']:8.2f} ms -> {row['vs_dgl']:.2f}x" if dgl else ""
        print(
            f"{ds.name:>18} {name}: mgg {row['mgg_ms']:8.2f} ms  PyG best {row['pyg_best_ms']:8.2f}"
            f" ms ({best}) -> {row['vs_pyg_best']:.2f}x{dgl_text}",
            flush=True,
        )


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 4))
    xs = np.arange(len(rows))
    peers = [("vs_pyg_best", "PyG's best / mgg", 5)]
    if any(r.get("vs_dgl") for r in rows):
        peers.append(("vs_dgl", "DGL / mgg", 3))
    w = 0.8 / len(peers)
    for i, (key, label, goal) in enumerate(peers):
        c = f"C{i}"
        ax.bar(xs + i * w - 0.4 + w / 2, [r[key] or 0 for r in rows], w, label=label, color=c)
        ax.axhline(goal, color=c, ls="--", lw=1, label=f"goal {goal}x")
    ax.axhline(1, color="grey", lw=0.5)
    ax.set_yscale("log")
    ax.set_xticks(
        xs, [f"{r['graph']} {r['model']}" for r in rows], fontsize=7, rotation=50, ha="right"
    )
    ax.set_ylabel("peer's epoch / mgg's epoch (P = 1)")
    ax.set_title("Full-graph training epoch on the CPU, each in its own process")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--np", default="1,2", help="mgg's rank counts (1 always first)")
    ap.add_argument("--graphs", default=",".join(GRAPHS), help="graphs of ../shared/data")
    ap.add_argument("--products", default="0.05,0.2", help="scales of the products stand-in")
    ap.add_argument("--no-dgl", action="store_true", help="leave DGL out (no venv built)")
    ap.add_argument("--stem", help="the results' name (default: from the graphs)")
    ap.add_argument("--pyg-worker", nargs=3, metavar=("PATH", "MODEL", "EPOCHS"))
    args = ap.parse_args()
    if args.pyg_worker:
        path, name, epochs = args.pyg_worker
        return pyg_worker(path, name, int(epochs))
    models = csv_list(args.models, MODELS)
    nps = sorted(set(csv_list(args.np, (1, 2, 3, 4), int)) | {1})
    names = csv_list(args.graphs) if args.graphs else []
    scales = csv_list(args.products, cast=float) if args.products else []
    paths = real_graphs(tuple(names))
    if len(paths) < len(names):
        missing = set(names) - {p.stem for p in paths}
        raise SystemExit(f"train_vs_peers: not in ../shared/data: {', '.join(sorted(missing))}")
    stem = args.stem or "train_vs_peers-" + "-".join(
        [p.stem for p in paths] + [f"products{s:g}" for s in scales]
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sources = [lambda p=p: complete(read_npz(p)) for p in paths]
        sources += [lambda s=s: complete(resolve(f"products:scale={s}")) for s in scales]
        for load in sources:  # the results so far written after each graph
            ds = load()
            measure(ds, models, args.epochs, args.rounds, nps, not args.no_dgl, Path(tmp), rows)
            plot(rows, RESULTS / f"{stem}.png")
            write(stem, rows, nps, args.epochs)


def write(stem: str, rows: list[dict], nps, epochs: int) -> None:
    worst = {
        k: min((r[k] for r in rows if r.get(k) is not None), default=None)
        for k in ("vs_pyg_best", "vs_dgl")
    }
    columns = ["graph", "nodes", "edges", "features", "model", "mgg_ms", "pyg_ms", "vs_pyg"]
    columns += ["pyg_best_ms", "pyg_best_path", "vs_pyg_best", "dgl_ms", "vs_dgl", "dgl_check"]
    if 2 in nps:
        columns += ["p2_ms", "p2_vs_p1", "p2_vs_pyg_best", "p2_vs_dgl"]
    write_results(
        stem,
        {"cores": len(os.sched_getaffinity(0)), "epochs": epochs, "worst": worst},
        rows,
        columns + ["mgg_test_acc"],
        notes="mgg_ms: median epoch of `mggrun -np 1 mgg train` (p2_ms: -np 2); pyg_ms: "
        "median training step of the same model in PyG on edge_index, in a process of its "
        "own; pyg_best_ms: the fastest of PyG's graph forms (pyg_best_path: edge_index, "
        "csr: the transposed sparse adjacency, loops: GAT's self loops added once); dgl_ms: "
        "DGL 2.1's median step (bench/peers); each the median over alternating rounds "
        "(rounds in the JSON); all on every core. dgl_check: DGL's logits on PyG's weights "
        "against PyG's, the largest difference over PyG's largest logit. Goals: vs_dgl >= "
        "3, vs_pyg_best >= 5 on every pair. Graphs without features or labels get seeded "
        "random ones.",
    )


if __name__ == "__main__":
    main()
