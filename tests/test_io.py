"""Readers and writers in mgg.graph.formats: round trips, malformed input, the shared datasets."""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from mgg.graph import Dataset, Graph, GraphError
from mgg.graph.formats import (
    read_dataset,
    read_edgelist,
    read_graph,
    read_metis,
    read_mgg_bin,
    read_npz,
    textlines,
    write_edgelist,
    write_graph,
    write_metis,
    write_mgg_bin,
    write_npz,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


# ---- helpers ------------------------------------------------------------------------------
def random_graph(n=40, e=200, weighted=False, seed=0) -> Graph:
    rng = np.random.default_rng(seed)
    w = rng.random(e).astype(np.float32) + 0.25 if weighted else None
    return Graph.from_edges(rng.integers(0, n, e), rng.integers(0, n, e), n, w)


def undirected_graph(n=30, e=120, weighted=False, seed=1) -> Graph:
    """Symmetric, no self loops; integer weights shared by both directions of an edge."""
    rng = np.random.default_rng(seed)
    u, v = rng.integers(0, n, e), rng.integers(0, n, e)
    keep = u != v
    u, v = np.minimum(u, v)[keep], np.maximum(u, v)[keep]
    pairs = np.unique(np.stack([u, v], 1), axis=0)
    u, v = pairs[:, 0], pairs[:, 1]
    w = None
    if weighted:
        w = rng.integers(1, 9, u.size).astype(np.float32)
        w = np.concatenate([w, w])
    g = Graph.from_edges(np.concatenate([u, v]), np.concatenate([v, u]), n, w)
    g.symmetric = True
    return g


def assert_same_graph(a: Graph, b: Graph, weights=True):
    assert a.num_nodes == b.num_nodes
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    if weights:
        assert (a.weights is None) == (b.weights is None)
        if a.weights is not None:
            np.testing.assert_array_equal(a.weights, b.weights)


def write(tmp_path, name, text) -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def raises_at(fn, path, where, match=None):
    """fn() raises GraphError naming ``path`` and ``where`` (e.g. 'line 3'); returns the text."""
    with pytest.raises(GraphError) as info:
        fn()
    msg = str(info.value)
    assert str(path) in msg, msg
    assert where in msg, msg
    if match is not None:
        assert re.search(match, msg), msg
    return msg


# ---- edge lists: reading ----------------------------------------------------------------
def test_edgelist_basic_direction_and_comments(tmp_path):
    p = write(tmp_path, "g.txt", "# a comment\n% another\n\n0 1\n  2\t1  \n\n1 3\r\n")
    g = read_edgelist(p)
    assert g.num_nodes == 4 and g.num_edges == 3
    np.testing.assert_array_equal(g.indptr, [0, 0, 2, 2, 3])
    np.testing.assert_array_equal(g.indices, [0, 2, 1])
    assert g.weights is None and g.symmetric is None


def test_edgelist_comma_separated_and_weights(tmp_path):
    p = write(tmp_path, "g.csv", "0,1,0.5\n1, 2, 1e-3\n2,0,-7\n")
    g = read_edgelist(p)
    assert g.num_edges == 3
    src, dst = g.edges()
    assert sorted(zip(src.tolist(), dst.tolist(), g.weights.tolist(), strict=True)) == [
        (0, 1, 0.5),
        (1, 2, pytest.approx(1e-3)),
        (2, 0, -7.0),
    ]


def test_edgelist_explicit_delimiter(tmp_path):
    p = write(tmp_path, "g.txt", "0;1\n1;2\n")
    g = read_edgelist(p, delimiter=";")
    assert g.num_edges == 2
    np.testing.assert_array_equal(g.indices, [0, 1])


def test_edgelist_big_integer_weight(tmp_path):
    p = write(tmp_path, "g.txt", "0 1 1\n1 2 99999999999999999999999\n")
    np.testing.assert_array_equal(read_edgelist(p).weights, np.float32([1, 1e23]))


def test_edgelist_num_nodes_and_header(tmp_path):
    p = write(tmp_path, "g.txt", "0 1\n")
    assert read_edgelist(p, num_nodes=10).num_nodes == 10
    p = write(tmp_path, "h.txt", "# Nodes: 7 Edges: 1\n0 1\n")
    assert read_edgelist(p).num_nodes == 7
    p = write(tmp_path, "h2.txt", "# Nodes: 2 Edges: 1\n0 5\n")
    with pytest.raises(GraphError, match=r"h2.txt: line 2: node id 5 .* >= 2, .*header on line 1"):
        read_edgelist(p)


def test_edgelist_undirected(tmp_path):
    p = write(tmp_path, "g.txt", "0 1\n1 0\n1 2\n2 2\n")
    g = read_edgelist(p, directed=False)
    assert g.symmetric is True
    np.testing.assert_array_equal(g.indptr, [0, 1, 3, 5])
    np.testing.assert_array_equal(g.indices, [1, 0, 2, 1, 2])
    assert_same_graph(g, read_edgelist(p).symmetrize())


def test_edgelist_undirected_weighted(tmp_path):
    p = write(tmp_path, "g.txt", "0 1 2.5\n1 0 2.5\n1 2 4\n")
    g = read_edgelist(p, directed=False)
    assert g.symmetric is True
    np.testing.assert_array_equal(g.indices, [1, 0, 2, 1])
    np.testing.assert_array_equal(g.weights, [2.5, 2.5, 4, 4])
    p = write(tmp_path, "bad.txt", "0 1 2.5\n1 2 4\n1 0 3\n")
    raises_at(lambda: read_edgelist(p, directed=False), p, "line 3", r"weight 3 .* line 1")


def test_edgelist_gzip_by_suffix_and_by_magic(tmp_path):
    text = b"# x\n0 1\n1 2\n"
    p = tmp_path / "g.txt.gz"
    p.write_bytes(gzip.compress(text))
    q = tmp_path / "g_no_suffix.txt"
    q.write_bytes(gzip.compress(text))
    for path in (p, q):
        g = read_edgelist(path)
        assert g.num_edges == 2
        np.testing.assert_array_equal(g.indices, [0, 1])


@pytest.mark.parametrize("weighted", [False, True])
def test_edgelist_chunked_matches_whole(tmp_path, monkeypatch, weighted):
    g = random_graph(n=500, e=3000, weighted=weighted, seed=3)
    p = tmp_path / "g.txt"
    write_edgelist(g, p)
    text = p.read_bytes().replace(b"\n", b"\n\n# c\n", 40)
    p.write_bytes(text)
    whole = read_edgelist(p)
    monkeypatch.setattr(textlines, "CHUNK_BYTES", 1000)
    assert_same_graph(read_edgelist(p), whole)
    assert_same_graph(whole, g)


def test_edgelist_error_line_in_later_chunk(tmp_path, monkeypatch):
    lines = [f"{i} {i + 1}" for i in range(3000)]
    lines[2500] = "7 x"
    p = write(tmp_path, "g.txt", "\n".join(lines) + "\n")
    monkeypatch.setattr(textlines, "CHUNK_BYTES", 512)
    raises_at(lambda: read_edgelist(p), p, "line 2501", "'x'")
    lines[2500] = "7 8 9"
    p = write(tmp_path, "g.txt", "\n".join(lines) + "\n")
    raises_at(lambda: read_edgelist(p), p, "line 2501", "expected 2 columns as on line 1")
    lines = [f"{i} {i + 1} {i / 7}" for i in range(3000)]
    lines[2700] = "7 8 abc"
    p = write(tmp_path, "w.txt", "# header\n" + "\n".join(lines) + "\n")
    raises_at(lambda: read_edgelist(p), p, "line 2702", "weight 'abc'")


def test_edgelist_unusual_whitespace_bom_and_plus_sign(tmp_path):
    p = write(tmp_path, "g.txt", "\ufeff0\x0b1\n+1\x0c2\n")
    g = read_edgelist(p)
    np.testing.assert_array_equal(g.indices, [0, 1])
    np.testing.assert_array_equal(g.indptr, [0, 0, 1, 2])


# ---- edge lists: round trips -------------------------------------------------------------
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", ["g.txt", "g.el.gz"])
def test_edgelist_round_trip(tmp_path, weighted, name):
    g = random_graph(weighted=weighted)
    p = tmp_path / name
    write_edgelist(g, p)
    h = read_edgelist(p)
    assert_same_graph(g, h)


def test_edgelist_round_trip_keeps_isolated_tail_and_empty(tmp_path):
    g = Graph.from_edges([0], [1], 9)
    write_edgelist(g, tmp_path / "g.txt")
    assert read_edgelist(tmp_path / "g.txt").num_nodes == 9
    e = Graph.from_edges(np.empty(0, int), np.empty(0, int), 4)
    write_edgelist(e, tmp_path / "e.txt")
    h = read_edgelist(tmp_path / "e.txt")
    assert h.num_nodes == 4 and h.num_edges == 0


# ---- edge lists: malformed input ---------------------------------------------------------
@pytest.mark.parametrize(
    "text, where, match",
    [
        ("", "line 1", "no edges"),
        ("# only\n% comments\n\n", "line 3", "no edges"),
        ("0 1\n1 x\n", "line 2", "'x' in column 2 is not a non-negative integer"),
        ("0 1\n1.5 2\n", "line 2", "'1.5' in column 1"),
        ("0 1\n2 -3\n", "line 2", "negative node id '-3'"),
        ("0 1\n2\n", "line 2", "expected 2 columns as on line 1, found 1"),
        ("0\n", "line 1", "expected 2 or 3 columns"),
        ("\n0 1 2 3\n", "line 2", "expected 2 or 3 columns"),
        ("0 1\n1 2 0.5\n", "line 2", "expected 2 columns as on line 1, found 3"),
        ("0 1 0.5\n1 2\n", "line 2", "expected 3 columns as on line 1, found 2"),
        ("0 1 0.5\n1 2 abc\n", "line 2", "weight 'abc' in column 3 is not a number"),
        ("0 1 0.5\n1 2 nan\n", "line 2", "not a finite"),
        ("0 1 1\n1 2 1e300\n", "line 2", "not a finite float32"),
        ("0 1\n99999999999999999999999 2\n", "line 2", "too large"),
        ("0,1\n1,,2\n", "line 2", "empty field"),
        ("0 1\n1 2 # trailing comment\n", "line 2", "comment '#' after data"),
    ],
)
def test_edgelist_malformed(tmp_path, text, where, match):
    p = write(tmp_path, "bad.txt", text)
    raises_at(lambda: read_edgelist(p), p, where, match)


def test_edgelist_id_beyond_num_nodes(tmp_path):
    p = write(tmp_path, "g.txt", "0 1\n1 2\n4 0\n")
    raises_at(
        lambda: read_edgelist(p, num_nodes=4),
        p,
        "line 3",
        "node id 4 in column 1 is >= num_nodes = 4",
    )
    p = write(tmp_path, "w.txt", "0 1 0.5\n1 9 1.5\n")
    raises_at(lambda: read_edgelist(p, num_nodes=4), p, "line 2", ">= num_nodes")


def test_edgelist_missing_and_truncated_gzip(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_edgelist(tmp_path / "nope.txt")
    data = gzip.compress(b"".join(b"%d %d\n" % (i, i + 1) for i in range(5000)))
    p = write(tmp_path, "t.txt.gz", data[: len(data) // 2])
    raises_at(lambda: read_edgelist(p), p, "byte offset", "gzip")


# ---- METIS ------------------------------------------------------------------------------
def test_metis_read_basic(tmp_path):
    p = write(tmp_path, "g.graph", "% comment\n4 2\n2 3\n1\n1\n\n")
    g = read_metis(p)
    assert g.symmetric is True and g.num_nodes == 4 and g.num_edges == 4
    np.testing.assert_array_equal(g.indptr, [0, 2, 3, 4, 4])
    np.testing.assert_array_equal(g.indices, [1, 2, 0, 0])


def test_metis_fmt_codes(tmp_path):
    plain = read_metis(write(tmp_path, "a.graph", "3 2\n2\n1 3\n2\n"))
    ew = read_metis(write(tmp_path, "b.graph", "3 2 1\n2 5\n1 5 3 7\n2 7\n"))
    np.testing.assert_array_equal(ew.weights, [5, 5, 7, 7])
    vw = read_metis(write(tmp_path, "c.graph", "3 2 10\n4 2\n1 1 3\n9 2\n"))
    vw2 = read_metis(write(tmp_path, "d.graph", "3 2 011 2\n4 4 2 5\n1 1 1 5 3 7\n9 9 2 7\n"))
    vs = read_metis(write(tmp_path, "e.graph", "3 2 100\n1 2\n1 1 3\n1 2\n"))
    for g in (ew, vw, vw2, vs):
        assert_same_graph(plain, g, weights=False)
    np.testing.assert_array_equal(vw2.weights, [5, 5, 7, 7])


@pytest.mark.parametrize("weighted", [False, True])
def test_metis_round_trip(tmp_path, weighted):
    g = undirected_graph(weighted=weighted)
    for name in ("g.graph", "g.metis.gz"):
        write_metis(g, tmp_path / name)
        h = read_metis(tmp_path / name)
        assert_same_graph(g, h)
        assert h.symmetric is True


@pytest.mark.parametrize(
    "text, where, match",
    [
        ("", "line 1", "expected a header"),
        ("% c\n\n", "line 2", "expected a header"),
        ("3 x\n", "line 1", "expected a header"),
        ("3 2 21\n2\n1 3\n2\n", "line 1", "fmt '21'"),
        ("3 2 0 2\n2\n1 3\n2\n", "line 1", "ncon"),
        ("4 2\n2\n1 3\n2\n", "line 4", "declares 4 vertices but the file has 3 vertex lines"),
        ("2 1\n2\n1\n1\n", "line 4", "more than 2 vertex lines"),
        ("3 3\n2\n1 3\n2\n", "line 1", "2m = 6 adjacency entries, but the vertex lines hold 4"),
        ("3 2\n2\n0 3\n2\n", "line 3", "neighbour id 0 is outside \\[1, 3\\]"),
        ("3 2\n2\n1 4\n2\n", "line 3", "neighbour id 4 is outside"),
        ("3 2\n2\n1 x\n2\n", "line 3", "'x' is not a non-negative integer"),
        ("3 2\n2\n1 -3\n2\n", "line 3", "'-3'"),
        ("3 2\n2\n2 3\n1\n", "line 3", "vertex 2 lists itself"),
        (
            "3 2\n2\n1 3\n1\n",
            "line 4",
            "vertex 3 lists 1 but vertex 1 \\(line 2\\) does not list 3",
        ),
        ("3 2 1\n2 5\n1 5 3\n2 7\n", "line 3", "neighbour, weight"),
        ("3 2 1\n2 5\n1 5 3 7\n2 8\n", "line", "with the same weight"),
        ("3 2 10\n1 2\n\n1 2\n", "line 3", "1 vertex size/weight values"),
    ],
)
def test_metis_malformed(tmp_path, text, where, match):
    p = write(tmp_path, "bad.graph", text)
    raises_at(lambda: read_metis(p), p, where, match)


def test_metis_writer_rejects(tmp_path):
    p = tmp_path / "w.graph"
    directed = Graph.from_edges([0, 1], [1, 2], 3)
    raises_at(lambda: write_metis(directed, p), p, "not symmetric", "edge 0->1 has no reverse")
    loop = Graph.from_edges([0, 1, 1], [1, 0, 1], 2)
    raises_at(lambda: write_metis(loop, p), p, "self loop", "node 1")
    frac = Graph.from_edges([0, 1], [1, 0], 2, [0.5, 0.5])
    raises_at(lambda: write_metis(frac, p), p, "weights[0] = 0.5", "positive integers")
    lopsided = Graph.from_edges([0, 1], [1, 0], 2, [1.0, 2.0])
    raises_at(lambda: write_metis(lopsided, p), p, "not symmetric", "same weight")


# ---- npz ---------------------------------------------------------------------------------
def save_npz(path, **arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


def small_dataset(sparse=False) -> Dataset:
    g = undirected_graph(n=12, e=40)
    rng = np.random.default_rng(5)
    x = rng.random((12, 6)).astype(np.float32)
    x[x < 0.5] = 0
    split = rng.integers(0, 4, 12)  # train, val, test or none: disjoint
    return Dataset(
        "tiny",
        g,
        sp.csr_matrix(x) if sparse else x,
        rng.integers(0, 3, 12),
        split == 0,
        split == 1,
        split == 2,
        meta={"source": "test", "nested": {"a": [1, 2]}},
    )


@pytest.mark.parametrize("sparse", [False, True])
def test_npz_round_trip(tmp_path, sparse):
    ds = small_dataset(sparse)
    p = tmp_path / "tiny.npz"
    write_npz(ds, p)
    back = read_npz(p)
    assert back.name == "tiny"
    assert_same_graph(ds.graph, back.graph)
    assert back.graph.symmetric is True
    assert sp.issparse(back.x) == sparse
    dense = (lambda a: a.toarray()) if sparse else np.asarray
    np.testing.assert_array_equal(dense(back.x), dense(ds.x))
    for k in ("y", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(back, k), getattr(ds, k))
    assert back.num_classes == ds.num_classes
    assert back.meta["source"] == "test" and back.meta["nested"] == {"a": [1, 2]}
    with np.load(p, allow_pickle=False) as z:
        assert json.loads(str(z["meta"]))["directed"] is False


def test_npz_weights_and_directed(tmp_path):
    g = random_graph(weighted=True)
    p = tmp_path / "w.npz"
    write_npz(Dataset("w", g), p)
    back = read_npz(p)
    assert_same_graph(g, back.graph)
    assert back.graph.symmetric is None and back.x is None and back.y is None


def test_npz_name_from_stem_without_meta(tmp_path):
    p = save_npz(tmp_path / "plain.npz", indptr=np.array([0, 1, 1]), indices=np.array([1]))
    ds = read_npz(p)
    assert ds.name == "plain" and ds.graph.num_edges == 1 and ds.meta == {}


def npz_case(tmp_path, **override):
    ds = small_dataset()
    g = ds.graph
    arrays = dict(
        indptr=g.indptr,
        indices=g.indices,
        x=ds.x,
        y=ds.y,
        train_mask=ds.train_mask,
        meta=np.array(json.dumps({"name": "t", "directed": False})),
    )
    arrays.update(override)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    return save_npz(tmp_path / "bad.npz", **arrays)


def test_npz_malformed(tmp_path):
    ds = small_dataset()
    n, e = ds.graph.num_nodes, ds.graph.num_edges
    cases = [
        (dict(indptr=None), "key 'indptr'", "missing"),
        (dict(indices=None), "key 'indices'", "missing"),
        (dict(indptr=ds.graph.indptr[:-1]), "indptr[-1]", "indices"),
        (dict(indices=ds.graph.indices[:-1]), "indptr[-1]", f"{e - 1} indices"),
        (
            dict(indices=np.where(np.arange(e) == 3, 99, ds.graph.indices)),
            "indices[3] = 99",
            "outside",
        ),
        (dict(indptr=ds.graph.indptr.astype(float)), "key 'indptr'", "integer"),
        (dict(y=ds.y[:-1]), "key 'y'", f"expected ({n},)"),
        (dict(y=ds.y.astype(float)), "key 'y'", "integers"),
        (dict(train_mask=ds.train_mask.astype(int)), "key 'train_mask'", "bool"),
        (dict(x=ds.x[:-1]), "key 'x'", "expected numeric features"),
        (dict(x=np.where(np.arange(6) == 4, np.nan, ds.x)), "key 'x'", "x[0, 4] is nan"),
        (
            dict(x=np.where(np.arange(6) == 1, np.float64(1e300), ds.x)),
            "key 'x'",
            "x[0, 1] is 1e+300",
        ),
        (dict(meta=np.array("{not json")), "key 'meta'", "not valid JSON"),
        (dict(meta=np.array("[1, 2]")), "key 'meta'", "JSON object"),
        (dict(weights=np.ones(e + 1, np.float32)), "weights has shape", "one per edge"),
        (
            dict(indices=ds.graph.indices[np.argsort(np.random.default_rng(0).random(e))]),
            "key 'indices'",
            "undirected but edge",
        ),
    ]
    for override, where, match in cases:
        p = npz_case(tmp_path, **override)
        raises_at(lambda p=p: read_npz(p), p, where, re.escape(match))


def test_npz_malformed_sparse_features(tmp_path):
    ds = small_dataset(sparse=True)
    x = ds.x
    base = dict(
        x=None,
        x_indptr=x.indptr.astype(np.int64),
        x_indices=x.indices,
        x_data=x.data,
        x_shape=np.array(x.shape),
    )
    nan_data = x.data.copy()
    nan_data[2] = np.nan
    bad_ind = x.indices.copy()
    bad_ind[1] = 6
    cases = [
        (dict(x_data=None), "key 'x_data'", "missing"),
        (dict(x_data=nan_data), "key 'x_data'", r"x_data\[2\] \(row \d+\) is nan"),
        (dict(x_indices=bad_ind), "key 'x_indices'", r"x_indices\[1\] = 6 is outside"),
        (dict(x_shape=np.array([11, 6])), "key 'x_shape'", "expected 12"),
        (dict(x_indptr=x.indptr[:-1]), "key 'x_indptr'", "entries, expected"),
        (dict(x_data=x.data[:-1]), "key 'x_data'", "entries but x_indices"),
        (dict(x=np.zeros((12, 6), np.float32)), "key 'x'", "both dense"),
    ]
    for override, where, match in cases:
        p = npz_case(tmp_path, **{**base, **override})
        raises_at(lambda p=p: read_npz(p), p, where, match)


def test_npz_not_an_archive(tmp_path):
    p = write(tmp_path, "junk.npz", "this is not a zip file\n")
    raises_at(lambda: read_npz(p), p, "byte offset 0", "not a readable .npz")
    p = write(tmp_path, "empty.npz", "")
    raises_at(lambda: read_npz(p), p, "byte offset 0", "not a readable .npz")
    p = tmp_path / "obj.npz"
    save_npz(
        p, indptr=np.array([0, 1]), indices=np.array([0]), y=np.array([object()], dtype=object)
    )
    raises_at(lambda: read_npz(p), p, "key 'y'", "cannot be read")


# ---- MGG binary --------------------------------------------------------------------------
def test_mgg_bin_round_trip_and_paths(tmp_path):
    g = random_graph()
    beg, csr = write_mgg_bin(g, tmp_path / "g")
    assert Path(beg).name == "g_beg_pos.bin" and Path(csr).name == "g_csr.bin"
    assert Path(beg).stat().st_size == 8 * (g.num_nodes + 1)
    np.testing.assert_array_equal(np.fromfile(csr, "<i8"), g.indices)
    for arg in (tmp_path / "g", beg, csr):
        assert_same_graph(g, read_mgg_bin(arg))
    weighted = random_graph(weighted=True)
    with pytest.warns(UserWarning, match="weights"):
        write_mgg_bin(weighted, tmp_path / "w")
    assert_same_graph(weighted, read_mgg_bin(tmp_path / "w"), weights=False)


def mgg_files(tmp_path, beg, csr, tail=b""):
    b, c = tmp_path / "m_beg_pos.bin", tmp_path / "m_csr.bin"
    b.write_bytes(np.asarray(beg, "<i8").tobytes())
    c.write_bytes(np.asarray(csr, "<i8").tobytes() + tail)
    return b, c


def test_mgg_bin_malformed(tmp_path):
    b, c = mgg_files(tmp_path, [0, 1, 3], [1, 0, 0], tail=b"xyz")
    raises_at(lambda: read_mgg_bin(b), c, "byte offset 24", "not a multiple of 8")
    b, c = mgg_files(tmp_path, [], [])
    raises_at(lambda: read_mgg_bin(b), b, "byte offset 0", "empty")
    b, c = mgg_files(tmp_path, [1, 1, 3], [1, 0, 0])
    raises_at(lambda: read_mgg_bin(b), b, "element 0 (byte offset 0)", "expected 0")
    b, c = mgg_files(tmp_path, [0, 2, 1, 3], [1, 0, 0])
    raises_at(lambda: read_mgg_bin(b), b, "element 2 (byte offset 16)", "not monotone")
    b, c = mgg_files(tmp_path, [0, 1, 4], [1, 0, 0])
    raises_at(lambda: read_mgg_bin(b), b, "element 2 (byte offset 16)", "holds 3 entries")
    b, c = mgg_files(tmp_path, [0, 1, 3], [1, 2, 0])
    raises_at(lambda: read_mgg_bin(b), c, "element 1 (byte offset 8)", r"node id 2 .* \[0, 2\)")
    b, c = mgg_files(tmp_path, [0, 1, 3], [1, -1, 0])
    raises_at(lambda: read_mgg_bin(b), c, "element 1 (byte offset 8)", "node id -1")
    c.unlink()
    with pytest.raises(FileNotFoundError):
        read_mgg_bin(b)


# ---- dispatch ----------------------------------------------------------------------------
def test_read_graph_and_dataset_dispatch(tmp_path):
    g = undirected_graph()
    paths = {
        "a.txt": write_edgelist,
        "a.tsv.gz": write_edgelist,
        "a.graph": write_metis,
        "b.metis": write_metis,
    }
    for name, writer in paths.items():
        writer(g, tmp_path / name)
        assert_same_graph(g, read_graph(tmp_path / name))
        ds = read_dataset(tmp_path / name)
        assert ds.name in ("a", "b") and ds.x is None
    write_mgg_bin(g, tmp_path / "m")
    for name in ("m", "m_beg_pos.bin", "m_csr.bin"):
        assert_same_graph(g, read_graph(tmp_path / name))
    assert read_dataset(tmp_path / "m_csr.bin").name == "m"
    ds = small_dataset()
    write_graph(ds, tmp_path / "d.npz")
    assert_same_graph(ds.graph, read_graph(tmp_path / "d.npz"))
    assert read_dataset(tmp_path / "d.npz").num_features == 6
    write_graph(g, tmp_path / "w.csv")
    assert_same_graph(g, read_graph(tmp_path / "w.csv"))
    assert read_graph(tmp_path / "a.txt", directed=False).symmetric is True


def test_write_graph_writes_each_suffix_it_reads_back_and_refuses_the_rest(tmp_path):
    """write_graph picks the format by suffix; a suffix of no format it writes (.npy, none,
    .npz.gz) is refused naming it and what it writes, and nothing is left on disk."""
    from mgg.errors import InputError
    from mgg.graph.formats import write_format

    g = undirected_graph()
    for name, fmt in {
        "a.TXT": "edgelist",
        "b.el.gz": "edgelist",
        "c.edges": "edgelist",
        "d.graph.gz": "metis",
        "e_csr.bin": "mgg",
        "f.npz": "npz",
    }.items():
        assert write_format(tmp_path / name) == fmt
        write_graph(g, tmp_path / name)
        assert_same_graph(g, read_graph(tmp_path / name))
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, suffix in {
        "x.npy": "'.npy' files",
        "x": "files without a suffix",
        "x.npz.gz": "'.npz.gz' files",
        "x.gz": "'.gz' files",
        "x.bin": "'.bin' files",
    }.items():
        with pytest.raises(InputError) as e:
            write_graph(g, tmp_path / name)
        assert str(e.value).startswith(f"{tmp_path / name}: mgg writes no {suffix}; it writes ")
        assert ".npz (everything), .txt/.csv/.tsv/.el/.edges (edge list)" in str(e.value)
    with pytest.raises(InputError, match="is a directory; write to a file: .npz"):
        write_graph(g, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ---- the shared datasets -----------------------------------------------------------------
def manifest_sizes() -> dict[str, tuple[int, int]]:
    rows = {}
    for line in (DATA / "MANIFEST.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[0].endswith(".npz"):
            rows[cells[0]] = (int(cells[1].replace(",", "")), int(cells[2].replace(",", "")))
    return rows


@pytest.fixture(scope="module")
def datasets():
    if not DATA.is_dir():
        pytest.skip(f"{DATA} is absent")
    files = sorted(DATA.glob("*.npz"))
    if not files:
        pytest.skip(f"no .npz files in {DATA}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return {f.name: read_npz(f) for f in files}


def test_real_datasets_match_manifest(datasets):
    sizes = manifest_sizes()
    assert set(datasets) <= set(sizes)
    for name, ds in datasets.items():
        n, e = sizes[name]
        assert (ds.graph.num_nodes, ds.graph.num_edges) == (n, e), name
        assert ds.name == name.removesuffix(".npz")
        assert ds.graph.symmetric is (True if ds.meta["directed"] is False else None)


def test_real_dataset_features(datasets):
    if "cora.npz" in datasets:
        cora = datasets["cora.npz"]
        assert isinstance(cora.x, np.ndarray) and cora.x.shape == (2708, 1433)
        assert cora.x.dtype == np.float32 and cora.num_classes == 7
        assert (cora.train_mask.sum(), cora.val_mask.sum(), cora.test_mask.sum()) == (
            140,
            500,
            1000,
        )
    if "coauthor_cs.npz" in datasets:
        cs = datasets["coauthor_cs.npz"]
        assert sp.issparse(cs.x) and cs.x.shape == (18333, 6805)
        assert cs.x.dtype == np.float32


def test_real_dataset_round_trip(tmp_path, datasets):
    if "cora.npz" not in datasets:
        pytest.skip("cora.npz is absent")
    cora = datasets["cora.npz"]
    write_npz(cora, tmp_path / "cora.npz")
    back = read_npz(tmp_path / "cora.npz")
    assert_same_graph(cora.graph, back.graph)
    np.testing.assert_array_equal(back.x, cora.x)
    assert back.meta["source_repo"] == cora.meta["source_repo"]
    write_edgelist(cora.graph, tmp_path / "cora.txt")
    assert_same_graph(cora.graph, read_edgelist(tmp_path / "cora.txt"))
    write_metis(cora.graph, tmp_path / "cora.graph")
    assert_same_graph(cora.graph, read_metis(tmp_path / "cora.graph"))
