"""Importers from Python objects (mgg.graph.from_*), atomic writes and `mgg convert`."""

from __future__ import annotations

import json
import os
import re
import types

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mgg.atomic import atomic_write
from mgg.cli import main
from mgg.graph import Graph, GraphError, from_arrays, from_edge_index, from_pyg, from_scipy
from mgg.graph.formats import read_dataset, read_graph, write_graph


def edge_set(g: Graph, weights=False):
    src, dst = g.edges()
    cols = [src.tolist(), dst.tolist()] + ([g.weights.tolist()] if weights else [])
    return sorted(zip(*cols, strict=True))


def node_data(rng, n, f=3, classes=4):
    x = rng.standard_normal((n, f)).astype(np.float32)
    y = rng.integers(0, classes, n)
    perm = rng.permutation(n)
    masks = [np.zeros(n, bool) for _ in range(3)]
    for m, ids in zip(masks, np.array_split(perm, 3), strict=True):
        m[ids] = True
    return x, y, masks


def fails(fn, *words):
    """fn() raises GraphError whose message holds each of ``words`` (regexes)."""
    with pytest.raises(GraphError) as info:
        fn()
    for w in words:
        assert re.search(w, str(info.value)), str(info.value)


# ---- importers -------------------------------------------------------------------------------
def test_from_arrays_and_edge_index_agree_with_graph_from_edges(rng):
    n = 20
    src, dst = rng.integers(0, n, 70), rng.integers(0, n, 70)
    x, y, (tr, va, te) = node_data(rng, n)
    a = from_arrays(src, dst, x=x, y=y, train_mask=tr, val_mask=va, test_mask=te)
    b = from_edge_index(torch.as_tensor(np.stack([src, dst])), x=torch.as_tensor(x), y=y)
    want = Graph.from_edges(src, dst, n)
    for ds in (a, b):
        np.testing.assert_array_equal(ds.graph.indptr, want.indptr)
        np.testing.assert_array_equal(ds.graph.indices, want.indices)
        np.testing.assert_array_equal(ds.x, x)
        np.testing.assert_array_equal(ds.y, y)
        assert ds.graph.symmetric is False  # checked: random edges lack their twins
    np.testing.assert_array_equal(a.train_mask, tr)
    c = from_arrays(src, dst, 25, train_mask=np.array([3, 1]))  # masks as node ids
    assert c.graph.num_nodes == 25 and np.flatnonzero(c.train_mask).tolist() == [1, 3]


def test_undirected_and_weighted(rng):
    src, dst = np.array([0, 1, 2, 2]), np.array([1, 0, 3, 3])
    ds = from_edge_index(np.stack([src, dst]), undirected=True)
    assert ds.graph.symmetric and edge_set(ds.graph) == [(0, 1), (1, 0), (2, 3), (3, 2)]
    w = np.array([0.5, 0.5, 2.0, 2.0], np.float32)
    ds = from_arrays(src, dst, weights=w, undirected=True)
    assert edge_set(ds.graph, True) == [(0, 1, 0.5), (1, 0, 0.5), (2, 3, 2.0), (3, 2, 2.0)]
    w[1] = 0.25
    fails(lambda: from_arrays(src, dst, weights=w, undirected=True), "weights", "0-1", "two")
    sym = from_arrays(np.array([0, 1]), np.array([1, 0]))
    assert sym.graph.symmetric is True  # detected without undirected=True


def test_from_scipy_orientation_and_weights():
    a = sp.csr_matrix(np.array([[0, 2.0, 0], [0, 0, 0], [1.0, 0, 0]]))  # A[v, u]: u -> v
    ds = from_scipy(a)
    assert edge_set(ds.graph, True) == [(0, 2, 1.0), (1, 0, 2.0)]
    ds = from_scipy(sp.csr_matrix(np.array([[0, 1], [1, 0]])), y=np.array([0, 1]))
    assert ds.graph.weights is None and ds.graph.symmetric and ds.num_classes == 2
    np.testing.assert_array_equal(ds.graph.to_scipy().toarray(), [[0, 1], [1, 0]])
    fails(lambda: from_scipy(sp.csr_matrix((2, 3))), "matrix", r"square, got shape \(2, 3\)")
    fails(lambda: from_scipy(np.eye(2)), "matrix must be a scipy sparse matrix")


def test_explicit_zeros_of_a_matrix_are_not_edges():
    """A[v, u] != 0 is an edge: a stored 0 (left by arithmetic, or given) is not one."""
    a = sp.csr_matrix(
        (np.array([2.0, 0.0, 1.0, 0.0]), np.array([1, 0, 0, 2]), np.array([0, 2, 2, 4])),
        shape=(3, 3),
    )
    assert a.nnz == 4  # two of them explicit zeros
    ds = from_scipy(a)
    assert edge_set(ds.graph, True) == [(0, 2, 1.0), (1, 0, 2.0)]
    g = Graph.from_scipy(a)
    assert edge_set(g, True) == [(0, 2, 1.0), (1, 0, 2.0)]
    assert a.nnz == 4  # the caller's matrix is left as it was
    ones = sp.coo_matrix((np.array([1, 0, 1]), (np.array([0, 1, 1]), np.array([1, 0, 1]))))
    assert from_scipy(ones).graph.weights is None  # only the stored ones are left: unweighted
    assert Graph.from_scipy(ones).weights is None


def test_a_node_id_past_memory_is_a_resource_error_naming_the_argument(monkeypatch):
    """The CSR has a row per id up to the largest: an id of 2**40 would allocate 8 TiB."""
    from mgg.errors import ResourceError

    monkeypatch.delenv("MGG_MEMORY_LIMIT", raising=False)
    ids = np.array([[0, 2**40], [1, 0]])
    cases = {
        "edge_index": lambda: from_edge_index(ids, train_mask=np.array([0])),
        "src, dst": lambda: from_arrays(ids[0], ids[1]),
        "from_edges": lambda: Graph.from_edges(ids[0], ids[1]),
        "matrix": lambda: from_scipy(sp.coo_matrix(([1.0], ([0], [1])), shape=(2**40, 2**40))),
        "from_scipy": lambda: Graph.from_scipy(sp.coo_matrix(([1.0], ([0], [1])), (2**40,) * 2)),
    }
    for source, call in cases.items():
        with pytest.raises(ResourceError) as e:
            call()
        assert re.match(
            rf"{source}: a graph of 1,099,511,627,77\d nodes and \d edges \(its CSR( and the "
            r"build)?\) needs \d+\.\d TiB but this rank has ",
            str(e.value),
        ), str(e.value)
    assert "so N = max id + 1" in str(pytest.raises(ResourceError, cases["src, dst"]).value)
    huge_n = pytest.raises(ResourceError, lambda: from_arrays([0], [1], num_nodes=2**70)).value
    assert "check the sizes the input declares" in str(huge_n)  # not the ids: num_nodes
    monkeypatch.setenv("MGG_MEMORY_LIMIT", "1M")  # the same check, with a small graph
    with pytest.raises(ResourceError, match=r"^edge_index: a graph of 100,001 nodes"):
        from_edge_index(np.array([[0], [100_000]]))


def test_labels_multilabel_and_unlabeled(rng):
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 3])
    ml = from_arrays(src, dst, y=np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.float32))
    assert ml.multilabel and ml.y.dtype == np.int8 and ml.num_classes == 2
    y = np.array([1.0, np.nan, 2.0, 0.0])  # float labels with NaN: node 1 is unlabeled
    ds = from_arrays(src, dst, y=y, train_mask=np.ones(4, bool))
    assert ds.y.tolist() == [1, 0, 2, 0] and ds.train_mask.tolist() == [1, 0, 1, 1]
    assert ds.meta["unlabeled_nodes"] == 1
    col = from_arrays(src, dst, y=np.array([[1], [0], [2], [1]]))  # [N, 1]: classes
    assert col.y.tolist() == [1, 0, 2, 1] and not col.multilabel


def test_bad_input_names_the_argument():
    src, dst = np.array([0, 1, 2]), np.array([1, 2, 3])
    ei = np.stack([src, dst])
    fails(lambda: from_edge_index(np.zeros((3, 4), int)), "edge_index", r"\(3, 4\)", r"\(2, E\)")
    fails(lambda: from_edge_index(ei.astype(float)), "edge_index", "integer", "float64")
    fails(lambda: from_edge_index(ei, 3), r"edge_index\[1\]\[2\] = 3", r"\[0, num_nodes = 3\)")
    fails(lambda: from_arrays(src, np.array([1, -2, 3])), r"dst\[1\] = -2 is outside")
    fails(lambda: from_arrays(src, dst[:2]), "src and dst differ in length")
    x = np.ones((4, 2), np.float32)
    x[2, 1] = np.nan
    fails(lambda: from_arrays(src, dst, x=x), r"x\[2, 1\] is nan", "finite")
    fails(lambda: from_arrays(src, dst, 4, x=np.ones((5, 2))), "x has 5 rows", "num_nodes = 4")
    fails(lambda: from_arrays(src, dst, val_mask=np.ones(3, bool)), "val_mask", r"\(3,\)", "4")
    fails(lambda: from_arrays(src, dst, test_mask=np.array([7])), r"test_mask\[0\] = 7")
    fails(lambda: from_arrays(src, dst, y=np.array([0, 1.5, 1, 0])), r"y\[1\] is 1.5", "integer")
    fails(lambda: from_arrays(src, dst, y=np.array([0, -1, 1, 0])), r"y\[1\] is -1", ">= 0")
    fails(lambda: from_arrays(src, dst, y=np.full((4, 2), 2)), r"y\[0, 0\] is 2", "0 or 1")
    fails(lambda: from_arrays(src, dst, weights=np.ones(2)), "weights has shape", r"\(3,\)")
    fails(lambda: from_pyg(types.SimpleNamespace(x=None)), "no edge_index")


def test_from_pyg_duck_typed(rng):
    n = 6
    data = types.SimpleNamespace(
        edge_index=torch.tensor([[0, 1, 2, 5], [1, 2, 3, 0]]),
        num_nodes=n,
        x=torch.ones(n, 2),
        y=torch.arange(n) % 2,
        train_mask=torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
        edge_attr=torch.tensor([[1.0], [2.0], [3.0], [4.0]]),
    )
    ds = from_pyg(data, name="toy")
    assert ds.name == "toy" and ds.graph.num_nodes == n and ds.val_mask is None
    assert edge_set(ds.graph, True) == [(0, 1, 1.0), (1, 2, 2.0), (2, 3, 3.0), (5, 0, 4.0)]
    data.edge_attr = torch.ones(4, 3)
    with pytest.warns(UserWarning, match="edge features are dropped"):
        assert from_pyg(data).graph.weights is None


def test_pyg_data_round_trip(rng):
    pyg = pytest.importorskip("torch_geometric.data")
    n = 15
    ei = torch.as_tensor(rng.integers(0, n, (2, 50)))
    x, y, (tr, va, te) = node_data(rng, n)
    data = pyg.Data(
        edge_index=ei,
        x=torch.as_tensor(x),
        y=torch.as_tensor(y),
        train_mask=torch.as_tensor(tr),
        val_mask=torch.as_tensor(va),
        test_mask=torch.as_tensor(te),
        num_nodes=n + 2,  # two isolated nodes: x has n rows, so this must win... and fail
    )
    fails(lambda: from_pyg(data), "x has 15 rows", "num_nodes = 17")
    data.num_nodes = n
    ds = from_pyg(data)
    src, dst = ds.graph.edges()
    back = pyg.Data(edge_index=torch.as_tensor(np.stack([src, dst]).astype(np.int64)))
    assert sorted(map(tuple, back.edge_index.T.tolist())) == sorted(map(tuple, ei.T.tolist()))
    np.testing.assert_array_equal(ds.x, data.x.numpy())
    np.testing.assert_array_equal(ds.y, data.y.numpy())
    for k in ("train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(ds, k), getattr(data, k).numpy())


# ---- atomic writes and mgg convert ------------------------------------------------------------
def test_atomic_write_leaves_the_old_file_on_failure(tmp_path):
    out = tmp_path / "g.graph"
    out.write_text("old\n")
    directed = Graph.from_edges([0, 1], [1, 2], 3)
    with pytest.raises(GraphError, match=f"^{re.escape(str(out))}: .*not symmetric"):
        write_graph(directed, out)
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["g.graph"]
    with pytest.raises(RuntimeError), atomic_write(tmp_path / "a", tmp_path / "b") as (p, q):
        open(p, "w").close()
        raise RuntimeError
    assert os.listdir(tmp_path) == ["g.graph"]
    g = Graph.from_edges([0, 1], [1, 0], 2)
    write_graph(g, tmp_path / "m_beg_pos.bin")  # both files of the MGG binary
    assert sorted(os.listdir(tmp_path)) == ["g.graph", "m_beg_pos.bin", "m_csr.bin"]


def convert(capsys, src, dst):
    assert main(["convert", str(src), str(dst), "--json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out.strip().splitlines()[-1]), err


def test_convert_round_trips_between_formats(tmp_path, capsys, rng):
    n = 30
    u, v = rng.integers(0, n, 90), rng.integers(0, n, 90)
    keep = u != v
    x, y, (tr, va, te) = node_data(rng, n)
    ds = from_arrays(u[keep], v[keep], n, x=x, y=y, train_mask=tr, val_mask=va, test_mask=te)
    ds = type(ds)(ds.name, ds.graph.symmetrize(), ds.x, ds.y, tr, va, te)
    start = tmp_path / "start.npz"
    write_graph(ds, start)
    want = edge_set(ds.graph)
    chain = ["a.txt", "b.graph", "c_beg_pos.bin", "d.txt.gz", "e.npz"]
    prev = start
    for i, name in enumerate(chain):
        res, err = convert(capsys, prev, tmp_path / name)
        assert res["num_nodes"] == n and res["num_edges"] == len(want) and res["seconds"] >= 0
        assert res["in"] == str(prev) and res["out"] == str(tmp_path / name)
        assert edge_set(read_graph(tmp_path / name)) == want, name
        if i == 0:  # node data lost once, on leaving npz
            assert err.count("\n") == 1 and "features, labels, split masks" in err
        else:
            assert err == ""
        prev = tmp_path / name
    assert read_dataset(tmp_path / "e.npz").x is None  # the edge list in between held none
    res, err = convert(capsys, start, tmp_path / "f.npz")
    back = read_dataset(tmp_path / "f.npz")
    assert err == "" and back.graph.symmetric
    np.testing.assert_array_equal(back.x, x)
    np.testing.assert_array_equal(back.val_mask, va)


def test_convert_ogb_directory(tmp_path, capsys):
    from test_ogb import ogb_dir

    src, dst = np.array([0, 1, 2, 3]), np.array([1, 2, 3, 0])
    y = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
    split = {"train": [0, 1], "valid": [2], "test": [3]}
    root = ogb_dir(tmp_path, "ogbn_like", src, dst, 4, labels=y, split=split)
    res, err = convert(capsys, root, tmp_path / "o.npz")
    back = read_dataset(tmp_path / "o.npz")
    assert res["num_edges"] == 4 and back.multilabel and back.num_classes == 2
    np.testing.assert_array_equal(back.y, y)
    assert back.train_mask.tolist() == [True, True, False, False]
    res, err = convert(capsys, tmp_path / "o.npz", tmp_path / "o_beg_pos.bin")
    assert "labels, split masks" in err
    assert main(["convert", str(tmp_path / "o.npz"), str(root)]) == 2
    assert "is a directory" in capsys.readouterr().err
