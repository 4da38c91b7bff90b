"""How close is `mgg train`'s memory estimate to the peak RSS it then reaches, from hidden
size 16 to 4096?

For each model and hidden size, runs ``mggrun -np P mgg train --model M --hidden H --json``
on a planted-partition stand-in (F=32, 8 classes, 12 entries per node; nodes scaled so a
[nodes, hidden*heads] tensor holds about --floats floats) and on pubmed from ../shared/data
where present (featureless: one-hot node ids, so the first layer has nodes*hidden
weights), and compares each rank's peak RSS (VmHWM) with ``memory_estimate_mb``. A run
whose estimate exceeds --max-mb is skipped. Writes bench/results/memory_estimate.{json,md,png}.

With ``--cold``, each run starts from an empty numba cache (a fresh NUMBA_CACHE_DIR:
the job compiles its kernels, what its estimate's part ``compile`` counts) and runs again
on the cache it filled (warm): cold peak minus warm peak is what compiling held, the
source of footprint.estimate.COMPILE. Writes memory_estimate-cold.{json,md,png}; the
ratio is estimate / the cold peak.

With ``--command check``, the same for ``mgg check`` (rank 0 holds the scipy oracle) on an
R-MAT graph (--check-graph): every design or one (pipelined), float32 or bfloat16, each op,
a node order, over --ranks and --dims. Writes memory_estimate-check.{json,md,png}.

    python bench/memory_estimate.py [--hidden 16,256,1024,4096] [--models gcn,sage,gin,gat]
    python bench/memory_estimate.py --command check [--ranks 1,2,4] [--dims 16,64]
    python bench/memory_estimate.py --cold --models gcn,gat --hidden 16,4096 --graphs planted
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from common import SHARED_DATA, mgg_json, write_results

ROOT = Path(__file__).resolve().parents[1]


def planted(nodes: int) -> str:
    return f"planted:nodes={nodes},classes=8,degree=12,features=32"


def graphs(model: str, hidden: int, args) -> list[tuple[str, str]]:
    """(name, dataset spec) of the graphs ``model`` at ``hidden`` runs on."""
    from mgg.torch import MODELS

    width = hidden * MODELS[model].heads
    nodes = max(500, min(args.max_nodes, args.floats // width))
    out = [("planted", planted(nodes))]
    pubmed = SHARED_DATA / "pubmed.npz"
    if "pubmed" in args.graphs and pubmed.exists():
        out.append(("pubmed", str(pubmed)))
    return [(name, spec) for name, spec in out if name in args.graphs]


def estimate(spec: str, model: str, hidden: int, p: int) -> dict[str, float]:
    """The estimate's parts in MB, before running."""
    from mgg.footprint import job_estimate
    from mgg.graph.specs import resolve
    from mgg.torch import MODELS

    parts = job_estimate(resolve(spec), p, "train", model=MODELS[model], hidden=hidden)
    return {k: round(v / 2**20, 1) for k, v in parts.items()}


def run(name: str, spec: str, model: str, hidden: int, p: int, epochs: int, cold=False) -> dict:
    from mgg.footprint import model_params
    from mgg.torch import MODELS

    argv = ["train", "--dataset", spec, "--model", model, "--hidden", hidden, "--epochs", epochs]
    env = {"MGG_MEMORY_LIMIT": "1T"}
    warm = None
    with tempfile.TemporaryDirectory(prefix="mgg-numba-") as cache:
        if cold:  # an empty cache: this run compiles; the next one finds its kernels
            env["NUMBA_CACHE_DIR"] = cache
        res = mgg_json(p, *argv, env=env)
        if cold:
            warm = max(mgg_json(p, *argv, env=env)["peak_rss_mb"])
    peak = max(res["peak_rss_mb"])
    est = res["memory_estimate_mb"]
    m, cfg = MODELS[model], res["config"]
    return {
        "graph": name,
        "model": model,
        "hidden": hidden,
        "nodes": res["num_nodes"],
        "edges": res["num_edges"],
        "params": model_params(m, cfg["in_dim"], cfg["out_dim"], hidden, m.layers, m.heads)[0],
        "np": p,
        "peak_rss_mb": res["peak_rss_mb"],
        "memory_estimate_mb": est,
        "ratio": est / peak,
        **({"warm_peak_mb": warm, "compiled_mb": peak - warm} if cold else {}),
    }


# mgg check's cases: (label, its flags), each at every --dims and --ranks
CHECK_CASES = (
    ("all designs", ()),
    ("pipelined", ("--designs", "pipelined")),
    ("bfloat16", ("--dtype", "bfloat16")),
    ("every op", ("--op", "all")),
    ("rcm order", ("--order", "rcm")),
    ("sharded", ()),  # a sharded dataset of the graph for P ranks: rank 0 reassembles it
)


def check_run(spec: str, label: str, flags, dim: int, p: int, tmp: str) -> dict:
    """One case of mgg check on P ranks: its ranks' peaks and its estimate."""
    graph = spec
    if label == "sharded":
        graph = f"{tmp}/shards-{p}"
        if not Path(graph).exists():
            mgg_json(1, "partition", spec, "--np", p, "--out", graph)
    res = mgg_json(p, "check", graph, "--dim", dim, "--repeat", "1", *flags,
                   env={"MGG_MEMORY_LIMIT": "1T"})  # fmt: skip
    est = res["memory_estimate_mb"]
    return {"case": label, "flags": list(flags), "dim": dim, "np": p,
            "peak_rss_mb": res["peak_rss_mb"], "memory_estimate_mb": est,
            "ratio": est / max(res["peak_rss_mb"])}  # fmt: skip


def check_runs(args) -> None:
    """``--command check``: mgg check's estimate against its ranks' peaks."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="mgg-check-memory-") as tmp:  # the sharded cases'
        for label, flags in CHECK_CASES:
            for dim in map(int, args.dims.split(",")):
                for p in map(int, args.ranks.split(",")):
                    rows.append(check_run(args.check_graph, label, flags, dim, p, tmp))
                    print(json.dumps(rows[-1]), flush=True)
    heads = ["case", "D", "P", "peak RSS, rank 0 (MB)", "largest other rank (MB)",
             "estimate (MB)", "ratio"]  # fmt: skip
    table = [
        dict(zip(heads, (r["case"], r["dim"], r["np"], round(r["peak_rss_mb"][0]),
                         round(max(r["peak_rss_mb"][1:], default=0)) or "",
                         round(r["memory_estimate_mb"]), round(r["ratio"], 2)), strict=True))
        for r in rows
    ]  # fmt: skip
    ratios = [r["ratio"] for r in rows]
    notes = (
        f"`mgg check {args.check_graph} --repeat 1` with each case's flags. ratio: estimate / "
        "peak RSS of the largest rank (VmHWM; rank 0, which holds the scipy oracle). "
        f"Ratios {min(ratios):.2f} to {max(ratios):.2f}."
    )
    write_results("memory_estimate-check", {"runs": rows, "args": vars(args)}, table, heads, notes)
    plot_ratios(rows, "memory_estimate-check", "dim", "case", "np", "ranks P",
                lambda dim: f"mgg check, D = {dim}")  # fmt: skip


def plot_ratios(rows, name: str, panel: str, line: str, x: str, xlabel: str, title,
                xscale: str = "linear") -> None:  # fmt: skip
    """bench/results/NAME.png: a panel per value of ``panel`` (its ``title(value)``), in it
    a line per value of ``line``, estimate / peak against ``x``, the 0.8-1.2 band shaded."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = list(dict.fromkeys(r[panel] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
    for ax, value in zip(axes[0], panels, strict=True):
        for label in dict.fromkeys(r[line] for r in rows):
            rs = [r for r in rows if r[line] == label and r[panel] == value]
            ax.plot([r[x] for r in rs], [r["ratio"] for r in rs], "o-", label=label)
        ax.axhspan(0.8, 1.2, color="0.9")
        ax.set(title=title(value), xlabel=xlabel, xscale=xscale, ylim=(0.5, 1.5))
        ax.set_ylabel("estimate / peak RSS")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(ROOT / "bench" / "results" / f"{name}.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--command", choices=["train", "check"], default="train")
    ap.add_argument("--check-graph", default="rmat:scale=20,ef=8")
    ap.add_argument("--dims", default="16,64", help="check's widths D")
    ap.add_argument("--hidden", default="16,256,1024,4096")
    ap.add_argument("--models", default="gcn,sage,gin,gat")
    ap.add_argument("--graphs", default="planted,pubmed")
    ap.add_argument("--ranks", default=None, help="default: 1 (train), 1,2,4 (check)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--floats", type=int, default=2**23, help="per [nodes, hidden*heads]")
    ap.add_argument("--max-nodes", type=int, default=100_000)
    ap.add_argument("--max-mb", type=float, default=4600, help="skip runs estimated above")
    ap.add_argument("--cold", action="store_true", help="each run from an empty numba cache")
    args = ap.parse_args()
    os.environ.setdefault("MGG_MEMORY_LIMIT", "1T")  # this process only estimates
    if args.command == "check":
        args.ranks = args.ranks or "1,2,4"
        return check_runs(args)
    args.ranks = args.ranks or "1"
    rows, skipped = [], []
    for model in args.models.split(","):
        for hidden in map(int, args.hidden.split(",")):
            for name, spec in graphs(model, hidden, args):
                for p in map(int, args.ranks.split(",")):
                    parts = estimate(spec, model, hidden, p)
                    if parts["total"] > args.max_mb:
                        skipped.append(f"{model} {name} hidden {hidden} P={p}")
                        continue
                    r = {**run(name, spec, model, hidden, p, args.epochs, args.cold),
                         "parts": parts}  # fmt: skip
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    heads = ["model", "graph", "nodes", "hidden", "parameters", "P",
             "peak RSS, largest rank (MB)", "estimate (MB)", "of it: model (MB)",
             "activations (MB)", "ratio"]  # fmt: skip
    table = [
        dict(zip(heads, (r["model"], r["graph"], r["nodes"], r["hidden"], r["params"], r["np"],
                         round(max(r["peak_rss_mb"])), round(r["memory_estimate_mb"]),
                         round(r["parts"]["model"]),
                         round(r["parts"]["activations"] + r["parts"].get("attention", 0)),
                         round(r["ratio"], 2)), strict=True))
        for r in rows
    ]  # fmt: skip
    ratios = [r["ratio"] for r in rows]
    notes = (
        "ratio: estimate / peak RSS of the largest rank (VmHWM) after "
        f"{args.epochs} epochs; planted: F=32, 8 classes; pubmed: one-hot ids, 3 classes. "
        f"Ratios {min(ratios):.2f} to {max(ratios):.2f}."
    )
    name = "memory_estimate"
    if args.cold:
        name += "-cold"
        heads.insert(7, "warm peak (MB)")
        for row, r in zip(table, rows, strict=True):
            row["warm peak (MB)"] = round(r["warm_peak_mb"])
        held = [r["compiled_mb"] for r in rows]
        notes += (
            " Each run from an empty numba cache (its peak: the cold one), then again on the "
            f"cache it filled (warm): compiling held {min(held):.0f} to {max(held):.0f} MB."
        )
    if skipped:
        notes += f" Skipped (estimated over {args.max_mb:.0f} MB): {'; '.join(skipped)}."
    write_results(name, {"runs": rows, "args": vars(args)}, table, heads, notes)
    plot_ratios(rows, name, "model", "graph", "hidden", "hidden", str.upper, "log")


if __name__ == "__main__":
    main()
