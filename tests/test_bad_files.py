"""A corpus of malformed or huge-declaring inputs, one per row: each must raise the right
error (GraphError for a malformed input, ResourceError when what it declares cannot fit)
naming the file (or spec) and the problem, before anything big is allocated."""

from __future__ import annotations

import gzip
import io
import json
import zipfile

import numpy as np
import pytest

from mgg.errors import GraphError, InputError, ResourceError
from mgg.footprint import check_job, estimate
from mgg.footprint.estimate import BASELINE, CHECK_BASELINE
from mgg.graph.formats import read_dataset, read_graph
from mgg.graph.formats.slices import read_edge_slice, read_node_rows
from mgg.graph.specs import resolve
from mgg.memory import LIMIT_ENV, available, available_bytes, format_bytes, parse_size, require

BIG = 10**12


@pytest.fixture(autouse=True)
def limit(monkeypatch):
    """Every case runs as if the rank had 1 GiB."""
    monkeypatch.setenv(LIMIT_ENV, "1G")
    monkeypatch.delenv("MGG_LOCAL_SIZE", raising=False)


# ---- builders: each writes its file(s) under tmp and returns what to read ----------------
def text(name, body):
    def make(tmp):
        p = tmp / name
        if name.endswith(".gz"):
            p.write_bytes(gzip.compress(body.encode()))
        else:
            p.write_text(body)
        return p

    return make


def npy_header(shape, dtype=np.int64) -> bytes:
    buf = io.BytesIO()
    hdr = np.lib.format.header_data_from_array_1_0(np.zeros(1, dtype))
    hdr["shape"] = shape
    np.lib.format.write_array_header_1_0(buf, hdr)
    return buf.getvalue() + b"\0" * 64


def npz(name, declared: dict, real: dict | None = None):
    """An npz whose members ``declared`` {key: shape} only declare their shape."""

    def make(tmp):
        p = tmp / name
        with zipfile.ZipFile(p, "w") as z:
            for k, shape in declared.items():
                z.writestr(k + ".npy", npy_header(shape))
            for k, a in (real or {}).items():
                buf = io.BytesIO()
                np.save(buf, a)
                z.writestr(k + ".npy", buf.getvalue())
        return p

    return make


def small_npz(name, **kw):
    def make(tmp):
        n = 10
        arrays = dict(indptr=np.arange(n + 1, dtype=np.int64), indices=np.arange(n) % n)
        arrays.update(kw)
        np.savez(tmp / name, **arrays)
        return tmp / name

    return make


def mgg_bin(entries: int):
    def make(tmp):
        np.arange(entries + 1, dtype="<i8").tofile(tmp / "g_beg_pos.bin")
        (np.arange(entries, dtype="<i8") % entries).tofile(tmp / "g_csr.bin")
        return tmp / "g_beg_pos.bin"

    return make


def ogb(nodes="10", edges="2", edge_text="0,1\n1,2\n", extra=None):
    def make(tmp):
        raw = tmp / "ogbn_thing" / "raw"
        raw.mkdir(parents=True)
        for name, body in (
            ("num-node-list.csv.gz", nodes + "\n"),
            ("num-edge-list.csv.gz", edges + "\n"),
            ("edge.csv.gz", edge_text),
        ):
            (raw / name).write_bytes(gzip.compress(body.encode()))
        for name, make_file in (extra or {}).items():
            make_file(raw / name)
        return tmp / "ogbn_thing"

    return make


def ogb_npz(declared: dict, real: dict):
    def make(path):
        npz(path.name, declared, real)(path.parent)

    return make


def gz_text(body):
    def make(path):
        path.write_bytes(gzip.compress(body.encode()))

    return make


def shards(nodes):
    def make(tmp):
        d = tmp / "big-2"
        d.mkdir()
        from mgg.partition.shards import VERSION, seal

        manifest = dict(
            format="mgg-shards", version=VERSION, run="r", np=2, num_nodes=nodes, num_edges=nodes,
            ps=16, bounds=[0, nodes // 2, nodes], graph_kind="gcn_norm", digests=["", ""],
            files=[{}, {}], symmetric=True, name="big", num_features=100, num_classes=10,
            features="dense", labels=True, fingerprint="",
        )  # fmt: skip
        (d / "manifest.json").write_text(json.dumps(seal(manifest)))
        return d

    return make


def read(path):
    return read_dataset(path)


def train_job(path):
    from mgg.partition.shards import ShardedDataset, is_sharded
    from mgg.torch import MODELS

    ds = ShardedDataset(path) if is_sharded(path) else read_dataset(path)
    return check_job(ds, 2, "train", source=path, model=MODELS["gcn"])


def split(path):
    return read_dataset(path).rows(0, 1)


def edge_slice(path):
    return read_edge_slice(path, 0, 2)


def node_rows(path):
    return read_node_rows(path, 0, 5)


def metis_file(path):
    return read_graph(path)


HUGE = "9" * 10_000
E, R = GraphError, ResourceError
# id, builder, reader, error, patterns the message must hold (besides the file's name)
CASES = [
    # edge lists, plain and gzip
    ("id-1e12", text("g.txt", f"0 1\n1 {BIG}\n"), read, R, ["line 2", "1,000,000,000,000"]),
    ("id-1e12-gz", text("g.txt.gz", f"0 1\n1 {BIG}\n"), read, R, ["line 2", "indptr"]),
    ("id-1e12-csv", text("g.csv", f"0,1\n{BIG},1\n"), read, R, ["line 2", "node id"]),
    ("id-later-chunk", text("g.txt", "# c\n\n0 1\n" * 3 + f"2 {BIG}\n"), read, R, ["line 10"]),
    ("id-over-limit", text("g.txt", "0 1\n1 200000000\n"), read, R, ["line 2", "1.0 GiB"]),
    ("header-1e12", text("h.txt", f"# Nodes: {BIG} Edges: 2\n0 1\n"), read, R,
     ["line 1", "header declares 1,000,000,000,000 nodes"]),
    ("header-1e12-gz", text("h.txt.gz", f"# Nodes: {BIG}\n0 1\n"), read, R, ["line 1"]),
    ("header-digits", text("h.txt", f"# Nodes: {HUGE}\n0 1\n"), read, E, ["line 1", "too many"]),
    ("header-disagrees", text("h.txt", "# Nodes: 3 Edges: 2\n0 1\n1 5\n"), read, E,
     ["line 3", "node id 5", ">= 3", "header on line 1"]),
    ("header-disagrees-gz", text("h.txt.gz", "# Nodes: 3\n0 1\n\n4 1\n"), read, E,
     ["line 4", "node id 4", "header on line 1"]),
    ("header-disagrees-csv", text("h.csv", "% Nodes: 2\n0,1\n1,2\n"), read, E,
     ["line 3", "node id 2"]),
    ("digits-dst", text("d.txt", f"0 {HUGE}\n"), read, E, ["line 1", "10,000 digits"]),
    ("digits-src", text("d.txt", f"0 1\n{HUGE} 1\n"), read, E, ["line 2", "column 1"]),
    ("digits-gz", text("d.txt.gz", f"0 1\n1 2\n0 {HUGE}\n"), read, E, ["line 3", "digits"]),
    ("digits-weight", text("w.txt", f"0 1 1\n1 2 {HUGE}\n"), read, E, ["line 2", "weight"]),
    ("id-1e18", text("g.txt", f"0 {10**18}\n"), read, E, ["line 1", "too large"]),
    ("id-negative", text("g.txt", "0 1\n-3 1\n"), read, E, ["line 2", "negative"]),
    ("edgelist-slice-1e12", text("g.txt", f"0 1\n1 {BIG}\n"), edge_slice, R,
     ["1,000,000,000,001 nodes"]),
    # npz
    ("npz-indptr-1e12", npz("a.npz", {"indptr": (BIG,), "indices": (BIG,)}), read, R,
     ["key 'indptr'", "(1000000000000,)"]),
    ("npz-x-huge", npz("x.npz", {"x": (10**6, 10**4)}, {"indptr": np.zeros(2, np.int64),
     "indices": np.zeros(0, np.int64)}), read, R, ["key 'x'", "(1000000, 10000)"]),
    ("npz-y-huge", npz("y.npz", {"y": (10**9, 100)}), read, R, ["key 'y'"]),
    ("npz-label-1e12", small_npz("l.npz", y=np.r_[np.zeros(9, np.int64), BIG]), train_job, R,
     ["1,000,000,000,001 classes", "largest label is 1,000,000,000,000"]),
    ("npz-label-split", small_npz("l.npz", y=np.r_[np.zeros(9, np.int64), BIG]), split, R,
     ["labels up to 1,000,000,000,000"]),
    ("npz-slice-1e12", npz("s.npz", {"indptr": (BIG,), "indices": (BIG,)}), edge_slice, R,
     ["key 'indptr'", "1,000,000,000,000"]),
    ("npz-rows-label", small_npz("r.npz", y=np.r_[np.zeros(9, np.int64), BIG]), node_rows, R,
     ["key 'y'", "1,000,000,000,001 classes"]),
    ("npz-rows-1e12", npz("r.npz", {"indptr": (BIG,)}, {"y": np.zeros(3, np.int64)}),
     node_rows, R, ["node data of 999,999,999,999 nodes"]),
    # MGG binary CSR
    ("mgg-bin-over-limit", mgg_bin(70_000_000 // 8 * 8), read, R, ["beg_pos", "csr entries"]),
    ("mgg-slice-over-limit", mgg_bin(70_000_000 // 8 * 8), edge_slice, R, ["beg_pos int64"]),
    # METIS
    ("metis-header-1e12", text("m.graph", f"{BIG} {BIG}\n2\n1\n"), metis_file, R,
     ["line 1", "1,000,000,000,000 vertices"]),
    ("metis-header-digits", text("m.graph", f"{HUGE} 1\n2\n1\n"), metis_file, E,
     ["line 1", "digits"]),
    ("metis-edges-digits", text("m.graph", f"2 {HUGE}\n2\n1\n"), metis_file, E, ["line 1"]),
    ("metis-ncon", text("m.graph", f"2 1 11 {HUGE}\n"), metis_file, E, ["line 1", "ncon"]),
    ("metis-gz-header-1e12", text("m.graph.gz", f"% c\n{BIG} 1\n2\n1\n"), metis_file, R,
     ["line 2"]),
    # OGB directories
    ("ogb-nodes-1e12", ogb(nodes=str(BIG)), read, R, ["1,000,000,000,000 nodes"]),
    ("ogb-edges-1e12", ogb(edges=str(BIG)), read, R, ["1,000,000,000,000 edges"]),
    ("ogb-nodes-digits", ogb(nodes=HUGE), read, E, ["num-node-list", "digits"]),
    ("ogb-features-wide", ogb(nodes="10000000", edges="1", edge_text="0,1\n",
     extra={"node-feat.csv.gz": gz_text(",".join(["1"] * 5000) + "\n")}), read, R,
     ["node-feat.csv.gz", "5,000 columns", "10,000,000 rows"]),
    ("ogb-binary-edges", ogb(extra={"data.npz": ogb_npz({"edge_index": (2, BIG)}, {
        "num_nodes_list": np.array([10]), "num_edges_list": np.array([BIG])})}), read, R,
     ["data.npz", "key 'edge_index'"]),
    ("ogb-binary-labels", ogb(extra={"node-label.npz": ogb_npz({"node_label": (BIG, 1)}, {})}),
     read, R, ["node-label.npz", "key 'node_label'"]),
    # sharded datasets: the manifest's sizes go into the job's estimate
    ("shards-1e12", shards(BIG), train_job, R, ["mgg train on 2 rank(s)", "per rank"]),
]  # fmt: skip

SPECS = [
    ("products:scale=1e9", R, ["2,449,029,000,000,000 nodes"]),
    ("reddit:scale=1e6", R, ["reddit:scale", "nodes"]),
    ("products:scale=inf", InputError, ["finite"]),
    ("products:scale=nan", InputError, ["finite"]),
    ("products:scale=-1", InputError, ["finite number > 0"]),
    ("products:scale=0", InputError, ["> 0"]),
    ("rmat:scale=100", InputError, ["integer in [0, 62]"]),
    ("rmat:scale=2.5", InputError, ["integer"]),
    ("rmat:scale=40", R, ["1,099,511,627,776 nodes"]),
    ("planted:nodes=1e12,classes=3", R, ["1,000,000,000,000 nodes"]),
    ("planted:nodes=1000,classes=3,degree=inf", InputError, ["degree=inf", "finite"]),
    ("planted:nodes=1000000,classes=3,features=1000000", R, ["1000000 features"]),
]


@pytest.mark.parametrize(("build", "reader", "error", "patterns"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_bad_file(tmp_path, build, reader, error, patterns):
    path = build(tmp_path)
    with pytest.raises(error) as info:
        reader(path)
    msg = str(info.value)
    assert path.name in msg or msg.startswith(path.stem + ":"), msg  # a file or its dataset
    for pat in patterns:
        assert pat in msg, (pat, msg)
    if error is ResourceError:
        assert "needs" in msg and "available" in msg, msg


@pytest.mark.parametrize(("spec", "error", "patterns"), SPECS, ids=[s[0] for s in SPECS])
def test_bad_spec(spec, error, patterns):
    with pytest.raises(error) as info:
        resolve(spec)
    msg = str(info.value)
    assert spec.split(":")[0] in msg, msg
    for pat in patterns:
        assert pat in msg, (pat, msg)


def test_cli_one_line_exit_2(tmp_path, capsys):
    from mgg.cli import main

    p = text("g.txt", f"0 1\n1 {BIG}\n")(tmp_path)
    assert main(["check", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "g.txt: line 2" in err and "7.3 TiB" in err, err


# ---- memory.py ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text_", "value"),
    [("2G", 2 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", 3 * 2**29), ("4096", 4096),
     ("1k", 1024), ("3 TB", 3 * 2**40)],
)  # fmt: skip
def test_parse_size(text_, value):
    assert parse_size(text_) == value


@pytest.mark.parametrize("bad", ["", "two", "2X", "-1G", "1Gi"])
def test_parse_size_rejects(bad, monkeypatch):
    with pytest.raises(InputError, match=LIMIT_ENV):
        parse_size(bad)
    monkeypatch.setenv(LIMIT_ENV, bad or "x")
    with pytest.raises(InputError):
        available_bytes()


def test_available_bytes_override(monkeypatch):
    assert available_bytes() == 2**30
    assert available() == (2**30, f"{LIMIT_ENV}=1G")
    monkeypatch.setenv(LIMIT_ENV, "300M")
    assert available_bytes() == 300 * 2**20


def test_available_bytes_per_rank(monkeypatch):
    monkeypatch.delenv(LIMIT_ENV)
    one, how = available()
    assert one > 0 and how
    monkeypatch.setenv("MGG_LOCAL_SIZE", "4")
    four, how4 = available()
    assert "/ 4 ranks on this node" in how4
    assert 0.15 * one < four < 0.35 * one  # MemAvailable moves a little between reads


def test_require():
    require(2**29, "half a GiB", "src")
    with pytest.raises(ResourceError) as info:
        require(2 * 2**30 + 1, "the thing", "spec:x")
    assert isinstance(info.value, MemoryError)
    msg = str(info.value)
    assert msg.startswith("spec:x: the thing needs 2.0 GiB but this rank has 1.0 GiB")
    assert f"({LIMIT_ENV}=1G)" in msg


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(8 * 10**12) == "7.3 TiB"
    assert format_bytes(1.5 * 2**30) == "1.5 GiB"


def test_estimate_parts():
    small = estimate(10_000, 100_000, 1, features=32, classes=8)
    big = estimate(1_000_000, 10_000_000, 1, features=32, classes=8)
    assert small["total"] < big["total"]
    assert big["total"] >= big["baseline"] + big["dataset"]
    sharded = estimate(1_000_000, 10_000_000, 4, features=32, classes=8, sharded=True)
    assert sharded["total"] < estimate(1_000_000, 10_000_000, 4, features=32, classes=8)["total"]
    wide = estimate(1_000_000, 10_000_000, 1, features=32, classes=8, hidden=256)
    assert wide["activations"] > big["activations"]


def test_check_job_small_dataset():
    from mgg.torch import MODELS

    ds = resolve("planted:nodes=500,classes=3")
    base = BASELINE / 2**20  # the interpreter and its libraries, what any job holds
    mb = check_job(ds, 2, "train", model=MODELS["gcn"])
    assert base < mb < 1000
    assert check_job(ds, 2, "check", dim=16) > CHECK_BASELINE / 2**20  # no torch
    assert check_job(ds, 2, "partition") > base
    # the dataset's and the model's facts reach the estimate
    assert check_job(ds, 2, "train", model=MODELS["gcn"], hidden=4096) > mb + 10
    assert check_job(ds, 2, "train", model=MODELS["gat"]) > mb
    assert check_job(ds, 2, "check", dim=4096) > check_job(ds, 2, "check", dim=16) + 10
    bigger = resolve("planted:nodes=50000,classes=3,features=64")
    assert check_job(bigger, 2, "train", model=MODELS["gcn"]) > mb + 10
