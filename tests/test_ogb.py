"""OGB node-property-prediction directories (CSV and binary raw forms), the chunked CSV
parser, multi-label targets and their ROC-AUC, and a short multi-label training run."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pytest
import torch

import mgg.torch as mt
from mgg.graph import Graph, GraphError
from mgg.graph.formats import is_ogb_dir, read_dataset, read_graph, read_ogb
from mgg.graph.formats._common import find_asymmetry
from mgg.graph.formats._csv import read_csv_rows
from mgg.graph.specs import resolve
from mgg.metrics import rocauc
from mgg.prepare import prepare
from mgg.train import Trainer


# ---- building OGB directories -----------------------------------------------------------------
def gz(path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode() if isinstance(text, str) else text))


def rows(a) -> str:
    """CSV text of a 1-D or 2-D array, floats written so that float32 reads back exactly."""
    a = np.asarray(a)
    a = a[:, None] if a.ndim == 1 else a
    fmt = (lambda v: repr(float(v))) if a.dtype.kind == "f" else str
    return "".join(",".join(fmt(v) for v in r) + "\n" for r in a)


def ogb_dir(
    tmp_path,
    name,
    src,
    dst,
    n,
    *,
    x=None,
    labels=None,
    label_text=None,
    split=None,
    split_name="time",
    edge_feat=None,
    binary=False,
):
    """Write an OGB directory ROOT/name as OGB lays it out; returns ROOT/name."""
    root = tmp_path / name
    raw = root / "raw"
    raw.mkdir(parents=True)
    if binary:
        arrays = {
            "edge_index": np.stack([src, dst]).astype(np.int64),
            "num_nodes_list": np.array([n]),
            "num_edges_list": np.array([len(src)]),
        }
        if x is not None:
            arrays["node_feat"] = x
        if edge_feat is not None:
            arrays["edge_feat"] = edge_feat
        np.savez_compressed(raw / "data.npz", **arrays)
        if labels is not None:
            np.savez_compressed(raw / "node-label.npz", node_label=labels)
    else:
        gz(raw / "edge.csv.gz", "".join(f"{u},{v}\n" for u, v in zip(src, dst, strict=True)))
        gz(raw / "num-node-list.csv.gz", f"{n}\n")
        gz(raw / "num-edge-list.csv.gz", f"{len(src)}\n")
        if x is not None:
            gz(raw / "node-feat.csv.gz", rows(x))
        if edge_feat is not None:
            gz(raw / "edge-feat.csv.gz", rows(edge_feat))
        if label_text is not None:
            gz(raw / "node-label.csv.gz", label_text)
        elif labels is not None:
            gz(raw / "node-label.csv.gz", rows(labels))
    for part, ids in (split or {}).items():
        gz(root / "split" / split_name / f"{part}.csv.gz", rows(np.asarray(ids, np.int64)))
    return root


def random_split(n, rng):
    perm = rng.permutation(n)
    a, b = n // 2, 3 * n // 4
    return {"train": perm[:a], "valid": perm[a:b], "test": perm[b:]}


def masks_of(split, n):
    out = []
    for part in ("train", "valid", "test"):
        m = np.zeros(n, bool)
        m[split[part]] = True
        out.append(m)
    return out


def ds_masks(ds):
    return ds.train_mask, ds.val_mask, ds.test_mask


def random_edges(rng, n, e):
    return rng.integers(0, n, e), rng.integers(0, n, e)


def assert_graph(g: Graph, want: Graph):
    assert g.num_nodes == want.num_nodes
    np.testing.assert_array_equal(g.indptr, want.indptr)
    np.testing.assert_array_equal(g.indices, want.indices)


def symmetric_oracle(src, dst, n):
    pairs = {(int(u), int(v)) for u, v in zip(src, dst, strict=True)}
    pairs |= {(v, u) for u, v in pairs}
    s, d = np.array(sorted(pairs)).T
    return Graph.from_edges(s, d, n).sort_rows()


def raises_at(fn, path, where, match):
    with pytest.raises(GraphError) as info:
        fn()
    msg = str(info.value)
    assert str(path) in msg, msg
    assert where in msg, msg
    assert re.search(match, msg), msg
    return msg


@pytest.fixture
def arxiv_like(tmp_path):
    """ogbn_arxiv-named directory: directed, 40 classes, features, a time split."""
    rng = np.random.default_rng(0)
    n = 30
    src, dst = random_edges(rng, n, 120)
    x = rng.standard_normal((n, 5)).astype(np.float32)
    y = rng.integers(0, 40, n)
    split = random_split(n, rng)
    root = ogb_dir(tmp_path, "ogbn_arxiv", src, dst, n, x=x, labels=y, split=split)
    return root, src, dst, n, x, y, split


# ---- reading ---------------------------------------------------------------------------------
def test_csv_directory_matches_the_oracle(arxiv_like):
    root, src, dst, n, x, y, split = arxiv_like
    ds = read_ogb(root)
    assert ds.name == "ogbn-arxiv" and ds.num_classes == 40 and not ds.multilabel
    assert_graph(ds.graph, Graph.from_edges(src, dst, n))  # directed, duplicates kept
    assert ds.graph.symmetric is None
    np.testing.assert_array_equal(ds.x, x)  # exact float32
    np.testing.assert_array_equal(ds.y, y)
    for got, want in zip(ds_masks(ds), masks_of(split, n), strict=True):
        np.testing.assert_array_equal(got, want)
    assert ds.meta["eval_metric"] == "acc" and ds.meta["split"] == "time"


def test_add_inverse_edge_datasets_are_symmetric(tmp_path):
    rng = np.random.default_rng(1)
    n = 25
    src, dst = random_edges(rng, n, 80)
    y = rng.integers(0, 47, n)
    split = random_split(n, rng)
    root = ogb_dir(
        tmp_path, "ogbn_products", src, dst, n, labels=y, split=split, split_name="sales_ranking"
    )
    ds = read_ogb(root)
    assert ds.graph.symmetric is True and find_asymmetry(ds.graph) is None
    assert_graph(ds.graph, symmetric_oracle(src, dst, n))  # each edge and its reverse, once
    assert ds.x is None and ds.num_classes == 47 and ds.meta["split"] == "sales_ranking"


def test_unlabeled_nodes_are_left_out_of_every_mask(tmp_path):
    rng = np.random.default_rng(2)
    n = 12
    src, dst = random_edges(rng, n, 30)
    y = rng.integers(0, 5, n).astype(object)
    unlabeled = [1, 4, 7]
    y[unlabeled] = "nan"
    split = {"train": np.arange(0, 6), "valid": np.arange(6, 9), "test": np.arange(9, 12)}
    text = "".join(f"{v}\n" for v in y)
    root = ogb_dir(tmp_path, "mine", src, dst, n, label_text=text, split=split)
    ds = read_ogb(root)
    assert ds.name == "mine" and ds.meta["unlabeled_nodes"] == 3
    assert (ds.y[unlabeled] == 0).all()
    for m, want in zip(ds_masks(ds), masks_of(split, n), strict=True):
        want[unlabeled] = False
        np.testing.assert_array_equal(m, want)


def test_multilabel_targets_and_edge_feature_means(tmp_path):
    rng = np.random.default_rng(3)
    n, t = 20, 3
    src, dst = random_edges(rng, n, 60)
    y = rng.integers(0, 2, (n, t))
    ef = rng.random((60, 2)).astype(np.float32)
    split = random_split(n, rng)
    root = ogb_dir(tmp_path, "tiny", src, dst, n, labels=y, split=split, edge_feat=ef)
    ds = read_ogb(root)  # unknown name: directed, multi-label since T > 1 columns
    assert ds.multilabel and ds.y.dtype == np.int8 and ds.y.shape == (n, t)
    np.testing.assert_array_equal(ds.y, y)
    assert ds.num_classes == t and ds.meta["eval_metric"] == "rocauc"
    want = np.zeros((n, 2))  # no node features: x = mean feature of the in-edges
    for j in range(2):
        want[:, j] = np.bincount(dst, ef[:, j], n) / np.maximum(np.bincount(dst, minlength=n), 1)
    np.testing.assert_allclose(ds.x, want, rtol=1e-6)
    assert read_ogb(root, edge_feat="skip").x is None


def test_proteins_named_directory_uses_its_row(tmp_path):
    rng = np.random.default_rng(4)
    n = 10
    src, dst = random_edges(rng, n, 20)
    y = rng.integers(0, 2, (n, 112))
    split = random_split(n, rng)
    root = ogb_dir(
        tmp_path,
        "ogbn_proteins",
        src,
        dst,
        n,
        labels=y,
        split=split,
        split_name="species",
        edge_feat=np.ones((20, 8), np.float32),
    )
    ds = read_ogb(root)
    assert ds.name == "ogbn-proteins" and ds.multilabel and ds.num_classes == 112
    assert ds.graph.symmetric and ds.meta["split"] == "species"
    touched = np.bincount(np.concatenate([src, dst]), minlength=n) > 0
    np.testing.assert_array_equal(ds.x, np.where(touched[:, None], 1.0, 0.0) * np.ones((1, 8)))


def test_binary_raw_form(tmp_path):
    rng = np.random.default_rng(5)
    n = 40
    src, dst = random_edges(rng, n, 150)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = rng.integers(0, 172, n).astype(np.float64)[:, None]
    y[::5] = np.nan  # unlabeled, as ogbn-papers100M
    split = random_split(n, rng)
    root = ogb_dir(tmp_path, "ogbn_papers100M", src, dst, n, x=x, labels=y, split=split, binary=1)
    ds = read_ogb(root)
    assert ds.name == "ogbn-papers100M" and ds.num_classes == 172
    assert_graph(ds.graph, Graph.from_edges(src, dst, n))
    np.testing.assert_array_equal(ds.x, x)
    labeled = ~np.isnan(y[:, 0])
    np.testing.assert_array_equal(ds.y[labeled], y[labeled, 0])
    assert not ds.train_mask[::5].any() and ds.meta["unlabeled_nodes"] == 8


def test_dispatch_reads_ogb_directories(arxiv_like):
    root = arxiv_like[0]
    assert is_ogb_dir(root) and not is_ogb_dir(root / "raw")
    a, b, c = read_dataset(root), resolve(str(root)), read_graph(root)
    assert a.name == b.name == "ogbn-arxiv"
    assert_graph(b.graph, a.graph)
    assert_graph(c, a.graph)


# ---- bad input -------------------------------------------------------------------------------
def test_missing_split_file(arxiv_like):
    root = arxiv_like[0]
    f = root / "split" / "time" / "valid.csv.gz"
    f.unlink()
    raises_at(lambda: read_ogb(root), f, "missing", "train.csv.gz, valid.csv.gz")


def test_row_counts_that_disagree(tmp_path):
    rng = np.random.default_rng(6)
    src, dst = random_edges(rng, 10, 20)
    root = ogb_dir(tmp_path, "a", src, dst, 10, labels=np.zeros(9, int))
    raises_at(lambda: read_ogb(root), root / "raw" / "node-label.csv.gz", "line 9", "9 lines")
    root = ogb_dir(tmp_path, "b", src, dst, 10, x=np.ones((11, 2), np.float32))
    raises_at(lambda: read_ogb(root), root / "raw/node-feat.csv.gz", "line 11", "more than 10")
    root = ogb_dir(tmp_path, "c", src, dst, 10)
    gz(root / "raw" / "num-edge-list.csv.gz", "21\n")
    raises_at(lambda: read_ogb(root), root / "raw" / "edge.csv.gz", "line 20", "says 21")
    gz(root / "raw" / "num-node-list.csv.gz", "10\n10\n")
    raises_at(lambda: read_ogb(root), "num-node-list.csv.gz", "line 2", "2 graphs")


def test_bad_labels(tmp_path):
    rng = np.random.default_rng(7)
    src, dst = random_edges(rng, 6, 10)
    f = "node-label.csv.gz"
    root = ogb_dir(tmp_path, "ogbn_arxiv", src, dst, 6, label_text="1\n2\n40\n3\n0\n0\n")
    raises_at(lambda: read_ogb(root), f, "line 3", "out of range: ogbn-arxiv has 40 classes")
    root = ogb_dir(tmp_path, "u1", src, dst, 6, label_text="1\n2\n2.5\n3\n0\n0\n")
    raises_at(lambda: read_ogb(root), f, "line 3", "2.5 is not a non-negative integer")
    root = ogb_dir(tmp_path, "u2", src, dst, 6, label_text="1\n2\nx\n3\n0\n0\n")
    raises_at(lambda: read_ogb(root), f, "line 3", "column 1: 'x' is not a number")
    root = ogb_dir(tmp_path, "u3", src, dst, 6, label_text="1,0\n0,1\n1,1\n0,2\n0,0\n1,0\n")
    raises_at(lambda: read_ogb(root), f, "line 4", "column 2: label 2 is not 0 or 1")
    root = ogb_dir(tmp_path, "u4", src, dst, 6, label_text="1,0\n0,1\n1\n0,1\n0,0\n1,0\n")
    raises_at(lambda: read_ogb(root), f, "line 3", "expected 2 comma-separated values")
    root = ogb_dir(tmp_path, "ogbn_proteins", src, dst, 6, labels=np.zeros((6, 3), int))
    raises_at(lambda: read_ogb(root), f, "line 1", "3 label columns, but ogbn-proteins has 112")


def test_bad_features_and_edges(tmp_path):
    rng = np.random.default_rng(8)
    src, dst = random_edges(rng, 6, 10)
    x = np.ones((6, 3), np.float32)
    x[4, 1] = np.nan
    root = ogb_dir(tmp_path, "a", src, dst, 6, x=x)
    raises_at(lambda: read_ogb(root), "node-feat.csv.gz", "line 5", "column 2 is nan")
    raw = root / "raw"
    gz(raw / "node-feat.csv.gz", "1,2,3\n" * 3 + "1,2\n" + "1,2,3\n" * 2)
    raises_at(lambda: read_ogb(root), "node-feat.csv.gz", "line 4", "expected 3 .* found 2")
    gz(raw / "node-feat.csv.gz", "1,2,3\n" * 5 + "1,2,abc\n")
    raises_at(lambda: read_ogb(root), "node-feat.csv.gz", "line 6", "column 3: 'abc'")
    gz(raw / "node-feat.csv.gz", rows(np.ones((6, 3))))
    gz(raw / "edge.csv.gz", "0,1\n" * 9 + "0,6\n")
    raises_at(lambda: read_ogb(root), raw / "edge.csv.gz", "line 10", ">= num_nodes = 6")
    data = gzip.compress(b"".join(b"%d,%d\n" % (i % 6, (i + 1) % 6) for i in range(20000)))
    (raw / "edge.csv.gz").write_bytes(data[: len(data) // 2])
    gz(raw / "num-edge-list.csv.gz", "20000\n")
    raises_at(lambda: read_ogb(root), raw / "edge.csv.gz", "byte offset", "truncated gzip")


def test_bad_splits_and_binary_form(tmp_path):
    rng = np.random.default_rng(9)
    src, dst = random_edges(rng, 6, 10)
    split = {"train": [0, 1], "valid": [2, 9], "test": [4]}
    root = ogb_dir(tmp_path, "a", src, dst, 6, split=split)
    f = root / "split" / "time" / "valid.csv.gz"
    raises_at(lambda: read_ogb(root), f, "line 2", ">= num_nodes = 6")
    (root / "split" / "other").mkdir()
    raises_at(lambda: read_ogb(root), root / "split", "2 split folders", "split=")
    root = ogb_dir(tmp_path, "b", np.array([0, 7]), np.array([1, 2]), 6, binary=True)
    raises_at(lambda: read_ogb(root), "data.npz", "key 'edge_index'", r"\[0, 1\] = 7 is outside")


def test_a_spec_chooses_the_split_and_options(tmp_path):
    """DIR:split=NAME picks one of several split folders on the command line."""
    import shutil

    from mgg.errors import InputError

    rng = np.random.default_rng(4)
    src, dst = random_edges(rng, 8, 12)
    root = ogb_dir(tmp_path, "two", src, dst, 8, labels=np.arange(8) % 2,
                   split={"train": [0, 1], "valid": [2], "test": [3]})  # fmt: skip
    other = root / "split" / "other"
    shutil.copytree(root / "split" / "time", other)
    gz(other / "train.csv.gz", "5\n6\n7\n")
    raises_at(lambda: resolve(str(root)), root / "split", "2 split folders", ":split=NAME")
    ds = resolve(f"{root}:split=other,undirected=1")
    assert np.flatnonzero(ds.train_mask).tolist() == [5, 6, 7]
    assert find_asymmetry(ds.graph) is None
    assert np.flatnonzero(resolve(f"{root}:split=time").train_mask).tolist() == [0, 1]
    for bad, why in [("split=nope", "no split 'nope'"), ("color=1", "bad option 'color=1'"),
                     ("undirected=yes", "undirected takes one of 0, 1")]:  # fmt: skip
        with pytest.raises((GraphError, InputError), match=why):
            resolve(f"{root}:{bad}")


def test_heterogeneous_directories_are_refused(tmp_path):
    raw = tmp_path / "mag_like" / "raw"
    gz(raw / "num-node-dict.csv.gz", "author,paper\n3,4\n")
    gz(raw / "triplet-type-list.csv.gz", "author,writes,paper\n")
    assert is_ogb_dir(raw.parent)
    raises_at(lambda: read_ogb(raw.parent), raw.parent, "heterogeneous", "homogeneous graphs only")
    src, dst = np.array([0]), np.array([1])
    root = ogb_dir(tmp_path, "ogbn_mag", src, dst, 2)  # homogeneous files, but mag's name
    raises_at(lambda: resolve(str(root)), root, "ogbn-mag is a heterogeneous", "ogbn-arxiv")


# ---- the CSV parser --------------------------------------------------------------------------
def test_csv_parser_reads_numbers_as_float_does(tmp_path):
    toks = ["1", "-2.5", "+3e2", ".5", "1.", "1E-3", " 7 ", "nan", "-inf", "Infinity", "0.1"]
    gz(tmp_path / "a.gz", ",".join(toks) + "\r\n" + ",".join(toks[::-1]) + "\n")
    got = read_csv_rows(tmp_path / "a.gz", 2, dtype=np.float64)
    want = np.array([[float(t) for t in toks], [float(t) for t in toks[::-1]]])
    np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((500, 7)) * 10.0 ** rng.integers(-30, 30, (500, 7))).astype(np.float32)
    (tmp_path / "b.csv").write_text(rows(x))  # plain text, float32 written as its double
    np.testing.assert_array_equal(read_csv_rows(tmp_path / "b.csv", 500), x)
    (tmp_path / "c.csv").write_text("1,,2\n")
    assert np.isnan(read_csv_rows(tmp_path / "c.csv", 1, allow_empty=True)[0, 1])
    for bad in ("1,,2\n", "1,.,2\n", "1,2e,3\n", "1,2 3,4\n", "1,-,2\n", "1,nap,2\n"):
        (tmp_path / "d.csv").write_text(bad)
        with pytest.raises(GraphError, match="line 1: column 2: .* is not a number"):
            read_csv_rows(tmp_path / "d.csv", 1)


# ---- multi-label: ROC-AUC and training --------------------------------------------------------
def pairwise_auc(y, s):
    """O(P·N) AUC of one task: P(score of a positive > a negative) + half the ties."""
    p, q = s[y == 1], s[y == 0]
    return ((p[:, None] > q[None, :]).sum() + 0.5 * (p[:, None] == q[None, :]).sum()) / (
        p.size * q.size
    )


def test_rocauc_matches_the_pairwise_count():
    rng = np.random.default_rng(11)
    y = rng.integers(0, 2, (60, 5))
    s = rng.integers(0, 6, (60, 5)).astype(np.float32)  # many ties
    y[:, 3] = 1  # no negatives: the task is skipped, as OGB does
    want = np.mean([pairwise_auc(y[:, j], s[:, j]) for j in (0, 1, 2, 4)])
    assert rocauc(y, s) == pytest.approx(want, abs=1e-12)
    assert rocauc(y[:, 3:4], s[:, 3:4]) != rocauc(y[:, 3:4], s[:, 3:4])  # NaN: no task
    assert rocauc(np.array([0, 1, 1]), np.array([0.1, 0.9, 0.5])) == 1.0


def test_multilabel_training_runs_the_bce_path(tmp_path):
    rng = np.random.default_rng(12)
    n, t = 120, 4
    src, dst = random_edges(rng, n, 600)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = (x[:, :t] + 0.3 * rng.standard_normal((n, t)) > 0).astype(int)  # learnable
    split = random_split(n, rng)
    ds = read_ogb(ogb_dir(tmp_path, "ml", src, dst, n, x=x, labels=y, split=split))
    dg, data = prepare(ds, None, "sage")
    model = mt.build_model("sage", data.num_features, data.num_classes, seed=0)
    assert data.num_classes == t
    tr = Trainer(dg, data, model, torch.optim.Adam(model.parameters(), lr=0.01), eval_every=0)
    seen = []
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    orig = bce

    def spy(*a, **k):
        seen.append(a[1].shape)
        return orig(*a, **k)

    torch.nn.functional.binary_cross_entropy_with_logits = spy
    try:
        losses = [h["loss"] for h in tr.fit(30)]
    finally:
        torch.nn.functional.binary_cross_entropy_with_logits = orig
    assert seen and seen[0] == (int(ds.train_mask.sum()), t)
    assert losses[-1] < 0.8 * losses[0]
    s = tr.summary()
    assert s["metric"] == "rocauc" and 0.5 < s["val_acc"] <= 1.0
    logits = model(data.x, dg).detach().numpy()
    yt, st = y[ds.test_mask], logits[ds.test_mask]
    tasks = [j for j in range(t) if 0 < yt[:, j].sum() < len(yt)]  # OGB skips one-class tasks
    want = np.mean([pairwise_auc(yt[:, j], st[:, j]) for j in tasks])
    assert s["test_acc"] == pytest.approx(want, abs=1e-9)
