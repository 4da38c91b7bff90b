"""Node orders before Algorithm 1 (--order): each is a permutation that cuts what it
should, the graph and its data move together, and what a user gets back (check's outputs,
predictions, the rows of a shard) is indexed by original node id."""

import json
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from mgg.graph import Graph
from mgg.graph.dataset import Dataset, random_features
from mgg.knobs import ORDERS
from mgg.partition import build_plan, plan_stats
from mgg.partition import order as node_order
from mgg.partition.order import Order, OrderError

from conftest import ROOT, last_json, mpirun, random_graph, shared_dataset


def scrambled_communities(rng, parts=4, size=150, inside=8, across=0.3):
    """A graph of ``parts`` dense communities whose node ids are shuffled: its natural
    order is poor, and a good order finds the communities again. Undirected."""
    n = parts * size
    src, dst = [], []
    for c in range(parts):
        a = rng.integers(0, size, inside * size) + c * size
        b = rng.integers(0, size, inside * size) + c * size
        src.append(a)
        dst.append(b)
    m = int(across * size * parts)
    src.append(rng.integers(0, n, m))
    dst.append(rng.integers(0, n, m))
    src, dst = np.concatenate(src), np.concatenate(dst)
    shuffle = rng.permutation(n)
    src, dst = shuffle[src], shuffle[dst]
    keep = src != dst
    g = Graph.from_edges(np.r_[src[keep], dst[keep]], np.r_[dst[keep], src[keep]], n).dedup()
    g.symmetric = True
    return g


def halo(g: Graph, p: int) -> int:
    return plan_stats(build_plan(g, p, 8, transposed=False))["halo_rows"]


def test_every_order_is_a_permutation_that_cuts_what_it_should(rng):
    g = scrambled_communities(rng)
    orders = {name: node_order.compute(g, name, parts=4) for name in ORDERS}
    for name, o in orders.items():
        assert o.name == name and o.seconds >= 0
        if name != "natural":
            assert sorted(o.perm.tolist()) == list(range(g.num_nodes)), name
    assert orders["natural"].perm is None
    deg = (g.in_degrees() + g.out_degrees())[orders["degree"].perm]
    assert np.all(np.diff(deg) <= 0)  # hubs first
    # RCM: a band; the scrambled graph's nonzeros lie anywhere
    band = {
        k: np.abs(np.subtract(*o.apply(g).edges())).max()
        for k, o in orders.items()
        if k != "degree"
    }
    assert band["rcm"] < 0.7 * band["natural"]
    # METIS: each community's nodes in one part, numbered part by part
    natural, metis = halo(g, 4), halo(orders["metis"].apply(g), 4)
    assert metis < 0.3 * natural
    assert halo(orders["rcm"].apply(g), 4) < natural


def test_metis_balances_edges_as_algorithm_1_does(rng):
    # hubs on one side: parts of equal node counts would be far from equal edge counts
    g = random_graph(rng, 800, 6000, hub_dst=True).symmetrize()
    o = node_order.compute(g, "metis", parts=4)
    stats = plan_stats(build_plan(o.apply(g), 4, 8, transposed=False))
    assert stats["imbalance"] < 1.1
    assert np.array_equal(node_order.compute(g, "metis", parts=4).perm, o.perm)  # seeded


@pytest.mark.parametrize("split", ["edges", "nodes", "mixed"])
def test_metis_parts_are_the_ranges_of_the_job_s_split(rng, split):
    """METIS balances what the split balances, so the split cuts (about) at METIS's part
    boundaries: few rows cross ranks under every split."""
    g = scrambled_communities(rng)
    o = node_order.compute(g, "metis", parts=4, split=split)
    ordered = plan_stats(build_plan(o.apply(g), 4, 8, split=split, transposed=False))
    natural = plan_stats(build_plan(g, 4, 8, split=split, transposed=False))
    assert ordered["halo_rows"] < 0.3 * natural["halo_rows"], split
    w = node_order.metis_weights(g, split)
    assert w.shape == (g.num_nodes,) and w.min() >= 1
    if split == "edges":
        np.testing.assert_array_equal(w, g.in_degrees() + 1)


def test_a_permuted_graph_is_p_a_pt_with_its_weights(rng):
    g = random_graph(rng, 120, 900)
    w = rng.random(g.num_edges).astype(np.float32)
    g = Graph(g.indptr, g.indices, w, g.num_nodes)
    perm = rng.permutation(g.num_nodes)
    h = g.permute(perm)
    a, b = g.to_scipy().toarray(), h.to_scipy().toarray()
    np.testing.assert_array_equal(b, a[np.ix_(perm, perm)])
    for v in range(h.num_nodes):  # rows come out sorted
        row = h.indices[h.indptr[v] : h.indptr[v + 1]]
        assert np.all(np.diff(row) >= 0)
    o = Order("x", perm.astype(np.int64))
    rows = rng.standard_normal((g.num_nodes, 3))
    np.testing.assert_array_equal(o.to_original(rows[perm]), rows)
    n = random_graph(rng, 120, 900).gcn_norm()  # its weights' factors go with the nodes
    m = n.permute(perm)
    src, dst = m.edges()
    np.testing.assert_allclose(m.weights, m.norm[src] * m.norm[dst], rtol=1e-6)
    np.testing.assert_array_equal(m.norm, n.norm[perm])


def test_rows_by_original_id_carry_the_natural_split_and_features(rng):
    g = random_graph(rng, 300, 2000)
    x = sp.random(300, 40, density=0.1, format="csr", dtype=np.float32, random_state=2)
    ds = Dataset("toy", g, x, rng.integers(0, 3, 300))  # no split: make_split's, seeded
    whole = ds.rows(0, 300, seed=4)
    ids = rng.permutation(300)[:70]
    got = ds.rows(10, 80, seed=4, ids=ids)
    np.testing.assert_array_equal(got.ids, ids)
    np.testing.assert_array_equal(got.x.toarray(), x.toarray()[ids])
    np.testing.assert_array_equal(got.y, ds.y[ids])
    for a, b in zip(got.masks, whole.masks, strict=True):
        np.testing.assert_array_equal(a, b[ids])
    np.testing.assert_array_equal(got.node_ids(10, 80), ids)
    np.testing.assert_array_equal(whole.node_ids(0, 300), np.arange(300))
    full = random_features(3, 0, 20000, 5)
    pick = np.array([19999, 0, 4096, 4095, 12345, 7])
    np.testing.assert_array_equal(random_features(3, 0, pick.size, 5, ids=pick), full[pick])
    assert random_features(3, 7, 7, 5, ids=np.zeros(0, np.int64)).shape == (0, 5)  # no rows


def test_an_order_file_round_trips_and_bad_ones_are_named(rng, tmp_path):
    g = scrambled_communities(rng, parts=2, size=60)
    o = node_order.compute(g, "rcm")
    f = tmp_path / "perm.npy"
    node_order.save(f, o, node_order.fingerprint_of(g))
    np.testing.assert_array_equal(np.load(f), o.perm)  # a plain .npy to numpy
    back = node_order.read(f, g.num_nodes, node_order.fingerprint_of(g))
    assert back.name == "rcm" and back.source == str(f)
    np.testing.assert_array_equal(back.perm, o.perm)
    n = g.num_nodes
    other = scrambled_communities(rng, parts=2, size=60)
    with pytest.raises(OrderError, match=r"perm.npy: computed for another graph"):
        node_order.read(f, n, node_order.fingerprint_of(other))
    plain = tmp_path / "plain.npy"
    np.save(plain, rng.permutation(n))  # another tool's: no fingerprint, checked as it is
    assert node_order.read(plain, n, node_order.fingerprint_of(g)).name == "file"
    cases = {
        "short": (np.arange(n - 1), r"short.npy: 119 entries, but the graph has 120 nodes"),
        "repeat": (np.r_[0, np.arange(n - 1)], r"repeat.npy: node 0 appears 2 times"),
        "range": (np.r_[np.arange(n - 1), n], r"range.npy: entry 119 is 120, outside \[0, 120\)"),
        "floats": (np.arange(n) * 1.0, r"floats.npy: expected a 1-D integer array, got float64"),
    }
    for name, (a, message) in cases.items():
        np.save(tmp_path / f"{name}.npy", a)
        with pytest.raises(OrderError, match=message):
            node_order.read(tmp_path / f"{name}.npy", n)
    (tmp_path / "text.npy").write_text("0 1 2\n")
    with pytest.raises(OrderError, match=r"text.npy: not a .npy order file"):
        node_order.read(tmp_path / "text.npy", n)
    with pytest.raises(OrderError, match=r"missing.npy: no such order file"):
        node_order.read(tmp_path / "missing.npy", n)
    with pytest.raises(OrderError, match=r"perm.txt: an order file is a .npy"):
        node_order.save(tmp_path / "perm.txt", o, "x")


def test_anything_but_an_order_file_is_refused_naming_it(rng, tmp_path, capsys):
    """An .npz, an empty, truncated or text file, a folder, a 2-D or object array: each
    refused naming the file before a byte of its array is read (an .npz once raised
    AttributeError: 'NpzFile' object has no attribute 'offset')."""
    g = scrambled_communities(rng, parts=2, size=30)
    n = g.num_nodes
    good = tmp_path / "good.npy"
    node_order.save(good, node_order.compute(g, "rcm"), node_order.fingerprint_of(g))
    data = good.read_bytes()
    np.savez(tmp_path / "perm.npz", perm=np.arange(n))
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "cut.npy").write_bytes(data[: 128 + 8 * n // 2])
    (tmp_path / "head.npy").write_bytes(data[:40])
    (tmp_path / "text.npy").write_text("\n".join(map(str, range(n))))
    (tmp_path / "folder.npy").mkdir()
    np.save(tmp_path / "square.npy", np.zeros((n, 2), np.int64))
    np.save(tmp_path / "objects.npy", np.array([None] * n, object), allow_pickle=True)
    cases = {
        "perm.npz": "an .npz archive, not a .npy order file",
        "empty.npy": "empty, not a .npy order file",
        "cut.npy": f"truncated .* its header promises {n} entries",
        "head.npy": "not a .npy order file",
        "text.npy": "not a .npy order file",
        "folder.npy": "a folder, not a .npy order file",
        "square.npy": r"expected a 1-D integer array, got int64 \(60, 2\)",
        "objects.npy": "expected a 1-D integer array, got object",
    }
    for name, message in cases.items():
        with pytest.raises(OrderError, match=f"{name}: {message}"):
            node_order.read(tmp_path / name, n, node_order.fingerprint_of(g))
    # end to end: one line naming the file, exit 2 (also another graph's order: its size)
    from mgg.cli import main

    capsys.readouterr()
    cora = str(shared_dataset("cora"))
    for name in ("perm.npz", "empty.npy", "good.npy"):
        assert main(["partition", cora, "--np", "2", "--order-file", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"mgg partition: error: {tmp_path / name}: ")


def test_metis_without_pymetis_says_how_to_install_it(rng, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)
    with pytest.raises(OrderError, match=r"--order metis needs pymetis: pip install 'mgg\[metis\]"):
        node_order.compute(random_graph(rng, 50, 200), "metis", parts=2)


def test_partition_json_reports_each_order_and_saves_one(tmp_path, capsys):
    from mgg.cli import main

    cora = shared_dataset("cora")
    argv = ["partition", str(cora), "--np", "4", "--order", "natural,rcm,metis", "--json"]
    assert main(argv) == 0
    st = last_json(capsys.readouterr().out)
    by = {o["order"]: o for o in st["orders"]}
    assert list(by) == ["natural", "rcm", "metis"]
    for o in by.values():
        assert len(o["halo_rows_per_rank"]) == 4 and sum(o["halo_rows_per_rank"]) == o["halo_rows"]
        assert 0 <= o["remote_fraction"] <= 1 and o["imbalance"] >= 1 and o["order_seconds"] >= 0
    # the last order's ranges (metis): each rank's halo is its in-edges' distinct outside sources
    z = np.load(cora)
    perm = node_order.compute(Graph(z["indptr"], z["indices"]), "metis", parts=4).perm
    bounds = np.r_[0, np.cumsum(st["nodes_per_rank"])]
    new = np.empty(2708, np.int64)
    new[perm] = np.arange(2708)
    src_new, dst_new = new[z["indices"]], new[np.repeat(np.arange(2708), np.diff(z["indptr"]))]
    want = []
    for r in range(4):
        mine = (dst_new >= bounds[r]) & (dst_new < bounds[r + 1])
        outside = src_new[mine][(src_new[mine] < bounds[r]) | (src_new[mine] >= bounds[r + 1])]
        want.append(len(np.unique(outside)))
    assert by["metis"]["halo_rows_per_rank"] == want
    assert by["metis"]["halo_rows"] < 0.5 * by["natural"]["halo_rows"]
    assert by["metis"]["remote_fraction"] < by["natural"]["remote_fraction"]
    # one order, saved; refused: several orders with --out, a second order with a file
    f = tmp_path / "perm.npy"
    assert (
        main(["partition", str(cora), "--np", "2", "--order", "metis", "--save-order", str(f)]) == 0
    )
    assert np.load(f).shape == (2708,)
    capsys.readouterr()
    bad = [
        (["--order", "rcm,metis", "--out", str(tmp_path / "o")], "several orders are compared"),
        (["--order", "rcm", "--order-file", str(f)], f"--order rcm and --order-file {f}"),
    ]
    for extra, message in bad:
        assert main(["partition", str(cora), "--np", "2", *extra]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["partition", str(cora), "--np", "2", "--order", "bogus"])
    assert "must be one of natural, degree, rcm, metis, got 'bogus'" in capsys.readouterr().err


@pytest.mark.mpi
def test_an_order_trains_alike_and_returns_predictions_by_original_id(tmp_path):
    """Without dropout, training is the same computation under any order (up to float
    summation order): at 2 ranks, natural, rcm and a saved metis order give the same loss
    curve, the same accuracy and the same prediction for each original node id; mgg check
    verifies every op against scipy and its outputs, by original id, equal natural's."""
    cora = shared_dataset("cora")
    perm = tmp_path / "metis.npy"
    script = tmp_path / "train.py"
    script.write_text(
        f"""
import json, sys
import numpy as np, torch
from mgg.comm import get_comm
from mgg.graph.specs import resolve
from mgg.partition import order as node_order
from mgg.torch import build_model
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer

comm = get_comm()
ds = resolve({str(cora)!r})
if comm.rank == 0:
    g = ds.graph
    node_order.save({str(perm)!r}, node_order.compute(g, "metis", 2), node_order.fingerprint_of(g))
comm.barrier()
out = {{}}
runs = (("natural", {{}}), ("rcm", {{"order": "rcm"}}), ("file", {{"order_file": {str(perm)!r}}}))
for name, kw in runs:
    dg, data = prepare(ds, comm, "gcn", seed=0, **kw)
    model = build_model("gcn", data.num_features, data.num_classes, dropout=0.0, seed=0)
    t = Trainer(dg, data, model, build_optimizer("adam", model, 0.01, 5e-4), eval_every=0)
    t.fit(30)
    s = t.summary()
    ids, pred = t.predict()
    every = comm.gather((ids, pred), root=0)
    if comm.rank == 0:
        ids = np.concatenate([e[0] for e in every]); pred = np.concatenate([e[1] for e in every])
        full = np.full(ds.graph.num_nodes, -1); full[ids] = pred
        out[name] = dict(losses=s["losses"], test=s["test_acc"], pred=full.tolist(),
                         lb=dg.lb, ids0=ids[:5].tolist(), order=data.order)
    dg.free()
if comm.rank == 0:
    print(json.dumps(out))
"""
    )
    r = mpirun(2, sys.executable, script, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = last_json(r.stdout)
    base = out["natural"]
    assert base["ids0"] == [0, 1, 2, 3, 4] and base["order"] == "natural"
    assert out["rcm"]["order"] == "rcm" and out["file"]["order"] == "metis"
    for name in ("rcm", "file"):
        got = out[name]
        assert got["ids0"] != base["ids0"]  # rank 0's rows are other nodes...
        np.testing.assert_allclose(got["losses"], base["losses"], rtol=2e-4)
        assert abs(got["test"] - base["test"]) < 0.005
        pred, want = np.array(got["pred"]), np.array(base["pred"])
        assert (pred >= 0).all()  # ...and every node is predicted once, by its own id
        assert (pred == want).mean() > 0.99
    outs = {}
    for order in ("natural", "metis"):
        d = tmp_path / order
        c = mpirun(
            2, "mgg", "check", cora, "--order", order, "--op", "all", "--designs",
            "pipelined,bulk_halo", "--repeat", "1", "--outputs", d, "--json",
        )  # fmt: skip
        assert c.returncode == 0, c.stderr[-2000:]
        res = last_json(c.stdout)
        assert res["order"] == order and all(run["ok"] for run in res["runs"])
        outs[order] = {p.name: np.load(p) for p in d.iterdir()}
    assert len(outs["metis"]) == 8 and outs["metis"].keys() == outs["natural"].keys()
    for name, a in outs["metis"].items():
        np.testing.assert_allclose(a, outs["natural"][name], rtol=1e-5, atol=1e-5)


@pytest.mark.mpi
def test_shards_keep_their_order_and_the_distributed_partitioner_takes_a_file(tmp_path, capsys):
    """A sharded dataset stores the renumbered plans and each rank's original ids; the
    distributed partitioner reading a saved order (or computing degree order from its
    slices) writes the same shards as one process; orders it cannot compute, and orders
    of another graph, are refused by name."""
    from mgg.cli import main

    cora = shared_dataset("cora")
    perm = tmp_path / "perm.npy"
    one = ["partition", str(cora), "--np", "2", "--json"]
    assert main([*one, "--order", "rcm", "--save-order", str(perm)]) == 0
    assert main([*one, "--order-file", str(perm), "--out", str(tmp_path / "a")]) == 0
    assert main([*one, "--order", "degree", "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    for d, flags in (("b", ["--order-file", perm]), ("d", ["--order", "degree"])):
        r = mpirun(2, "mgg", "partition", cora, "--distributed", "--out", tmp_path / d, *flags)
        assert r.returncode == 0, r.stderr[-2000:]
    for x, y in (("a", "b"), ("c", "d")):
        m, n = (json.loads((tmp_path / k / "manifest.json").read_text()) for k in (x, y))
        assert m["files"] == n["files"] and m["digests"] == n["digests"]
        assert m["order"] == n["order"] != "natural"
    ids = np.concatenate([np.load(tmp_path / "a" / f"rank-000{r}" / "ids.npy") for r in (0, 1)])
    np.testing.assert_array_equal(ids, np.load(perm))
    x0 = np.load(tmp_path / "a" / "rank-0000" / "x.npy")
    np.testing.assert_array_equal(x0, np.load(cora)["x"][ids[: len(x0)]])
    t = mpirun(2, "mgg", "train", "--dataset", tmp_path / "a", "--epochs", "2", "--json")
    assert t.returncode == 0 and last_json(t.stdout)["order"] == "rcm", t.stderr[-2000:]
    capsys.readouterr()
    pubmed_perm = tmp_path / "pubmed.npy"
    assert main(["partition", str(shared_dataset("pubmed")), "--np", "2", "--order", "rcm",
                 "--save-order", str(pubmed_perm)]) == 0  # fmt: skip
    refused = [  # one rank is enough to be refused
        (["train", "--dataset", tmp_path / "a", "--order", "metis"], "its nodes were ordered"),
        (["train", "--dataset", cora, "--order-file", ROOT / "README.md"], "not a .npy order"),
        (
            ["partition", cora, "--distributed", "--order", "rcm"],
            "--order rcm needs the whole graph, which --distributed never holds",
        ),
        (
            ["partition", cora, "--distributed", "--order-file", pubmed_perm],
            "pubmed.npy: computed for another graph (fingerprint",
        ),
    ]
    capsys.readouterr()
    for argv, message in refused:
        assert main([str(a) for a in argv]) == 2
        assert message in capsys.readouterr().err


def test_a_checkpoint_resumes_in_another_order_with_a_note(tmp_path):
    """No weight depends on the nodes' numbering: a run in rcm order resumes in natural
    order with the same weights, and says so."""
    from mgg.graph.specs import resolve
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.torch import build_model
    from mgg.train import Trainer

    ds = resolve("planted:nodes=400,classes=3")

    def trainer(order, log=None, folder=None):
        dg, data = prepare(ds, None, "gcn", order=order)
        model = build_model("gcn", data.num_features, data.num_classes, seed=0)
        opt = build_optimizer("adam", model, 0.01, 5e-4)
        return Trainer(dg, data, model, opt, eval_every=0, log=log, checkpoint_dir=folder)

    first = trainer("rcm", folder=tmp_path)
    first.fit(2)
    notes = []
    second = trainer("natural", log=notes.append)
    second.load_checkpoint(tmp_path / "epoch00002.pt")
    assert second.weights_digest() == first.weights_digest() and second.epoch == 2
    assert any("trained with nodes in rcm order, resumed in natural order" in n for n in notes)
    assert len(second.fit(4)) == 4


@pytest.mark.parametrize("block", [64, 1 << 26])
def test_an_npz_s_node_rows_by_id_are_read_forward_in_blocks(rng, tmp_path, monkeypatch, block):
    """What the distributed partitioner reads under an order: the rows of any original
    ids, dense or sparse features, labels and masks, a block at a time (tiny blocks: one
    row or less each)."""
    from mgg.graph.formats import members, slices, write_graph

    n = 500
    g = random_graph(rng, n, 3000)
    x = sp.random(n, 30, density=0.2, format="csr", dtype=np.float32, random_state=3)
    y = rng.integers(0, 4, n)
    masks = [rng.random(n) < 0.2]
    masks.append(~masks[0] & (rng.random(n) < 0.3))
    masks.append(~(masks[0] | masks[1]))
    for name, feats in (("sparse", x), ("dense", x.toarray())):
        path = tmp_path / f"{name}.npz"
        write_graph(Dataset(name, g, feats, y, *masks), path)
        monkeypatch.setattr(members, "TAKE_BYTES", block)
        ids = rng.permutation(n)[:137]
        got = slices.read_node_rows(path, 40, 177, ids=ids)
        got_x = got.x.toarray() if sp.issparse(got.x) else got.x
        np.testing.assert_array_equal(got_x, x.toarray()[ids])
        np.testing.assert_array_equal(got.y, y[ids])
        for a, b in zip(got.masks, masks, strict=True):
            np.testing.assert_array_equal(a, b[ids])
        np.testing.assert_array_equal(got.ids, ids)
