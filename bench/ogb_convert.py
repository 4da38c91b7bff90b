"""An OGB directory to .npz: `mgg convert` (streamed, O(N) plus a chunk) against reading
the directory whole (read_ogb + write_graph: what convert did before), as the edges grow.

    python bench/ogb_convert.py [--edges 2e6,8e6,32e6] [--features 8] [--work DIR]

Each size is an ``ogbn_products``-named directory (add_inverse_edge: both directions,
merged) of E edge lines on N = E / 16 nodes, F features, labels and a split, written as
OGB lays it out (gzip). Each conversion runs in its own process: wall seconds and peak
RSS (VmHWM). The last size also runs under MGG_MEMORY_LIMIT set below the whole read's
need: the whole read is refused, the streamed one fits.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mgg.memory import csr_bytes

from common import RESULTS, write_results

WHOLE = """
import sys, json
from mgg.graph.formats import read_ogb, write_graph
from mgg.memory import peak_rss_mb
write_graph(read_ogb(sys.argv[1]), sys.argv[2])
print(json.dumps({"peak_rss_mb": peak_rss_mb()}))
"""


def write_dir(root: Path, e: int, f: int, seed: int = 0) -> int:
    """An ogbn_products-like CSV directory of e edge lines; returns N."""
    n = max(16, e // 16)
    rng = np.random.default_rng(seed)
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    step = 1 << 20
    with gzip.open(raw / "edge.csv.gz", "wt", compresslevel=1) as out:
        for a in range(0, e, step):
            k = min(step, e - a)
            src, dst = rng.integers(0, n, k), rng.integers(0, n, k)
            out.write(
                "\n".join(f"{u},{v}" for u, v in zip(src.tolist(), dst.tolist(), strict=True))
                + "\n"
            )
    with gzip.open(raw / "node-feat.csv.gz", "wt", compresslevel=1) as out:
        for a in range(0, n, step):
            x = rng.standard_normal((min(step, n - a), f)).round(4)
            np.savetxt(out, x, fmt="%.4f", delimiter=",")
    for name, text in (("num-node-list", f"{n}\n"), ("num-edge-list", f"{e}\n")):
        with gzip.open(raw / f"{name}.csv.gz", "wt") as out:
            out.write(text)
    with gzip.open(raw / "node-label.csv.gz", "wt", compresslevel=1) as out:
        np.savetxt(out, rng.integers(0, 47, n), fmt="%d")
    perm = rng.permutation(n)
    split = root / "split" / "sales_ranking"
    split.mkdir(parents=True, exist_ok=True)
    for part, ids in zip(
        ("train", "valid", "test"), np.split(perm, [n // 10, n // 5]), strict=True
    ):
        with gzip.open(split / f"{part}.csv.gz", "wt") as out:
            np.savetxt(out, np.sort(ids), fmt="%d")
    return n


def run(argv, env=None) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode:
        return {"ok": False, "seconds": wall, "error": r.stderr.strip().splitlines()[-1]}
    return {"ok": True, "seconds": wall, **json.loads(r.stdout.strip().splitlines()[-1])}


def main():

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", default="2e6,8e6,32e6")
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--limit", default="600M", help="MGG_MEMORY_LIMIT of the streamed runs")
    ap.add_argument("--work", default="/tmp/mgg-ogb-convert")
    args = ap.parse_args()
    work = Path(args.work)
    rows, raw = [], []
    mgg = str(Path(sys.executable).parent / "mgg")
    sizes = [int(float(s)) for s in args.edges.split(",")]
    limit = dict(os.environ, MGG_MEMORY_LIMIT=args.limit)
    for e in sizes:
        root = work / f"e{e}" / "ogbn_products"
        if not (root / "raw" / "num-edge-list.csv.gz").exists():
            n = write_dir(root, e, args.features)
        else:
            n = max(16, e // 16)
        streamed = run([mgg, "convert", str(root), str(work / "s.npz"), "--json"], env=limit)
        whole = run([sys.executable, "-c", WHOLE, str(root), str(work / "w.npz")])
        same = streamed["ok"] and whole["ok"] and _same(work / "s.npz", work / "w.npz")
        graph_mb = csr_bytes(n, streamed.get("num_edges", 2 * e), build=False) / 2**20
        row = {
            "edges (lines)": e,
            "nodes": n,
            "CSR entries": streamed.get("num_edges"),
            "graph_mb": graph_mb,
            "streamed_s": streamed["seconds"],
            "streamed_peak_mb": streamed.get("peak_rss_mb"),
            "ranges": streamed.get("streamed", {}).get("ranges"),
            "whole_s": whole["seconds"],
            "whole_peak_mb": whole.get("peak_rss_mb"),
            "same_arrays": same,
        }
        rows.append(row)
        raw.append({"edges": e, "streamed": streamed, "whole": whole})
        print(json.dumps(row), flush=True)
    # the largest, read whole under the streamed runs' limit
    root = work / f"e{sizes[-1]}" / "ogbn_products"
    refused = run([sys.executable, "-c", WHOLE, str(root), str(work / "w.npz")], env=limit)
    print(json.dumps(refused), flush=True)
    notes = (
        f"`ogbn_products`-named OGB directories (gzip CSV, add_inverse_edge) of E edge lines "
        f"on E / 16 nodes, {args.features} features, labels, a split. streamed: `mgg convert "
        "DIR out.npz` under MGG_MEMORY_LIMIT="
        f"{args.limit} (two passes over the edges; row ranges of at most the chunk that "
        "limit leaves, sorted one at a time from scratch files beside the output; features "
        "streamed into the stored archive); whole: `read_ogb` + `write_graph` in one "
        "process (what convert did before), without a limit. Peak RSS: VmHWM of each "
        "process (about 165 MB of it is Python, numpy and numba). graph_mb: the CSR alone "
        "(int64 indptr, int32 indices). same_arrays: the two .npz hold equal arrays. The "
        f"largest read whole under MGG_MEMORY_LIMIT={args.limit}: "
        + ("fits." if refused["ok"] else f"refused (`{refused['error'][:200]}`).")
    )
    cols = ["edges (lines)", "nodes", "CSR entries", "graph_mb", "streamed_s"]
    cols += ["streamed_peak_mb", "ranges", "whole_s", "whole_peak_mb", "same_arrays"]
    write_results("ogb_convert", {"runs": raw, "whole_limited": refused}, rows, cols, notes=notes)
    plot(rows)
    shutil.rmtree(work / "s.npz", ignore_errors=True)


def _same(a, b) -> bool:
    with np.load(a) as za, np.load(b) as zb:
        if set(za.files) != set(zb.files):
            return False
        return all(np.array_equal(za[k], zb[k]) for k in za.files if k != "meta")


def plot(rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    es = [r["edges (lines)"] / 1e6 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(es, [r["streamed_peak_mb"] for r in rows], "o-", label="mgg convert (streamed)")
    ax.plot(es, [r["whole_peak_mb"] for r in rows], "s-", label="read whole + write")
    ax.plot(es, [r["graph_mb"] for r in rows], "k:", label="the CSR alone")
    ax.set_xscale("log")
    ax.set_xticks(es, [f"{e:g}" for e in es])
    ax.minorticks_off()
    ax.set_xlabel("edge lines (millions)")
    ax.set_ylabel("peak RSS, MB")
    ax.set_title("OGB directory -> .npz: memory against edges")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "ogb_convert.png", dpi=120)


if __name__ == "__main__":
    main()
