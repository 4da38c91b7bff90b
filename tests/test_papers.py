"""papers100m: ogbn-papers100M's shape at any scale, drawn in slices by the ranks so that
no process holds the graph, equal bit for bit to the graph one process builds."""

import json

import numpy as np
import pytest

from mgg.cli import main
from mgg.errors import InputError, ResourceError
from mgg.graph.papers import PAPERS100M
from mgg.graph.specs import papers_spec, resolve
from mgg.memory import LIMIT_ENV

from conftest import last_json, mpirun

SPEC = "papers100m:scale=0.0004"


@pytest.fixture(scope="module")
def ds():
    return resolve(SPEC)


def test_counts_are_ogbs_scaled_and_the_graph_is_simple_and_skewed(ds):
    s = 0.0004
    g = ds.graph
    assert g.num_nodes == round(PAPERS100M["nodes"] * s)
    wanted = 2 * round(PAPERS100M["edges"] * s)
    assert wanted <= g.num_edges <= 1.05 * wanted, (g.num_edges, wanted)
    assert ds.num_classes == 172 and ds.x.shape == (g.num_nodes, 128) and ds.x.dtype == np.float32
    split = [int(m.sum()) for m in (ds.train_mask, ds.val_mask, ds.test_mask)]
    assert split == [round(c * s) for c in PAPERS100M["split"]]
    assert not (ds.train_mask & ds.val_mask).any() and not (ds.val_mask & ds.test_mask).any()
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    assert not (rows == g.indices).any()  # no self loops
    keys = rows.astype(np.int64) * g.num_nodes + g.indices
    assert np.unique(keys).size == keys.size  # no duplicates
    back = np.sort(g.indices.astype(np.int64) * g.num_nodes + rows)
    assert np.array_equal(np.sort(keys), back)  # undirected: every reverse entry
    deg = np.diff(g.indptr)
    assert deg.max() > 30 * deg.mean() and np.median(deg) < deg.mean()  # a heavy tail
    assert (ds.y[rows] == ds.y[g.indices]).mean() > 0.5  # the planted signal: homophily


def test_any_rows_and_any_draws_are_the_wholes(ds):
    gen = papers_spec(SPEC)
    ids = np.random.default_rng(3).choice(ds.graph.num_nodes, 500, replace=False)
    rows = gen.rows(0, ids.size, ids)
    assert np.array_equal(rows.x, ds.x[ids]) and np.array_equal(rows.y, ds.y[ids])
    for got, want in zip(rows.masks, (ds.train_mask, ds.val_mask, ds.test_mask), strict=True):
        assert np.array_equal(got, want[ids])
    assert np.array_equal(rows.ids, ids)
    whole = gen.draws(0, 10_000)
    parts = [gen.draws(lo, hi) for lo, hi in ((0, 3333), (3333, 7000), (7000, 10_000))]
    for k in range(2):
        assert np.array_equal(whole[k], np.concatenate([p[k] for p in parts]))


def test_the_signal_is_learnable(capsys):
    args = ["train", "--dataset", SPEC, "--epochs", "25", "--hidden", "64", "--eval-every", "0"]
    assert main([*args, "--json"]) == 0
    out = last_json(capsys.readouterr().out)
    assert out["test_acc"] > 50 / 172, out["test_acc"]  # chance is 1/172; 0.53 measured


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("papers100m:scale=0", InputError, "the scale must be a finite number > 0"),
        ("papers100m:scale=0.001,sed=1", InputError, "unknown key.*sed.*valid keys: scale"),
        ("papers100m:scale=0.001,p_in=2", InputError, "p_in must lie in"),
        ("papers100m:scale=30", InputError, "below 2\\^31"),
    ],
)
def test_bad_specs_are_named(spec, error, match):
    with pytest.raises(error, match=match):
        resolve(spec)


def test_a_graph_that_does_not_fit_is_refused_before_it_is_drawn(monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, "2G")
    with pytest.raises(ResourceError, match=r"papers100m:scale=1,seed=0: .*111,059,956 nodes"):
        resolve("papers100m")
    gen = papers_spec("papers100m:scale=0.5")
    with pytest.raises(ResourceError, match=r"per rank.*more ranks than 8"):
        gen.require_slice(8)


@pytest.mark.mpi
def test_ranks_draw_the_shards_one_process_writes(tmp_path, capsys):
    one = ["partition", SPEC, "--np", "3", "--out", str(tmp_path / "a"), "--json"]
    assert main(one) == 0
    a = last_json(capsys.readouterr().out)
    r = mpirun(3, "mgg", "partition", SPEC, "--out", tmp_path / "b", "--distributed", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    b = last_json(r.stdout)
    assert b["digests"] == a["digests"] and b["num_edges"] == a["num_edges"]
    ma, mb = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in "ab")
    assert ma["files"] == mb["files"]  # node data too: features, labels, masks
    labeled = sum(round(c * 0.0004) for c in PAPERS100M["split"])  # what memory plans count
    assert ma["labeled"] == mb["labeled"] == labeled
    big = mpirun(
        2, "mgg", "partition", "papers100m:scale=0.3", "--distributed", env={LIMIT_ENV: "1G"}
    )
    assert big.returncode == 2, big.stderr[-2000:]
    lines = big.stderr.strip().splitlines()
    assert any("papers100m:scale=0.3" in ln and "more ranks than 2" in ln for ln in lines), lines
