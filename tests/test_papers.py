"""papers100m: ogbn-papers100M's shape at any scale, drawn in slices by the ranks so that
no process holds the graph, equal bit for bit to the graph one process builds."""

import json

import numba
import numpy as np
import pytest
import scipy.sparse as sp
import torch

from mgg.cli import main
from mgg.errors import InputError, ResourceError
from mgg.graph import generators, papers, sampling
from mgg.graph.core import job_graph
from mgg.graph.dataset import Dataset
from mgg.graph.papers import PAPERS100M, DrawnFeatures
from mgg.graph.specs import papers_spec, resolve
from mgg.memory import LIMIT_ENV
from mgg.partition.plan import build_plan
from mgg.precision import BF16
from mgg.prepare import prepare

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


# ---- the fast path: the same graph and rows as the plain definitions ---------------------
@numba.njit(cache=True)
def _guided(cum, guide, scale, ps):
    out = np.empty(ps.size, np.int64)
    for q in range(ps.size):
        b = sampling._bucket(ps[q], scale, guide.size - 1)
        out[q] = sampling._walk(cum, guide[b], guide[b + 1], ps[q])
    return out


@pytest.mark.parametrize("per_node", [1, 2, 5])
def test_the_guide_finds_what_searchsorted_finds(per_node):
    rng = np.random.default_rng(per_node)
    w = np.concatenate([rng.pareto(1.5, 3000) + 1, np.full(50, 1.0), [4e6]])
    cum = np.cumsum(rng.permutation(w))
    guide = np.empty(per_node * cum.size + 1, np.int32)
    scale = (guide.size - 1) / cum[-1]
    sampling.guide_table(cum, scale, guide)
    ps = np.concatenate([rng.random(20_000) * cum[-1], cum, np.nextafter(cum, 0), [0.0]])
    want = np.searchsorted(cum, ps, side="right")
    assert np.array_equal(_guided(cum, guide, scale, ps), want)


def test_the_sampler_and_draws_are_planted_partitions_with_plain_searches():
    gen = papers_spec("papers100m:scale=0.0003")
    s = gen.sampler()
    y = gen.labels(np.arange(gen.num_nodes))
    assert np.array_equal(s.order, np.argsort(y, kind="stable"))
    assert np.array_equal(s.starts[1:], np.cumsum(np.bincount(y, minlength=gen.classes)))
    src, dst = gen.draws(1000, 60_000, s)
    want = np.empty_like(src), np.empty_like(dst)
    t_in = generators.threshold_u32(gen.p_in)
    key = gen.key(papers._SALT_EDGE)
    generators._planted_fill(*want, key, t_in, s.cum, s.order, y, s.starts, s.mass_lo, s.mass, 1000)
    assert np.array_equal(src, want[0]) and np.array_equal(dst, want[1])


def test_the_rounds_merged_are_the_graph_of_all_draws(ds):
    draws = ds.meta["params"]["draws"]
    gen = papers_spec(SPEC)
    assert draws > gen.num_draws  # more than one round
    src, dst = (a.astype(np.int64) for a in gen.draws(0, draws))
    keep = src != dst
    s, d = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    n = gen.num_nodes
    want = sp.csr_matrix((np.ones(s.size), (d, s)), shape=(n, n))
    want.sum_duplicates()
    want.sort_indices()
    assert np.array_equal(ds.graph.indptr, want.indptr)
    assert np.array_equal(ds.graph.indices, want.indices)


def test_features_are_drawn_in_the_rows_dtype(ds):
    gen = papers_spec(SPEC)
    ids = np.array([5, 0, 17_000, 3, 5])
    x32 = gen.x(ids)
    assert np.array_equal(gen.x(ids, dtype=BF16).view(np.uint16), x32.astype(BF16).view(np.uint16))
    assert isinstance(ds.x, DrawnFeatures) and ds.x.shape == (ds.graph.num_nodes, 128)
    assert np.array_equal(ds.x[ids], x32) and np.array_equal(ds.x[3:6], gen.x([3, 4, 5]))
    rows = ds.rows(10, 20, dtype=BF16)
    assert rows.x.dtype == BF16 and np.array_equal(rows.x, gen.x(np.arange(10, 20), dtype=BF16))
    assert np.array_equal(rows.y, ds.y[10:20]) and rows.ids is None
    plain = Dataset.rows(ds, 10, 20)  # Dataset's own, x indexed
    assert np.array_equal(plain.x, ds.rows(10, 20).x)
    for a, b in zip(plain.masks, rows.masks, strict=True):
        assert np.array_equal(a, b)


def test_its_drawn_features_are_written_whole(ds, tmp_path):
    out = tmp_path / "p.npz"
    assert main(["convert", SPEC, str(out)]) == 0
    with np.load(out) as z:
        assert np.array_equal(z["x"], np.asarray(ds.x)) and z["x"].shape == (
            ds.graph.num_nodes,
            128,
        )
        assert np.array_equal(z["indices"], ds.graph.indices) and np.array_equal(z["y"], ds.y)


def test_a_bf16_job_draws_bf16_rows_and_the_plan_of_its_graph(ds):
    dg, data = prepare(ds, None, "gcn", dtype="bfloat16")
    want = build_plan(job_graph(ds.graph, "gcn_norm"), 1, rank=0)
    assert dg.plan.digest() == want.digest()
    x = papers_spec(SPEC).x(np.arange(ds.graph.num_nodes), dtype=BF16)
    assert data.x.dtype == torch.bfloat16
    assert np.array_equal(data.x.view(torch.int16).numpy().view(np.uint16), x.view(np.uint16))
