import warnings

import numba
import numpy as np
import pytest
import scipy.sparse as sp

from mgg.graph import Dataset, Graph, GraphError, csr
from mgg.graph import generators as gen
from mgg.graph.dataset import make_split
from mgg.graph.formats import write_edgelist, write_mgg_bin, write_npz
from mgg.graph.generators import (
    STANDINS,
    planted_partition,
    rmat,
    rmat_n,
    standin,
    standin_edge_cap,
)
from mgg.graph.specs import resolve


def assert_simple(g: Graph, symmetric: bool):
    """Valid CSR, rows strictly increasing (sorted, no duplicates), no self loops."""
    Graph(g.indptr, g.indices, None, g.num_nodes)  # validates
    src, dst = g.edges()
    assert not np.any(src == dst)
    same_row = dst[1:] == dst[:-1]
    assert np.all(np.diff(g.indices.astype(np.int64))[same_row] > 0)
    a = g.to_scipy()
    asym = abs(a - a.T).nnz
    if symmetric:
        assert g.symmetric is True
        assert asym == 0
    else:
        assert not g.symmetric
        assert asym > 0


def reference_csr(src, dst, n, symmetric):
    keep = src != dst
    s, d = src[keep].astype(np.int64), dst[keep].astype(np.int64)
    if symmetric:
        s, d = np.concatenate([s, d]), np.concatenate([d, s])
    m = sp.csr_matrix((np.ones(s.size), (d, s)), shape=(n, n))
    m.sum_duplicates()
    m.sort_indices()
    return m.indptr, m.indices


def same_graph(g: Graph, h: Graph) -> bool:
    return (
        g.num_nodes == h.num_nodes
        and np.array_equal(g.indptr, h.indptr)
        and np.array_equal(g.indices, h.indices)
    )


# ---- rmat ---------------------------------------------------------------------------------
@pytest.mark.parametrize("symmetric", [True, False])
def test_rmat_structure(symmetric):
    g = rmat(10, 8, seed=3, symmetric=symmetric)
    assert g.num_nodes == 1024
    assert g.indices.dtype == np.int32 and g.indptr.dtype == np.int64
    assert 0 < g.num_edges <= 8 * 1024 * (2 if symmetric else 1)
    assert_simple(g, symmetric)
    deg = g.in_degrees()
    assert deg.max() > 8 * deg.mean()


@pytest.mark.parametrize("symmetric", [True, False])
def test_rmat_matches_scipy_reference(symmetric):
    src, dst = gen._rmat_edges(16 * 512, 9, 512, 0.57, 0.19, 0.19, 5, True)
    g = rmat(9, 16, seed=5, symmetric=symmetric)
    indptr, indices = reference_csr(src, dst, 512, symmetric)
    assert np.array_equal(g.indptr, indptr) and np.array_equal(g.indices, indices)


def test_rmat_deterministic_and_seeded():
    assert same_graph(rmat(9, seed=1), rmat(9, seed=1))
    assert not same_graph(rmat(9, seed=1), rmat(9, seed=2))


def test_rmat_independent_of_thread_count():
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = rmat(9, seed=4, symmetric=False)
        one_n = rmat_n(700, 5000, seed=4)
        one_p = planted_partition(800, 4, seed=4).graph
        one_s = standin("enwiki", 2e-4, seed=4, with_features=False).graph
    finally:
        numba.set_num_threads(before)
    assert same_graph(one, rmat(9, seed=4, symmetric=False))
    assert same_graph(one_n, rmat_n(700, 5000, seed=4))
    assert same_graph(one_p, planted_partition(800, 4, seed=4).graph)
    assert same_graph(one_s, standin("enwiki", 2e-4, seed=4, with_features=False).graph)


def test_csr_builder_independent_of_row_partition(monkeypatch):
    ref_sym, ref_dir = rmat(9, seed=6), rmat_n(900, 7001, seed=6, symmetric=False)
    monkeypatch.setattr(csr, "_BUCKETS_MAX", 5)
    monkeypatch.setattr(csr, "_CHUNKS_PER_THREAD", 3)
    assert same_graph(ref_sym, rmat(9, seed=6))
    assert same_graph(ref_dir, rmat_n(900, 7001, seed=6, symmetric=False))


@pytest.mark.parametrize("n", [3, 200, 40_000, 70_000, 2**24 + 5])
@pytest.mark.parametrize("symmetric", [True, False])
def test_build_csr_matches_scipy(n, symmetric):
    """Rows of every length (insertion sort below 33, radix sort of 1 to 4 byte passes
    above: hubs), loops and duplicates."""
    rng = np.random.default_rng(n)
    e = 60_000
    hubs = rng.integers(0, n, 3)
    src = rng.integers(0, n, e)
    dst = np.where(rng.random(e) < 0.3, hubs[rng.integers(0, 3, e)], rng.integers(0, n, e))
    src[:500] = dst[:500]  # self loops
    src, dst = (a.astype(np.int32) for a in (src, dst))
    want = reference_csr(src, dst, n, symmetric)
    indptr, indices = csr.build_csr(src, dst, n, symmetric)
    assert np.array_equal(indptr, want[0]) and np.array_equal(indices, want[1])
    assert indices.dtype == np.int32 and indptr.dtype == np.int64


def test_merge_rows_is_the_union():
    rng = np.random.default_rng(5)
    n = 500
    parts = [rng.integers(0, n, (2, k)).astype(np.int32) for k in (9000, 700)]
    a, b = (csr.build_csr(s, d, n, True) for s, d in parts)
    both = csr.build_csr(*(np.concatenate(x) for x in zip(*parts, strict=True)), n, True)
    got = csr.merge_rows(a, b)
    assert np.array_equal(got[0], both[0]) and np.array_equal(got[1], both[1])
    empty = (np.zeros(n + 1, np.int64), np.empty(0, np.int32))
    for x, y in ((a, empty), (empty, a)):
        m = csr.merge_rows(x, y)
        assert np.array_equal(m[0], a[0]) and np.array_equal(m[1], a[1])


def test_row_chunks_cover_the_rows_in_order():
    indptr = np.concatenate([[0], np.cumsum([0, 5, 0, 1000, 3, 3, 0, 0, 7])]).astype(np.int64)
    for parts in (1, 2, 4, 9, 50):
        c = csr.row_chunks(indptr, parts)
        assert c[0] == 0 and c[-1] == indptr.size - 1 and np.all(np.diff(c) > 0)
    assert np.array_equal(csr.row_chunks(np.zeros(1, np.int64)), [0])


def test_rmat_permute_and_parameters():
    plain = rmat(8, seed=0, permute=False)
    deg = plain.in_degrees()
    assert deg.argmax() == 0  # without permutation vertex 0 is the R-MAT hub
    uniform = rmat(8, seed=0, a=0.25, b=0.25, c=0.25)
    assert uniform.in_degrees().max() < deg.max()
    with pytest.raises(ValueError):
        rmat(8, a=0.6, b=0.3, c=0.3)


def test_rmat_progress_runs():
    assert same_graph(rmat(6, progress=True), rmat(6))


# ---- rmat_n -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n,e,symmetric",
    [(1000, 20_000, True), (3000, 40_001, True), (777, 9_000, False), (2, 2, True), (5, 12, False)],
)
def test_rmat_n_counts(n, e, symmetric):
    g = rmat_n(n, e, seed=1, symmetric=symmetric)
    assert g.num_nodes == n
    assert abs(g.num_edges - e) <= 0.1 * e
    assert e <= g.num_edges <= e + 1
    assert_simple(g, symmetric)


def test_rmat_n_is_a_prefix_of_one_stream():
    small, big = rmat_n(2000, 10_000, seed=7), rmat_n(2000, 30_000, seed=7)
    a, b = small.to_scipy(), big.to_scipy()
    assert (a - a.multiply(b)).nnz == 0
    assert not same_graph(small, rmat_n(2000, 10_000, seed=8))


def test_rmat_n_skewed_and_unreachable():
    g = rmat_n(5000, 100_000, seed=0)
    deg = g.in_degrees()
    assert deg.max() > 10 * deg.mean()
    with pytest.warns(UserWarning):
        h = rmat_n(6, 100, seed=0)
    assert h.num_edges <= 30


def test_expected_entries_model_is_close():
    k, draws = 12, 60_000
    src, dst = gen._rmat_edges(draws, k, 2**k, 0.57, 0.19, 0.19, 0, True)
    actual = reference_csr(src, dst, 2**k, True)[1].size
    model = gen._expected_entries(k, 0.57, 0.19, 0.19, draws, True)
    assert abs(model - actual) < 0.03 * actual


# ---- planted partition --------------------------------------------------------------------
def nearest_centroid_accuracy(z, ds):
    cent = np.stack([z[ds.train_mask & (ds.y == c)].mean(0) for c in range(ds.num_classes)])
    pred = ((z[:, None, :] - cent[None]) ** 2).sum(-1).argmin(1)
    return (pred[ds.test_mask] == ds.y[ds.test_mask]).mean()


def test_planted_partition_structure():
    ds = planted_partition(3000, 6, avg_degree=12, p_in=0.8, num_features=16, seed=2)
    g = ds.graph
    assert isinstance(ds, Dataset) and ds.num_classes == 6
    assert g.num_nodes == 3000 and abs(g.num_edges - 36_000) <= 1
    assert_simple(g, True)
    assert ds.x.shape == (3000, 16) and ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64 and np.ptp(np.bincount(ds.y)) <= 1
    deg = g.in_degrees()
    assert deg.max() > 5 * deg.mean()
    assert ds.meta["generator"] == "planted_partition"


@pytest.mark.parametrize("p_in", [0.8, 0.5])
def test_planted_partition_learnable(p_in):
    ds = planted_partition(4000, 8, p_in=p_in, seed=0)
    src, dst = ds.graph.edges()
    assert (ds.y[src] == ds.y[dst]).mean() >= p_in - 0.1
    a = ds.graph.to_scipy()
    deg = np.asarray(a.sum(1)).ravel()
    hop = (a @ ds.x + ds.x) / (deg + 1)[:, None]
    raw, agg = nearest_centroid_accuracy(ds.x, ds), nearest_centroid_accuracy(hop, ds)
    assert raw > 2 / 8
    if p_in == 0.8:
        assert agg > 0.85 and agg > raw + 0.1


def test_planted_partition_deterministic():
    a, b = planted_partition(1500, 5, seed=3), planted_partition(1500, 5, seed=3)
    assert same_graph(a.graph, b.graph)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert np.array_equal(a.train_mask, b.train_mask)
    c = planted_partition(1500, 5, seed=4)
    assert not same_graph(a.graph, c.graph) and not np.array_equal(a.x, c.x)


def test_planted_partition_rejects_bad_arguments():
    with pytest.raises(ValueError):
        planted_partition(5, 10)
    with pytest.raises(ValueError):
        planted_partition(100, 4, p_in=1.5)


# ---- split --------------------------------------------------------------------------------
def test_make_split_sizes():
    y = np.concatenate([np.random.default_rng(0).integers(0, 5, 1000), [5] * 35])
    train, val, test = make_split(y, 6, seed=1)
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    assert (train | val | test).all()
    for c in range(5):
        assert train[y == c].sum() == 20 and val[y == c].sum() == 30
    assert train[y == 5].sum() == 20 and val[y == 5].sum() == 15 and test[y == 5].sum() == 0
    again = make_split(y, 6, seed=1)
    assert all(np.array_equal(p, q) for p, q in zip((train, val, test), again, strict=True))
    assert not np.array_equal(train, make_split(y, 6, seed=2)[0])
    t, v, _ = make_split(y, 6, train_per_class=5, val_per_class=7)
    assert t.sum() == 30 and v.sum() == 42
    with pytest.raises(ValueError):
        make_split(y, 5)


# ---- stand-ins ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(STANDINS))
def test_standin_sizes(name):
    spec, s = STANDINS[name], 1e-3
    ds = standin(name, s, seed=1)
    n = max(2, round(spec.nodes * s))
    e = min(round(spec.edges * s), standin_edge_cap(n))
    g = ds.graph
    assert g.num_nodes == n
    assert e <= g.num_edges <= e + 1
    assert_simple(g, not spec.directed)
    assert ds.x.shape == (n, spec.features) and ds.x.dtype == np.float32
    assert ds.num_classes == spec.classes and ds.y.max() < spec.classes
    assert ds.meta["standin_of"] == name and ds.meta["params"]["scale"] == s
    bare = standin(name, s, seed=1, with_features=False)
    assert bare.x is None and bare.y is None and same_graph(bare.graph, g)


def test_standin_labels_follow_structure():
    ds = standin("products", 2e-3, seed=0)
    src, dst = ds.graph.edges()
    assert (ds.y[src] == ds.y[dst]).mean() > 0.3
    deg = ds.graph.in_degrees()
    assert deg.max() > 10 * deg.mean()
    a = ds.graph.to_scipy()
    hop = (a @ ds.x + ds.x) / (np.asarray(a.sum(1)).ravel() + 1)[:, None]
    assert nearest_centroid_accuracy(hop, ds) > 0.8


def test_standin_tiny_and_bad():
    ds = standin("reddit", 1e-6)
    assert ds.graph.num_nodes == 2 and ds.graph.num_edges == 2
    assert standin("reddit", 1e-3).meta["params"]["edges_capped"]
    with pytest.raises(ValueError, match="reddit"):
        standin("twitter")
    with pytest.raises(ValueError):
        standin("reddit", 0)


# ---- resolve ------------------------------------------------------------------------------
def test_resolve_standin():
    ds = resolve("products:scale=0.0005,seed=2")
    assert ds.name == "products" and ds.graph.num_nodes == round(2_449_029 * 0.0005)
    assert ds.meta["params"]["seed"] == 2
    via_arg = resolve("products", scale=0.0005, seed=2)
    assert same_graph(ds.graph, via_arg.graph)
    with pytest.raises(ValueError, match="both give a scale"):  # an InputError
        resolve("products:scale=0.0005", scale=0.01)
    assert resolve("products:scale=0.0005,features=0").x is None


def test_resolve_rmat_and_planted():
    ds = resolve("rmat:scale=8,ef=4,seed=1,directed=1")
    assert same_graph(ds.graph, rmat(8, 4, seed=1, symmetric=False))
    assert ds.meta["generator"] == "rmat"
    assert resolve("rmat:scale=7", seed=3).graph.symmetric
    assert same_graph(resolve("rmat:scale=7", seed=3).graph, rmat(7, seed=3))
    p = resolve("planted:nodes=600,classes=3,degree=6,features=8")
    assert p.graph.num_nodes == 600 and p.num_classes == 3 and p.x.shape == (600, 8)
    assert abs(p.graph.num_edges - 3600) <= 1


def test_resolve_file(tmp_path):
    g = rmat(6, 4, seed=1)
    write_edgelist(g, tmp_path / "g.txt")
    ds = resolve(str(tmp_path / "g.txt"))
    assert ds.name == "g" and same_graph(ds.graph, g)
    write_mgg_bin(g, tmp_path / "x")  # a prefix of x_beg_pos.bin + x_csr.bin
    ds = resolve(str(tmp_path / "x"))
    assert ds.name == "x" and same_graph(ds.graph, g)
    p = planted_partition(300, 3, num_features=4, seed=2)
    write_npz(p, tmp_path / "p.npz")
    ds = resolve(str(tmp_path / "p.npz"))
    assert same_graph(ds.graph, p.graph) and np.array_equal(ds.x, p.x)
    assert np.array_equal(ds.y, p.y) and np.array_equal(ds.test_mask, p.test_mask)
    (tmp_path / "bad.txt").write_text("0 1\n1 x\n")
    with pytest.raises(GraphError, match=r"bad\.txt: line 2"):
        resolve(str(tmp_path / "bad.txt"))


@pytest.mark.parametrize("spec", ["products:scale=0.0005", "rmat:scale=4"])
def test_resolve_file_wins_over_name(tmp_path, monkeypatch, spec):
    monkeypatch.chdir(tmp_path)
    (tmp_path / spec).write_text("0 1\n1 2\n")
    ds = resolve(spec)
    assert ds.graph.num_nodes == 3 and ds.graph.num_edges == 2 and ds.meta == {}


@pytest.mark.parametrize(
    "spec,match",
    [
        ("twitter", "reddit"),
        ("no/such/file.npz", "rmat"),
        ("reddit:bogus=1", "scale"),
        ("rmat:ef=4", "scale"),
        ("planted:nodes=10", "classes"),
        ("planted:nodes=abc", "key=number"),
        ("rmat:scale", "key=number"),
    ],
)
def test_resolve_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        resolve(spec)


def test_no_warnings_on_normal_use():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rmat_n(500, 4000)
        standin("proteins", 1e-3)
