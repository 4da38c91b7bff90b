import numpy as np
import pytest
import scipy.sparse as sp

from mgg.graph import Graph, GraphError

from conftest import random_graph


def edge_multiset(g):
    src, dst = g.edges()
    w = g.weights if g.weights is not None else np.ones(g.num_edges)
    return sorted(zip(src.tolist(), dst.tolist(), np.round(w, 5).tolist(), strict=True))


@pytest.mark.parametrize(
    "bad, msg",
    [
        (dict(indptr=[0, 2, 1], indices=[0, 1]), "not monotone"),
        (dict(indptr=[1, 2], indices=[0, 0]), "indptr\\[0\\]"),
        (dict(indptr=[0, 1, 3], indices=[0, 1]), "indptr\\[-1\\]"),
        (dict(indptr=[0, 1, 2], indices=[0, 2]), "outside \\[0, 2\\)"),
        (dict(indptr=[0, 1, 2], indices=[0, -1]), "outside"),
        (dict(indptr=[0, 1, 2], indices=[0.5, 1.0]), "integers"),
        (dict(indptr=[0, 1, 2], indices=[0, 1], weights=[1.0, np.nan]), "finite"),
        (dict(indptr=[0, 1, 2], indices=[0, 1], weights=[1.0]), "one per edge"),
        (dict(indptr=[0, 1, 2], indices=[0, 1], num_nodes=3), "num_nodes\\+1"),
    ],
)
def test_invalid_csr_is_rejected(bad, msg):
    with pytest.raises(GraphError, match=msg):
        Graph(**bad)


def test_from_edges_rejects_out_of_range():
    with pytest.raises(GraphError, match="dst\\[1\\] = 7"):
        Graph.from_edges([0, 1], [1, 7], 5)


def test_int64_ids_for_huge_graphs():
    g = Graph(np.zeros(3, np.int64), np.zeros(0, np.int32), num_nodes=2)
    assert g.indices.dtype == np.int32
    from mgg.graph import index_dtype

    assert index_dtype(2**31) == np.int64


def test_transpose_matches_scipy(rng):
    g = random_graph(rng, 200, 1500, hub_src=True)
    g = Graph(g.indptr, g.indices, rng.random(g.num_edges), g.num_nodes)
    t = g.transpose()
    assert (abs(t.to_scipy() - g.to_scipy().T) > 1e-6).nnz == 0
    # rows come out sorted
    for v in range(0, 200, 17):
        row = t.indices[t.indptr[v] : t.indptr[v + 1]]
        assert np.all(np.diff(row) >= 0)


def test_dedup_sums_weights_and_sorts(rng):
    g = Graph.from_edges([3, 1, 3, 0, 3], [0, 0, 0, 2, 0], 4, weights=[1, 2, 3, 4, 5])
    d = g.dedup()
    assert d.indices[d.indptr[0] : d.indptr[1]].tolist() == [1, 3]
    assert d.weights[d.indptr[0] : d.indptr[1]].tolist() == [2, 9]
    g2 = random_graph(rng, 100, 2000)
    d2 = g2.dedup()
    a = g2.to_scipy()
    a.sum_duplicates()
    assert d2.num_edges == a.nnz
    assert d2.weights is None  # unweighted: one copy of each edge, no multiplicity
    assert (d2.to_scipy() != (a != 0).astype(np.float32)).nnz == 0


def test_self_loops(rng):
    g = random_graph(rng, 50, 400)
    r = g.remove_self_loops()
    src, dst = r.edges()
    assert not np.any(src == dst)
    assert r.num_edges == g.num_edges - int(np.sum(g.edges()[0] == g.edges()[1]))
    a = r.add_self_loops()
    assert a.num_edges == r.num_edges + 50
    assert np.all(a.to_scipy().diagonal() == 1)


def test_symmetrize(rng):
    g = random_graph(rng, 80, 300)
    s = g.symmetrize()
    m = s.to_scipy()
    assert s.symmetric and (m != m.T).nnz == 0
    assert m.max() == 1  # no duplicates left
    want = (g.to_scipy() + g.to_scipy().T) != 0
    assert (want != (m != 0)).nnz == 0
    assert s.transpose() is s


def test_gcn_norm_matches_dense_formula(rng):
    g = random_graph(rng, 30, 120).dedup()
    n = g.gcn_norm()
    a = (g.to_scipy().toarray() != 0).astype(float)
    np.fill_diagonal(a, 0)
    a += np.eye(30)
    d = a.sum(1)
    want = a / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]
    np.testing.assert_allclose(n.to_scipy().toarray(), want, rtol=1e-6)


def test_degrees_and_scipy_round_trip(rng):
    g = random_graph(rng, 60, 500)
    assert np.array_equal(g.in_degrees(), np.diff(g.indptr))
    assert np.array_equal(g.out_degrees(), np.bincount(g.indices, minlength=60))
    h = Graph.from_scipy(g.to_scipy())
    assert edge_multiset(h) == edge_multiset(g)
    with pytest.raises(GraphError, match="square"):
        Graph.from_scipy(sp.csr_matrix((3, 4)))


def test_empty_graph():
    g = Graph.from_edges(np.array([], int), np.array([], int), 5)
    assert g.num_edges == 0 and g.transpose().num_edges == 0
    assert g.gcn_norm().num_edges == 5
    assert Graph(np.zeros(1, np.int64), np.zeros(0, np.int32)).num_nodes == 0
