"""Import throughput: mgg's readers of OGB directories and SNAP edge lists vs pandas.read_csv.

    python bench/import_throughput.py [--scale 19] [--features 32] [--repeat 3]

An R-MAT graph (2**scale nodes, about 16 edges per node, directed) is written as an OGB
directory (raw/edge.csv.gz, raw/node-feat.csv.gz with F float columns, labels, a split)
and as a SNAP edge list (plain and gzip). Each file is read by mgg and by pandas.read_csv
(the C parser, as OGB's own loader reads these files), timed round-robin (medians).
pandas only parses; mgg's SNAP row builds the CSR too, and the read_ogb row is the whole
Dataset (edges, features, labels, masks, CSR) against pandas parsing the same files.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from mgg.graph.formats import read_edgelist, read_ogb, write_edgelist
from mgg.graph.formats._csv import read_csv_rows
from mgg.graph.formats.ogb import _read_edges
from mgg.graph.generators import rmat

from common import compare, write_results

ROWS = 1 << 20


def csv_text(cols, fmt: str) -> bytes:
    """Lines of comma-separated columns, formatted in blocks (no Python object per value
    survives a block)."""
    n = cols[0].shape[0]
    out = []
    for a in range(0, n, ROWS):
        b = min(a + ROWS, n)
        block = np.stack([c[a:b] for c in cols], axis=1)
        line = ",".join([fmt] * block.shape[1]) + "\n"
        out.append((line * (b - a) % tuple(block.ravel().tolist())).encode())
    return b"".join(out)


def write_gz(path: Path, data: bytes) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, 6))
    return len(data)


def build(tmp: Path, scale: int, features: int):
    g = rmat(scale, 16, symmetric=False)
    n, e = g.num_nodes, g.num_edges
    src, dst = g.edges()
    rng = np.random.default_rng(0)
    root = tmp / "rmat_ogb"
    raw = root / "raw"
    size = {
        "edge": write_gz(raw / "edge.csv.gz", csv_text([src, dst], "%d")),
        "feat": write_gz(
            raw / "node-feat.csv.gz",
            csv_text(list(rng.standard_normal((features, n)).astype(np.float32)), "%.6f"),
        ),
        "label": write_gz(raw / "node-label.csv.gz", csv_text([rng.integers(0, 47, n)], "%d")),
    }
    write_gz(raw / "num-node-list.csv.gz", b"%d\n" % n)
    write_gz(raw / "num-edge-list.csv.gz", b"%d\n" % e)
    perm = rng.permutation(n)
    for part, ids in zip(("train", "valid", "test"), np.array_split(perm, 3), strict=True):
        write_gz(root / "split" / "random" / f"{part}.csv.gz", csv_text([ids], "%d"))
    snap = tmp / "rmat.txt"
    write_edgelist(g, snap)  # "# Nodes: .." header, "src dst" lines
    write_edgelist(g, tmp / "rmat.txt.gz")
    size["snap"] = os.path.getsize(snap)
    return root, snap, n, e, size


def row(name, reader, seconds, rows, mb, pandas_s=None, **extra):
    r = {
        "file": name,
        "reader": reader,
        "rows": rows,
        "MB": mb,
        "seconds": seconds,
        "Mrows_per_s": rows / seconds / 1e6,
        "MB_per_s": mb / seconds,
        **extra,
    }
    if pandas_s is not None:
        r["speedup_vs_pandas"] = pandas_s / seconds
    print(
        f"{name:>22} {reader:>28} {seconds:7.3f} s  {r['Mrows_per_s']:7.2f} M rows/s  "
        f"{r['MB_per_s']:7.1f} MB/s" + (f"  x{r['speedup_vs_pandas']:.2f}" if pandas_s else ""),
        flush=True,
    )
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=19)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mgg-import-"))
    try:
        root, snap, n, e, size = build(tmp, args.scale, args.features)
        raw = root / "raw"
        mb = {k: v / 1e6 for k, v in size.items()}
        print(f"{n:,} nodes, {e:,} edges, {args.features} features; files in {tmp}")
        rows = []

        def pair(name, mgg_name, mgg_fn, pandas_fn, nrows, megabytes, **extra):
            fns = {"mgg": mgg_fn, "pandas": pandas_fn}
            path = raw / name if (raw / name).exists() else tmp / name
            if name.endswith(".gz"):  # one thread decompresses: a bound for both readers
                fns["gunzip"] = lambda: gzip.open(path).read()
            t = compare(fns, repeat=args.repeat, warmup=1)
            if "gunzip" in t:
                rows.append(row(name, "gunzip alone (bound)", t["gunzip"], nrows, megabytes))
            rows.append(row(name, "pandas.read_csv", t["pandas"], nrows, megabytes, **extra))
            rows.append(row(name, mgg_name, t["mgg"], nrows, megabytes, t["pandas"], **extra))
            return t

        t_edge = pair(
            "edge.csv.gz",
            "read_ogb's edge parser",
            lambda: _read_edges(raw / "edge.csv.gz", n, e),
            lambda: pd.read_csv(raw / "edge.csv.gz", header=None).values,
            e,
            mb["edge"],
        )
        t_feat = pair(
            "node-feat.csv.gz",
            "read_ogb's feature parser",
            lambda: read_csv_rows(raw / "node-feat.csv.gz", n),
            lambda: pd.read_csv(raw / "node-feat.csv.gz", header=None, dtype=np.float32).values,
            n,
            mb["feat"],
            values=n * args.features,
        )
        t_label = compare(
            {"pandas": lambda: pd.read_csv(raw / "node-label.csv.gz", header=None).values},
            repeat=args.repeat,
        )["pandas"]
        for name in ("rmat.txt", "rmat.txt.gz"):
            pair(
                name,
                "read_edgelist (to CSR)",
                lambda: read_edgelist(tmp / name),
                lambda: pd.read_csv(tmp / name, sep=" ", comment="#", header=None).values,
                e,
                mb["snap"],
            )
        t_ogb = compare({"read_ogb": lambda: read_ogb(root)}, repeat=args.repeat)["read_ogb"]
        pandas_parse = t_edge["pandas"] + t_feat["pandas"] + t_label
        rows.append(
            row(
                "OGB directory",
                "read_ogb (whole Dataset)",
                t_ogb,
                e,
                mb["edge"] + mb["feat"] + mb["label"],
                pandas_parse,
            )
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_results(
        "import_throughput",
        {"scale": args.scale, "num_nodes": n, "num_edges": e, "features": args.features},
        rows,
        [
            "file",
            "reader",
            "rows",
            "MB",
            "seconds",
            "Mrows_per_s",
            "MB_per_s",
            "speedup_vs_pandas",
        ],
        notes=f"R-MAT scale {args.scale}: {n:,} nodes, {e:,} edges; node-feat.csv.gz has "
        f"{args.features} float columns ('%.6f'). MB: decompressed text. Medians of "
        f"{args.repeat} round-robin runs. speedup_vs_pandas = pandas seconds / mgg seconds "
        "(> 1: mgg faster). 'gunzip alone' inflates without parsing: a bound for both "
        "readers of a .gz file (one thread inflates). pandas only parses, while mgg's "
        "read_edgelist also builds the CSR and read_ogb the whole Dataset (its pandas time: "
        "edge, feature and label files parsed).",
    )


if __name__ == "__main__":
    main()
