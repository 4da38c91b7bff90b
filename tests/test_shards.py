"""Sharded datasets and the distributed partitioner: plans equal build_plan's bit for bit,
each rank opens only its shard, and damaged or mismatched shards are refused."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from mgg.graph import Graph
from mgg.graph.core import GraphError, job_graph
from mgg.graph.dataset import Dataset
from mgg.graph.formats import write_graph, write_mgg_bin
from mgg.graph.formats.slices import read_edge_slice
from mgg.partition import build_plan
from mgg.partition.shards import ShardedDataset, ShardError, seal, write_sharded

from conftest import last_json, mpirun, random_graph, shared_dataset

KINDS = ("as_is", "no_self_loops", "self_loops", "gcn_norm")


def _dataset(rng, n=300, e=2500, sparse_x=False):
    g = random_graph(rng, n, e, hub_dst=True)
    x = rng.standard_normal((n, 12)).astype(np.float32)
    if sparse_x:
        x = sp.random(n, 40, density=0.1, format="csr", dtype=np.float32, random_state=1)
    y = rng.integers(0, 4, n)
    return Dataset("toy", g, x, y)


def _write(ds, out, p=3, kind="gcn_norm", ps=8):
    plans = build_plan(job_graph(ds.graph, kind), p, ps)
    rows = [ds.rows(q.lb, q.ub) for q in plans]
    return plans, write_sharded(out, plans, rows, kind, {"spec": "toy"})


@pytest.mark.parametrize("sparse_x", [False, True])
def test_each_rank_reads_back_its_plan_and_rows(rng, tmp_path, sparse_x):
    ds = _dataset(rng, sparse_x=sparse_x)
    plans, manifest = _write(ds, tmp_path / "d")
    sd = ShardedDataset(tmp_path / "d")
    assert (sd.np, sd.num_nodes, sd.num_edges) == (3, 300, plans[0].num_edges)
    for q in plans:
        s = sd.open(q.rank, 3)
        assert s.plan.digest() == q.digest() == manifest["digests"][q.rank]
        for name, a in q.arrays().items():
            np.testing.assert_array_equal(s.plan.arrays()[name], a)
        got_x = s.rows.x.toarray() if sparse_x else s.rows.x
        want_x = ds.x[q.lb : q.ub]
        np.testing.assert_array_equal(got_x, want_x.toarray() if sparse_x else want_x)
        np.testing.assert_array_equal(s.rows.y, ds.y[q.lb : q.ub])
        want_masks = ds.rows(q.lb, q.ub).masks
        for got, want in zip(s.rows.masks, want_masks, strict=True):
            np.testing.assert_array_equal(got, want)
        assert s.plan.transposed.digest() == q.transposed.digest()


def test_prepare_from_shards_equals_prepare_from_the_dataset(rng, tmp_path):
    from mgg.prepare import prepare

    ds = _dataset(rng)
    _write(ds, tmp_path / "d", p=1, kind="no_self_loops")
    g1, d1 = prepare(ds, None, "gin")
    g2, d2 = prepare(ShardedDataset(tmp_path / "d"), None, "gin", ps=16)
    assert g1.plan.digest() == g2.plan.digest()
    for a, b in zip(
        (d1.x, d1.y, d1.train_mask, d1.test_mask),
        (d2.x, d2.y, d2.train_mask, d2.test_mask),
        strict=True,
    ):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ShardError, match="graph kind .no_self_loops.*--model gcn"):
        prepare(ShardedDataset(tmp_path / "d"), None, "gcn")


def test_damaged_or_mismatched_shards_are_refused(rng, tmp_path):
    ds = _dataset(rng)
    d = tmp_path / "d"
    _write(ds, d)
    sd = ShardedDataset(d)
    with pytest.raises(ShardError, match="partitioned for 3 ranks, but the job has 2"):
        sd.open(0, 2)
    # truncated
    f = d / "rank-0001" / "local_indices.npy"
    data = f.read_bytes()
    f.write_bytes(data[:-4])
    with pytest.raises(ShardError, match=r"rank-0001/local_indices.npy: .* bytes.*truncated"):
        sd.open(1, 3)
    # same size, one byte changed
    f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ShardError, match="local_indices.npy: contents differ"):
        sd.open(1, 3)
    f.write_bytes(data)
    sd.open(1, 3)
    # missing file, missing shard
    (d / "rank-0002" / "y.npy").unlink()
    with pytest.raises(ShardError, match="rank-0002/y.npy: missing"):
        sd.open(2, 3)
    shutil.rmtree(d / "rank-0002")
    with pytest.raises(ShardError, match="rank-0002: missing"):
        sd.open(2, 3)
    # a shard of another run
    _write(ds, tmp_path / "e")
    shutil.copytree(tmp_path / "e" / "rank-0002", d / "rank-0002")
    with pytest.raises(ShardError, match="another partitioning run.*mixed"):
        sd.open(2, 3)
    # another rank's folder: a link to it, or a copy of it, names the folder that is wrong
    shutil.rmtree(d / "rank-0002")
    (d / "rank-0002").symlink_to("rank-0000")
    with pytest.raises(ShardError, match=r"rank-0002: a link to rank-0000, the shard of rank 0, "
                       "not of rank 2: every rank needs its own folder"):  # fmt: skip
        sd.open(2, 3)
    (d / "rank-0002").unlink()
    shutil.copytree(d / "rank-0001", d / "rank-0002")
    with pytest.raises(ShardError, match=r"rank-0002: a copy of the shard of rank 1, not of rank"):
        sd.open(2, 3)
    # manifest: version, keys, garbage
    m = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps(seal({**m, "version": 99})))
    with pytest.raises(ShardError, match="format version 99"):
        ShardedDataset(d)
    old = {k: v for k, v in m.items() if k != "digest"}  # version 1 had no digest
    (d / "manifest.json").write_text(json.dumps({**old, "version": 1}))
    with pytest.raises(ShardError, match="format version 1, .* again .*mgg partition --out"):
        ShardedDataset(d)
    no_bounds = seal({k: v for k, v in m.items() if k not in ("bounds", "digest")})
    (d / "manifest.json").write_text(json.dumps(no_bounds))
    with pytest.raises(ShardError, match="missing keys bounds"):
        ShardedDataset(d)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ShardError, match="unreadable manifest"):
        ShardedDataset(d)
    with pytest.raises(ShardError, match="not a sharded dataset"):
        ShardedDataset(tmp_path)


def test_writing_is_atomic(rng, tmp_path, monkeypatch):
    import mgg.partition.shards as shards

    ds = _dataset(rng)
    out = tmp_path / "d"
    real = shards.write_shard

    def crash_on_rank_2(target, plan, rows):
        if plan.rank == 2:
            raise OSError("disk full")
        return real(target, plan, rows)

    monkeypatch.setattr(shards, "write_shard", crash_on_rank_2)
    with pytest.raises(OSError, match="disk full"):
        _write(ds, out)
    assert [p.name for p in tmp_path.iterdir()] == [".d.lock"]  # no out, no temporary
    monkeypatch.setattr(shards, "write_shard", real)
    _, first = _write(ds, out)
    with pytest.raises(FileExistsError, match="already exists"):
        _write(ds, out)
    plans = build_plan(job_graph(ds.graph, "gcn_norm"), 2, 8)
    second = write_sharded(
        out, plans, [ds.rows(q.lb, q.ub) for q in plans], "gcn_norm", {}, force=True
    )
    assert ShardedDataset(out).np == 2 and second["run"] != first["run"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".d.lock", "d"]


@pytest.mark.parametrize(
    "key, value",
    [("symmetric", True), ("graph_kind", "as_is"), ("num_nodes", 301), ("num_classes", 2)],
)
def test_an_edited_manifest_is_refused(rng, tmp_path, key, value):
    """The manifest's digest covers every key: flipping symmetric (the backward pass would
    reuse the forward plan), the graph kind (SAGE on GCN's normalized graph), the node or
    class count is refused, naming the manifest."""
    ds = _dataset(rng)
    d = tmp_path / "d"
    _write(ds, d)
    path = d / "manifest.json"
    m = json.loads(path.read_text())
    assert m[key] != value and not m["symmetric"]
    path.write_text(json.dumps({**m, key: value}, indent=1))
    with pytest.raises(ShardError, match=f"{path}: edited after it was written"):
        ShardedDataset(d)
    if key == "symmetric":  # digest made again: the plan a rank opens is checked too
        path.write_text(json.dumps(seal({**m, key: value})))
        with pytest.raises(ShardError, match=f"{path}: does not describe the plan of .*rank-0001"):
            ShardedDataset(d).open(1, 3)


# ---- the distributed partitioner ----------------------------------------------------------
def _messy_edgelist(rng, path, n=400, e=3000, weighted=True):
    """An edge list in file order with duplicates, loops, comments, blank lines, a header
    that declares more nodes than the ids use; returns the Graph read_edgelist gives."""
    src, dst = rng.integers(0, n - 7, e), rng.integers(0, n - 7, e)
    dst[: e // 4] = 5  # a hub
    src[10:20] = dst[10:20]  # loops
    w = rng.random(e).astype(np.float32) if weighted else None
    lines = [f"# Nodes: {n} Edges: {e}", "# src dst"]
    for i in range(e):
        lines.append(f"{src[i]} {dst[i]}" + (f" {w[i]:.9g}" if weighted else ""))
        if i % 700 == 350:
            lines += ["", "# Nodes: 999 (after edges: not a header)"]
    path.write_text("\n".join(lines) + "\n")
    from mgg.graph.formats import read_edgelist

    return read_edgelist(path)


DIST_SCRIPT = """
import json, sys
from mgg.comm import get_comm
from mgg.graph.formats.slices import read_edge_slice
from mgg.partition.distributed import build_plan_distributed
comm = get_comm("mpi")
KINDS = sys.argv[2].split(",")
out = {}
for path in sys.argv[3:]:
    part = read_edge_slice(path, comm.rank, comm.size)
    for kind in KINDS:
        plan = build_plan_distributed(part, comm, 8, kind=kind)
        out[path + "|" + kind] = plan.digest()
got = comm.gather(out)
if comm.rank == 0:
    json.dump(got, open(sys.argv[1], "w"))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_distributed_partitioner_equals_build_plan(rng, tmp_path, nprocs):
    """Edge lists (weighted, unweighted), MGG binary CSR, npz (directed and undirected):
    every rank's plan of every graph kind, bit for bit."""
    graphs = {}
    p = tmp_path / "w.txt"
    graphs[p] = _messy_edgelist(rng, p)
    p = tmp_path / "u.txt"
    graphs[p] = _messy_edgelist(rng, p, weighted=False)
    g = random_graph(rng, 350, 2800, hub_src=True)
    p = tmp_path / "hub"
    write_mgg_bin(g, p)
    graphs[tmp_path / "hub_beg_pos.bin"] = g
    wg = Graph(g.indptr, g.indices, rng.random(g.num_edges).astype(np.float32))
    p = tmp_path / "d.npz"
    write_graph(Dataset("d", wg), p)
    graphs[p] = wg
    s = random_graph(rng, 300, 1500).symmetrize()
    p = tmp_path / "s.npz"
    write_graph(Dataset("s", s), p)
    graphs[p] = s
    script = tmp_path / "job.py"
    script.write_text(DIST_SCRIPT)
    res = tmp_path / "digests.json"
    r = mpirun(nprocs, "python", script, res, ",".join(KINDS), *graphs, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(res.read_text())
    for path, graph in graphs.items():
        for kind in KINDS:
            want = build_plan(job_graph(graph, kind), nprocs, 8)
            for rank in range(nprocs):
                assert got[rank][f"{path}|{kind}"] == want[rank].digest(), (path, kind, rank)
    assert s.symmetric and build_plan(s, nprocs, 8)[0].symmetric


@pytest.mark.mpi
def test_distributed_cli_writes_the_same_shards_as_one_process(tmp_path, capsys):
    from mgg.cli import main

    cora = shared_dataset("cora")
    assert main(["partition", str(cora), "--np", "3", "--out", str(tmp_path / "a"), "--json"]) == 0
    one = last_json(capsys.readouterr().out)
    r = mpirun(3, "mgg", "partition", cora, "--out", tmp_path / "b", "--distributed", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_json(r.stdout)["digests"] == one["digests"]
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "ab")
    assert a["files"] == b["files"] and a["digests"] == b["digests"] and a["run"] != b["run"]
    stored = len(np.load(cora)["indices"])  # the plans add self loops: the manifest keeps both
    assert a["source"]["num_edges"] == b["source"]["num_edges"] == stored < a["num_edges"]
    t = mpirun(3, "mgg", "train", "--dataset", tmp_path / "b", "--epochs", "1", "--json")
    assert t.returncode == 0 and last_json(t.stdout)["num_edges"] == stored, t.stderr[-2000:]
    c = mpirun(3, "mgg", "check", tmp_path / "b", "--op", "all", "--repeat", "1", "--json")
    assert c.returncode == 0 and all(d["ok"] for d in last_json(c.stdout)["designs"].values())
    bad = mpirun(2, "mgg", "check", tmp_path / "b", "--repeat", "1")
    assert bad.returncode != 0 and "partitioned for 3 ranks, but the job has 2" in bad.stderr


def test_slices_cover_every_line_once_and_errors_name_the_line(rng, tmp_path):
    p = tmp_path / "e.txt"
    g = _messy_edgelist(rng, p, e=500)
    edges = [
        tuple(map(int, line.split()[:2]))
        for line in p.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for size in (1, 3, 7):
        parts = [read_edge_slice(p, r, size) for r in range(size)]
        got = list(
            zip(
                np.concatenate([q.src for q in parts]).tolist(),
                np.concatenate([q.dst for q in parts]).tolist(),
                strict=True,
            )
        )
        assert got == edges
        assert max(q.min_nodes for q in parts) < g.num_nodes == parts[0].header_nodes == 400
    text = p.read_text().splitlines()
    text[300] = "12 x7 0.5"
    p.write_text("\n".join(text) + "\n")
    with pytest.raises(GraphError, match=r"e.txt: line 301: node id 'x7'"):
        for r in range(3):
            read_edge_slice(p, r, 3)
    cols = tmp_path / "cols.txt"
    cols.write_text("".join(f"{i} {i + 1}\n" for i in range(200)) + "5 6 0.5\n")
    with pytest.raises(GraphError, match="cols.txt: line 201: expected 2 columns as on line 1"):
        for r in range(3):
            read_edge_slice(cols, r, 3)
    gz = tmp_path / "e.txt.gz"
    import gzip

    gz.write_bytes(gzip.compress(b"1 2\n"))
    with pytest.raises(GraphError, match="gzip edge list has no random access"):
        read_edge_slice(gz, 0, 2)


@pytest.mark.mpi
def test_distributed_errors_end_the_job_with_the_file_and_problem(tmp_path):
    q = tmp_path / "mixed.txt"
    q.write_text("1 2\n" * 300 + "1 2 3\n" * 200)  # rank 1 starts at the first 3
    r = mpirun(2, "mgg", "partition", q, "--distributed", timeout=120)
    assert r.returncode != 0 and "every line needs the same columns" in r.stderr
    s = tmp_path / "asym.npz"
    g = Graph.from_edges(np.array([0, 1, 2]), np.array([1, 2, 0]), 3)
    write_graph(Dataset("asym", g), s)
    z = dict(np.load(s))
    z["meta"] = np.array(json.dumps({"directed": False}))
    np.savez(s, **z)
    r = mpirun(2, "mgg", "partition", s, "--distributed", timeout=120)
    assert r.returncode != 0 and "says the graph is undirected" in r.stderr
    h = tmp_path / "header.txt"  # the id past the header lies in rank 1's slice
    h.write_text("# Nodes: 3\n" + "0 1\n" * 300 + "1 5\n")
    r = mpirun(2, "mgg", "partition", h, "--distributed", timeout=120)
    assert r.returncode == 2 and "header.txt: node id 5 is >= 3" in r.stderr, r.stderr
    assert r.stderr.count("error:") == 1, r.stderr
    g = Graph.from_edges(np.arange(40), (np.arange(40) + 1) % 40, 40)
    e = tmp_path / "no_train.npz"  # each rank's rows may hold no train node; the whole must
    train = np.arange(40) == 0
    write_graph(Dataset("e", g, y=np.zeros(40, np.int64), train_mask=train, val_mask=~train), e)
    np.savez(e, **{**np.load(e), "train_mask": np.zeros(40, bool)})
    w = tmp_path / "negative.npz"
    write_graph(Dataset("w", Graph(g.indptr, g.indices, -np.ones(40, np.float32))), w)
    for path, problem in [(e, "the train mask selects no node"), (w, "40 of 80 edge weights")]:
        r = mpirun(2, "mgg", "partition", path, "--distributed", "--out", tmp_path / "o")
        assert r.returncode == 2 and f"{path}: {problem}" in r.stderr, r.stderr
        assert not (tmp_path / "o").exists()


def test_npz_slices_check_the_split_as_one_process_does(tmp_path):
    from mgg.graph.formats.slices import read_node_rows

    g = Graph.from_edges(np.arange(9), np.arange(1, 10), 10)
    half = np.arange(10) < 5
    p = tmp_path / "d.npz"
    np.savez(p, indptr=g.indptr, indices=g.indices, y=np.arange(10) % 2, train_mask=half)
    rows = read_node_rows(p, 3, 8)
    np.testing.assert_array_equal(rows.masks[0], half[3:8])
    assert not rows.masks[1].any() and not rows.masks[2].any()
    assert rows.notes == "no val or test mask: its metric is null"
    np.savez(p, indptr=g.indptr, indices=g.indices, y=np.arange(10) % 2, train_mask=half,
             val_mask=np.arange(10) >= 4)  # fmt: skip
    with pytest.raises(GraphError, match=r"d.npz: train_mask and val_mask share 1 nodes .*node 4"):
        read_node_rows(p, 2, 9)
    read_node_rows(p, 5, 9)  # the overlap is not in these rows: each rank checks its own


@pytest.mark.parametrize("sparse_x", [False, True])
def test_npz_slices_read_the_rows_one_process_reads(rng, tmp_path, sparse_x):
    from mgg.graph.formats import read_npz
    from mgg.graph.formats.slices import read_node_rows

    ds = _dataset(rng, sparse_x=sparse_x)
    ds.graph = Graph(ds.graph.indptr, ds.graph.indices, rng.random(ds.graph.num_edges))
    p = tmp_path / "d.npz"
    write_graph(ds, p)
    whole = read_npz(p)
    src, dst = whole.graph.edges()
    parts = [read_edge_slice(p, r, 3) for r in range(3)]
    np.testing.assert_array_equal(np.concatenate([q.src for q in parts]), src)
    np.testing.assert_array_equal(np.concatenate([q.dst for q in parts]), dst)
    np.testing.assert_array_equal(np.concatenate([q.weights for q in parts]), whole.graph.weights)
    for lb, ub in ((0, 300), (17, 120), (299, 300), (50, 50)):
        got, want = read_node_rows(p, lb, ub), whole.rows(lb, ub)
        gx, wx = (a.toarray() if sp.issparse(a) else a for a in (got.x, want.x))
        np.testing.assert_array_equal(gx, wx)
        np.testing.assert_array_equal(got.y, want.y)
        for a, b in zip(got.masks, want.masks, strict=True):
            np.testing.assert_array_equal(a, b)
        assert got.num_classes == want.num_classes and got.notes == want.notes


def test_a_multilabel_ogb_directory_trains_the_same_from_shards(tmp_path, capsys):
    """OGB directory -> mgg partition --out -> the shards' y [n, T], masks, and training
    (BCE, ROC-AUC) equal to training on the directory itself."""
    from test_ogb import ogb_dir, random_edges, random_split

    from mgg.cli import main
    from mgg.graph.formats import read_ogb
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.torch import build_model
    from mgg.train import Trainer

    rng = np.random.default_rng(7)
    n = 60
    src, dst = random_edges(rng, n, 400)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    y = rng.integers(0, 2, (n, 3))
    root = ogb_dir(tmp_path, "tiny", src, dst, n, x=x, labels=y, split=random_split(n, rng))
    out = tmp_path / "shards"
    assert main(["partition", str(root), "--np", "1", "--model", "sage", "--out", str(out)]) == 0
    capsys.readouterr()

    def run(source):
        g, data = prepare(source, None, "sage")
        model = build_model("sage", data.num_features, data.num_classes, seed=0)
        t = Trainer(g, data, model, build_optimizer("adam", model, 0.01, 0.0), eval_every=0)
        t.fit(3)
        return data, t.summary()

    (d1, s1), (d2, s2) = run(read_ogb(root)), run(ShardedDataset(out))
    assert d2.y.shape == (n, 3) and d2.y.dtype == d1.y.dtype
    assert s1["losses"] == s2["losses"] and s2["metric"] == "rocauc"
    assert s1["test_acc"] == s2["test_acc"]


def test_partition_imports_no_torch_unless_a_model_is_named(tmp_path):
    """torch is 1.6 s of CPU a rank: mgg partition loads it only to look up --model."""
    code = (
        "import sys\nfrom mgg.cli import main\n"
        f"assert main(['partition', 'planted:nodes=300,classes=2', '--np', '2', '--out', "
        f"{str(tmp_path / 's')!r}, '--model', sys.argv[1]]) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    for model, loads in (("gcn_norm", "False"), ("gat", "True")):
        out = subprocess.run(
            [sys.executable, "-c", code, model], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[-1] == loads, (model, out.stdout)
        shutil.rmtree(tmp_path / "s")
