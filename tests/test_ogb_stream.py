"""OGB directories converted in bounded memory (issue 54, item 2): the streamed .npz and
MGG binary CSR equal what the in-memory reader makes, in many row ranges and parser
blocks; the peak does not grow with the edges; bad directories are named and leave
nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_ogb import gz, masks_of, ogb_dir, raises_at, random_edges, random_split, symmetric_oracle

from mgg.cli import main
from mgg.graph import Graph, GraphError
from mgg.graph.formats import ogb_stream as stream
from mgg.graph.formats import read_mgg_bin, read_npz, read_ogb, textlines
from mgg.graph.formats.ogb_stream import convert_ogb


@pytest.fixture
def small_blocks(monkeypatch):
    """Parser blocks of 2 KiB and member reads of 64 elements: many of each."""
    monkeypatch.setattr(textlines, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(stream, "_BLOCK", 64)


def graph_case(tmp_path, name, *, binary=False, fortran=False, n=300, e=2000, seed=0):
    """An OGB directory with duplicate edges, self loops, features, labels (some NaN:
    unlabeled) and a split; returns (root, src, dst, n, x, labels, split)."""
    rng = np.random.default_rng(seed)
    src, dst = random_edges(rng, n, e)
    src[:50], dst[:50] = src[50:100], dst[50:100]  # duplicates
    dst[100:110] = src[100:110]  # self loops
    x = rng.standard_normal((n, 3)).astype(np.float32)
    labels = rng.integers(0, 40, n).astype(np.float64)
    labels[::7] = np.nan
    split = random_split(n, rng)
    root = ogb_dir(tmp_path, name, src, dst, n, x=x, labels=labels, split=split, binary=binary)
    if fortran:  # edge_index saved column-major, as a transposed array is
        path = root / "raw" / "data.npz"
        arrays = dict(np.load(path))
        arrays["edge_index"] = np.asfortranarray(arrays["edge_index"])
        np.savez(path, **arrays)
    return root, src, dst, n, x, labels, split


def assert_same_dataset(got, want):
    assert got.graph.num_nodes == want.graph.num_nodes
    np.testing.assert_array_equal(got.graph.indptr, want.graph.indptr)
    np.testing.assert_array_equal(got.graph.indices, want.graph.indices)
    assert bool(got.graph.symmetric) == bool(want.graph.symmetric)
    np.testing.assert_array_equal(got.x, want.x)
    np.testing.assert_array_equal(got.y, want.y)
    for a, b in zip(
        (got.train_mask, got.val_mask, got.test_mask),
        (want.train_mask, want.val_mask, want.test_mask),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    assert got.num_classes == want.num_classes and got.name == want.name
    for k in ("task", "split", "unlabeled_nodes", "eval_metric"):
        assert got.meta[k] == want.meta[k], k


@pytest.mark.parametrize(
    "name, binary, fortran",
    [
        ("ogbn_arxiv", False, False),  # directed: rows keep the file's order and duplicates
        ("ogbn_products", False, False),  # add_inverse_edge: both directions, merged
        ("ogbn_products", True, False),  # raw/data.npz
        ("ogbn_arxiv", True, True),  # edge_index column-major
    ],
)
def test_the_streamed_npz_equals_the_in_memory_read(tmp_path, small_blocks, name, binary, fortran):
    root, src, dst, n, x, labels, split = graph_case(tmp_path, name, binary=binary, fortran=fortran)
    out = tmp_path / "out.npz"
    res = convert_ogb(root, out, chunk=300)
    got = read_npz(out)
    assert res["ranges"] > 5 and res["num_edges"] == got.graph.num_edges
    assert_same_dataset(got, read_ogb(root))
    # and against the test's own oracle of the graph
    if name == "ogbn_products":
        want = symmetric_oracle(src, dst, n)
    else:
        want = Graph.from_edges(src, dst, n)
    np.testing.assert_array_equal(got.graph.indptr, want.indptr)
    np.testing.assert_array_equal(got.graph.indices, want.indices)
    labeled = ~np.isnan(labels)
    np.testing.assert_array_equal(got.y[labeled], labels[labeled].astype(np.int64))
    for m, want_m in zip(
        (got.train_mask, got.val_mask, got.test_mask), masks_of(split, n), strict=True
    ):
        np.testing.assert_array_equal(m, want_m & labeled)
    np.testing.assert_array_equal(got.x, x)
    with np.load(out) as z:  # stored: the distributed partitioner seeks in it
        assert all(i.compress_type == 0 for i in z.zip.infolist())


def test_edge_feature_means_and_multilabel_targets_stream(tmp_path, small_blocks):
    """ogbn-proteins' recipe: x is the mean of each node's edge features, each edge
    standing for its reverse too; the feature blocks do not line up with the edge blocks."""
    rng = np.random.default_rng(1)
    n, e = 80, 900
    src, dst = random_edges(rng, n, e)
    ef = rng.random((e, 8)).round(3).astype(np.float32)
    y = rng.integers(0, 2, (n, 112)).astype(np.float64)
    split = random_split(n, rng)
    root = ogb_dir(
        tmp_path, "ogbn_proteins", src, dst, n, labels=y, split=split, split_name="species",
        edge_feat=ef,
    )  # fmt: skip
    out = tmp_path / "p.npz"
    convert_ogb(root, out, chunk=200)
    got, want = read_npz(out), read_ogb(root)
    np.testing.assert_array_equal(got.graph.indices, want.graph.indices)
    np.testing.assert_array_equal(got.y, want.y)
    sums = np.zeros((n, 8))  # the test's own mean
    np.add.at(sums, dst, ef)
    np.add.at(sums, src, ef)
    deg = np.bincount(dst, minlength=n) + np.bincount(src, minlength=n)
    np.testing.assert_allclose(got.x, sums / np.maximum(deg, 1)[:, None], rtol=1e-6)
    assert "mean of the 8 edge features" in got.meta["features"]


def test_the_cli_streams_to_the_mgg_binary_and_names_what_it_drops(tmp_path, capsys):
    root, src, dst, n, *_ = graph_case(tmp_path, "ogbn_products")
    prefix = tmp_path / "g_beg_pos.bin"
    assert main(["convert", f"{root}:split=time", str(prefix), "--json"]) == 0
    out, err = capsys.readouterr()
    res = json.loads(out.strip().splitlines()[-1])
    assert res["streamed"]["ranges"] >= 1 and res["peak_rss_mb"] > 0
    assert "cannot hold the features, labels, split masks" in err
    g = read_mgg_bin(prefix)
    want = symmetric_oracle(src, dst, n)
    assert res["num_edges"] == want.num_edges
    np.testing.assert_array_equal(g.indptr, want.indptr)
    np.testing.assert_array_equal(g.indices, want.indices)
    assert sorted(os.listdir(tmp_path)) == sorted(["ogbn_products", prefix.name, "g_csr.bin"])


PEAK = """
import sys
from mgg.graph.formats import textlines, read_ogb
from mgg.graph.formats.ogb_stream import convert_ogb
from mgg.memory import peak_rss_mb
textlines.CHUNK_BYTES = 1 << 16
if sys.argv[2] == "stream":
    convert_ogb(sys.argv[1], sys.argv[1] + ".npz", chunk=1 << 14)
else:
    read_ogb(sys.argv[1])
print(peak_rss_mb())
"""


@pytest.mark.slow
def test_the_streamed_peak_does_not_grow_with_the_edges(tmp_path):
    """8x the edges on the same nodes: the in-memory reader's peak grows by tens of MB
    (so the measure sees O(E)); the streamed conversion's by at most 4 MB."""
    rng = np.random.default_rng(2)
    n = 20_000
    peaks = {}
    for e in (200_000, 1_600_000):
        root = tmp_path / f"ogbn_arxiv_{e}"
        (root / "raw").mkdir(parents=True)
        src, dst = random_edges(rng, n, e)
        text = np.char.add(np.char.add(src.astype("U6"), ","), dst.astype("U6"))
        gz(root / "raw" / "edge.csv.gz", "\n".join(text.tolist()) + "\n")
        gz(root / "raw" / "num-node-list.csv.gz", f"{n}\n")
        gz(root / "raw" / "num-edge-list.csv.gz", f"{e}\n")
        for how in ("stream", "memory"):
            r = subprocess.run(
                [sys.executable, "-c", PEAK, str(root), how], capture_output=True, text=True
            )
            assert r.returncode == 0, r.stderr[-2000:]
            peaks[how, e] = float(r.stdout.split()[-1])
    grew = {how: peaks[how, 1_600_000] - peaks[how, 200_000] for how in ("stream", "memory")}
    assert grew["memory"] > 20, (grew, peaks)
    assert grew["stream"] < 4, (grew, peaks)


# ---- bad directories ------------------------------------------------------------------------
def left_in(folder, *keep):
    return sorted(set(os.listdir(folder)) - set(keep))


@pytest.mark.parametrize("declared, found", [(2001, 2000), (1999, 2000)])
def test_an_edge_count_that_disagrees_is_named_and_leaves_nothing(tmp_path, declared, found):
    root, *_ = graph_case(tmp_path, "ogbn_arxiv")
    gz(root / "raw" / "num-edge-list.csv.gz", f"{declared}\n")
    raises_at(
        lambda: convert_ogb(root, tmp_path / "o.npz"),
        root / "raw" / "edge.csv.gz",
        "line",
        rf"edges, but num-edge-list.csv.gz says {declared}",
    )
    assert left_in(tmp_path) == ["ogbn_arxiv"]


def test_ids_features_and_binary_counts_that_disagree_are_named(tmp_path, small_blocks):
    root, src, dst, n, x, *_ = graph_case(tmp_path, "ogbn_arxiv")
    bad = dst.copy()
    bad[1500] = n
    edges = "".join(f"{u},{v}\n" for u, v in zip(src, bad, strict=True))
    gz(root / "raw" / "edge.csv.gz", edges)
    raises_at(
        lambda: convert_ogb(root, tmp_path / "o.npz"),
        root / "raw" / "edge.csv.gz",
        "line 1501",
        rf"node id {n} in column 2 is >= num_nodes = {n}",
    )
    gz(root / "raw" / "edge.csv.gz", edges.replace(f",{n}\n", ",0\n"))
    gz(root / "raw" / "node-feat.csv.gz", "".join("1,2,3\n" for _ in range(n - 2)))
    raises_at(  # found only while the features stream into the archive
        lambda: convert_ogb(root, tmp_path / "o.npz", chunk=100),
        root / "raw" / "node-feat.csv.gz",
        "line",
        rf"{n - 2} lines, expected one row per node \({n} nodes\)",
    )
    assert left_in(tmp_path) == ["ogbn_arxiv"]
    broot, *_ = graph_case(tmp_path, "bin/ogbn_arxiv", binary=True)
    path = broot / "raw" / "data.npz"
    arrays = dict(np.load(path))
    arrays["num_edges_list"] = np.array([len(src) + 5])
    np.savez(path, **arrays)
    with pytest.raises(GraphError, match=r"key 'edge_index': 2000 edges, but num_edges_list"):
        convert_ogb(broot, tmp_path / "o.npz")
    assert left_in(tmp_path) == ["bin", "ogbn_arxiv"]
