"""bfloat16 rows (mgg.precision, mgg.kernels.bf16): rounding, every op and design against
a float64 oracle of the rounded inputs, the torch front-end, training, shards,
checkpoints, the memory estimate and bad input."""

import json

import numpy as np
import pytest
import torch

import mgg.torch as mt
from mgg.errors import DivergedError, InputError
from mgg.footprint import estimate
from mgg.graph.core import Graph
from mgg.graph.dataset import Dataset
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.kernels import aggregate, cpu_nn, gather_halo, reference
from mgg.kernels.bf16 import store_rows
from mgg.partition import build_plan
from mgg.precision import BF16, BF16_MAX, as_rows, bits
from mgg.prepare import prepare
from mgg.train import Trainer

from conftest import last_json, mpirun, random_graph, shared_dataset

ROUNDING = 2.0**-8  # one bf16 rounding: at most half of 2^-7, relative to the value's binade


def rounded(a) -> np.ndarray:
    """a rounded to bf16 (ml_dtypes: nearest even), back in float64: what the kernels read."""
    return np.asarray(a, np.float32).astype(BF16).astype(np.float64)


def assert_one_rounding(got, want, scale):
    """got (bf16) is want (float64) rounded once, up to float32 sums of ``scale``
    (per row: the sum of the magnitudes summed)."""
    got = np.asarray(got).astype(np.float64)
    bound = ROUNDING * np.abs(want) + 1e-6 * (scale + 1.0)
    np.testing.assert_array_less(np.abs(got - want), bound + 1e-30)


# ---- rounding ----------------------------------------------------------------------------


def test_rounding_is_nearest_even_on_every_float32_bit_pattern_class(rng):
    words = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [
            0x3F808000,  # 1 + 2^-8: a tie, rounds down to even (1.0)
            0x3F818000,  # 1 + 3*2^-8: a tie, rounds up to even
            0x3FFFFFFF,  # just under 2: rounds up across the power of two, to 2.0
            0x7F7FFFFF,  # float32 max: past bf16's largest, becomes inf
            0xFF7FFFFF,  # and -inf
            0x7F800000,  # inf stays inf
            0x7FC00001,  # a NaN whose payload would round to inf: stays NaN
            0x7F800001,  # a signalling NaN: stays NaN
            0x00000001,  # the smallest subnormal: rounds to 0
            0x80000000,  # -0 stays -0
        ],
        np.uint32,
    )
    x = np.concatenate([words, special]).view(np.float32).reshape(-1, 10)
    out = np.empty(x.shape, BF16)
    store_rows(x, out)
    got = bits(out).ravel()
    nan = np.isnan(x.ravel())
    with np.errstate(invalid="ignore"):
        want = bits(x.astype(BF16)).ravel()
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert np.isnan(out.astype(np.float32).ravel()[nan]).all()
    tail = out.ravel()[-10:].astype(np.float32)
    assert tail[0] == 1.0 and tail[1] == np.float32(1 + 4 * 2**-8) and tail[2] == 2.0
    assert tail[3] == np.inf and tail[4] == -np.inf and tail[5] == np.inf
    assert np.isnan(tail[6]) and np.isnan(tail[7]) and tail[8] == 0
    assert np.signbit(tail[9])


# ---- every op, weighted and multi-head, at P = 1..4 ---------------------------------------


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin", "w1", "wh"])
def test_every_op_is_the_float64_sum_of_the_rounded_rows_rounded_once(rng, nprocs, op):
    g = random_graph(rng, 60, 700, hub_src=True, hub_dst=True, isolated=5)
    if op in ("w1", "wh"):  # one weight per (dst, src): no duplicate edges
        dst = np.repeat(np.arange(60), np.diff(g.indptr))
        keys = np.unique(dst * 60 + g.indices)
        g = Graph.from_edges(keys % 60, keys // 60, 60)
    if op == "gcn":
        g = g.gcn_norm()
    heads, d = (3, 12) if op == "wh" else (1, 13)
    x = (rng.standard_normal((g.num_nodes, d)) * 50).astype(BF16)  # bf16 inputs: exact
    w = None
    if op in ("w1", "wh"):
        w = rng.standard_normal((g.num_edges, heads)).astype(np.float32)
    xd = x.astype(np.float64)
    got = np.empty(x.shape, BF16)
    for r in range(nprocs):
        p = build_plan(g, nprocs, 4, rank=r)
        weights = None
        if w is not None:  # the plan's edges, by their global (dst, src)
            want_w = _edge_weights(g, w)
            keys = p.edge_keys()
            weights = tuple(want_w[k][:, 0] if op == "w1" else want_w[k] for k in keys)
        out = aggregate(
            p,
            x[p.lb : p.ub],
            "sum" if w is not None else op,
            halo=gather_halo(p, x),
            eps=0.3,
            weights=weights,
        )
        assert out.dtype == BF16
        got[p.lb : p.ub] = out
    if w is None:  # scipy's float64 oracle, of the rows and of their magnitudes
        want = reference.aggregate(g, xd, op, eps=0.3)
        scale = reference.aggregate(g, np.abs(xd), op, eps=0.3)
    else:
        ww = w[:, :1] if op == "w1" else w
        c = d // ww.shape[1]
        dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
        per_edge = xd[g.indices] * np.repeat(ww.astype(np.float64), c, axis=1)
        want, scale = np.zeros_like(xd), np.zeros_like(xd)
        np.add.at(want, dst, per_edge)
        np.add.at(scale, dst, np.abs(per_edge))
    assert_one_rounding(got, want, scale)


def _edge_weights(g: Graph, w):
    """w [E, H] over g's CSR edges (no duplicates) as a lookup by (dst, src) key."""
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    keys = dst * g.num_nodes + g.indices
    order = np.argsort(keys)

    class Lookup:
        def __getitem__(self, k):
            return w[order[np.searchsorted(keys[order], k)]]

    return Lookup()


def test_dropout_keeps_the_float32_entries_and_rounds_their_product_once(rng):
    x32 = rng.standard_normal((40, 33)).astype(np.float32)
    xb = x32.astype(BF16)
    key, threshold, scale = np.uint64(77), np.uint32(2**31), 1 / 0.7
    got = cpu_nn.dropout_dense(xb, key, 5, threshold, scale)
    ref = cpu_nn.dropout_dense(xb.astype(np.float32), key, 5, threshold, np.float32(scale))
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.astype(np.float32) != 0, ref != 0)
    np.testing.assert_array_equal(bits(got), bits(ref.astype(BF16)))


ROW_OPS_PEAK = """
import sys, threading, time
import torch
from mgg.torch import aggregation as ops
ops.ROW_BLOCK_BYTES = 16 << 20
t = torch.randn(1 << 20, 128).to(torch.bfloat16)
inv = torch.rand(1 << 20, 1)
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
def peak(f):
    top, on = [rss()], [True]
    def sample():
        while on[0]:
            top[0] = max(top[0], rss())
            time.sleep(0.0002)
    s = threading.Thread(target=sample)
    start = rss()
    s.start()
    out = f()
    on[0] = False
    s.join()
    return max(top[0], rss()) - start, out
print(peak(lambda: ops.scaled_rows(t, inv))[0], peak(lambda: ops.row_dot(t, t))[0])
"""


def test_mean_and_gin_gradients_round_once_a_block_of_rows_at_a_time(rng, monkeypatch):
    """SAGE's mean backward scales bf16 rows by float32 1/deg, GIN's eps gradient sums
    x * dout in float32: by blocks of rows, the very bits of the whole-tensor float32
    computation (each product rounded once), and, in a fresh process, with no float32 copy
    of the rows (1M x 128 bf16 rows, 256 MiB, blocks of 16 MiB: torch's CPU ops would
    promote the whole operands, 1 GiB)."""
    import subprocess
    import sys

    from mgg.torch import aggregation as ops

    t = torch.from_numpy(rng.standard_normal((1000, 24)).astype(np.float32)).bfloat16()
    u = torch.from_numpy(rng.standard_normal((1000, 24)).astype(np.float32)).bfloat16()
    inv = torch.from_numpy(rng.random((1000, 1)).astype(np.float32))
    whole = (t * inv).to(torch.bfloat16), (t.float() * u.float()).sum().reshape(1)
    monkeypatch.setattr(ops, "ROW_BLOCK_BYTES", 4 * 24 * 64)  # 64 rows a block
    assert len(list(ops._row_blocks(t))) == 16
    got = ops.scaled_rows(t, inv), ops.row_dot(t, u)
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], whole[0])
    assert got[1].dtype == torch.float32 and torch.allclose(got[1], whole[1], rtol=1e-6)
    r = subprocess.run([sys.executable, "-c", ROW_OPS_PEAK], capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    scaled, dot = map(int, r.stdout.split())
    rows = (1 << 20) * 128 * 2
    assert scaled < rows + (80 << 20) and dot < 80 << 20, (scaled, dot)


def test_sddmm_of_bf16_rows_is_a_float32_dot_of_the_rounded_rows(rng):
    g = random_graph(rng, 30, 200)
    a, b = (rng.standard_normal((30, 8)).astype(BF16) for _ in range(2))
    out = cpu_nn.sddmm(g.indptr.astype(np.int64), g.indices, a, b, 2)
    assert out.dtype == np.float32
    dst = np.repeat(np.arange(30), np.diff(g.indptr))
    ad, bd = a.astype(np.float64), b.astype(np.float64)
    want = (ad[dst] * bd[g.indices]).reshape(-1, 2, 4).sum(-1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


# ---- the torch front-end and training -----------------------------------------------------


def test_prepare_takes_torch_bfloat16_and_layers_keep_bf16_rows():
    ds = resolve("planted:nodes=200,classes=3,features=8")
    dg, data = prepare(ds, None, "gat", dtype=torch.bfloat16)
    assert dg.knobs.dtype == "bfloat16" and data.x.dtype == torch.bfloat16
    conv = mt.GATConv(8, 4, heads=2)
    y = conv(data.x, dg)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert conv.lin.weight.grad.dtype == torch.float32  # the master weights
    assert torch.isfinite(conv.att_src.grad).all()


def test_gcn2_in_bf16_is_float32s_up_to_rounding():
    """GCN2Conv's fused op (mgg.torch.aggregation.gcn2) in bf16: rows and output bf16, the
    weight's gradient float32, both within bf16's rounding of the float32 run's."""
    ds = resolve("planted:nodes=200,classes=3,features=8")
    got = {}
    for dtype in (torch.float32, torch.bfloat16):
        dg, data = prepare(ds, None, "gcn", dtype=dtype)
        torch.manual_seed(0)
        conv = mt.GCN2Conv(8, alpha=0.2, theta=0.5, layer=1)
        x = data.x.detach().requires_grad_()
        y = conv(x, data.x, dg)
        assert y.dtype == dtype
        y.float().square().sum().backward()
        assert conv.weight1.grad.dtype == torch.float32
        got[dtype] = y.float().detach(), conv.weight1.grad, x.grad.float()
    for f32, b16 in zip(got[torch.float32], got[torch.bfloat16], strict=True):
        assert float(f32.abs().max()) > 0.1
        torch.testing.assert_close(b16, f32, rtol=0.03, atol=0.03 * float(f32.abs().max()))


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_bf16_training_follows_the_float32_loss_curve_on_cora(model):
    """50 epochs: every bf16 loss within 1% of the float32 run's. (GIN, with sum
    aggregation and batch statistics, drifts up to 30% mid-curve and is left to the
    accuracy benchmark, bench/bf16_accuracy.py.)"""
    ds = resolve(str(shared_dataset("cora")))
    curves = {}
    for dtype in ("float32", "bfloat16"):
        dg, data = prepare(ds, None, model, seed=0, row_normalize=True, dtype=dtype)
        spec = mt.MODELS[model]
        net = mt.build_model(model, data.num_features, data.num_classes, seed=0)
        t = Trainer(dg, data, net, build_optimizer("adam", net, spec.lr, spec.weight_decay))
        t.eval_every = 0
        t.fit(50)
        curves[dtype] = np.array([h["loss"] for h in t.history])
    f32, b16 = curves["float32"], curves["bfloat16"]
    assert f32[-1] < 0.8 * f32[0]  # it learned
    np.testing.assert_array_less(np.abs(b16 - f32), 0.01 * f32)


def test_features_beyond_bf16_range_are_refused_naming_the_dataset_and_value():
    ds = resolve("planted:nodes=100,classes=2,features=4")
    x = ds.x.copy()
    x[7, 2] = 3.3e38  # finite in float32, past bf16's largest (3.39e38 rounds to inf)
    x[8, 1] = -3.399e38
    big = Dataset(ds.name, ds.graph, x, ds.y, num_classes=ds.num_classes)
    with pytest.raises(InputError, match=r"features of 'planted.*3\.399e\+38.*bfloat16"):
        prepare(big, None, "gcn", dtype="bfloat16")
    prepare(big, None, "gcn")  # float32 holds them
    assert as_rows(np.array([[BF16_MAX]], np.float32), "bfloat16", "x").dtype == BF16


def test_a_non_finite_loss_in_bf16_names_the_dtype():
    ds = resolve("planted:nodes=100,classes=2,features=4")
    dg, data = prepare(ds, None, "gcn", dtype="bfloat16")
    net = mt.build_model("gcn", data.num_features, data.num_classes, seed=0)
    t = Trainer(dg, data, net, build_optimizer("sgd", net, 1e30, 0.0), eval_every=0)
    with pytest.raises(DivergedError, match=r"\(bfloat16 rows\)"):
        t.fit(5)


def test_a_checkpoint_records_its_dtype_and_resumes_in_another_with_a_note(tmp_path):
    ds = resolve("planted:nodes=200,classes=3,features=8")

    def trainer(dtype, log=None):
        dg, data = prepare(ds, None, "gcn", dtype=dtype)
        net = mt.build_model("gcn", data.num_features, data.num_classes, seed=0)
        opt = build_optimizer("adam", net, 0.01, 0.0)
        return Trainer(dg, data, net, opt, eval_every=0, log=log)

    t = trainer("bfloat16")
    t.fit(3)
    path = t.save_checkpoint(tmp_path / "e3.pt")
    meta = json.loads(torch.load(path, weights_only=True)["meta"])
    assert meta["dtype"] == "bfloat16"
    notes = []
    back = trainer("float32", notes.append)
    back.load_checkpoint(path)
    assert any("trained with bfloat16 rows, resumed with float32" in n for n in notes)
    assert back.weights_digest() == t.weights_digest()  # float32 masters, bit for bit
    back.fit(5)
    assert back.epoch == 5


def test_the_memory_estimate_counts_two_byte_rows():
    kw = dict(features=128, classes=47, hidden=256, layers=3, labeled=0)
    f32 = estimate(2_000_000, 60_000_000, 4, sharded=True, **kw)
    b16 = estimate(2_000_000, 60_000_000, 4, sharded=True, dtype="bfloat16", **kw)
    # what the loss and evaluation take of the labeled rows is float32 in both
    more = {**kw, "labeled": 1_000_000}
    f32_l = estimate(2_000_000, 60_000_000, 4, sharded=True, **more)
    b16_l = estimate(2_000_000, 60_000_000, 4, sharded=True, dtype="bfloat16", **more)
    grown = f32_l["activations"] - f32["activations"]
    assert grown == b16_l["activations"] - b16["activations"] > 4 * 250_000 * 47
    stored = estimate(
        2_000_000, 60_000_000, 4, sharded=True, dtype="bfloat16", stored="bfloat16", **kw
    )
    assert b16["activations"] * 2 == f32["activations"]
    assert b16["windows"] * 2 == f32["windows"]
    assert b16["model"] == f32["model"]  # float32 weights and optimizer state
    assert stored["dataset"] < b16["dataset"] and stored["total"] < b16["total"] < f32["total"]


# ---- several ranks: every design and window, shards ----------------------------------------


@pytest.mark.mpi
def test_every_design_and_window_in_bf16_at_four_ranks(tmp_path):
    from test_mpi import oracle

    from mgg.graph.dataset import random_features

    spec, dim = "rmat:scale=9,ef=8,seed=5", 12
    r = mpirun(
        4, "mgg", "check", spec, "--op", "all", "--window", "all", "--repeat", "1",
        "--dim", dim, "--ps", "3", "--dtype", "bfloat16", "--outputs", tmp_path, "--json",
        timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = last_json(r.stdout)
    assert res["dtype"] == "bfloat16" and len(res["runs"]) == 8 * 4
    g = resolve(spec).graph
    x = rounded(random_features(0, 0, g.num_nodes, dim))
    for run in res["runs"]:
        got = np.load(tmp_path / f"{run['design']}-{run['op']}-{run['window']}.npy")
        want = oracle(g, x, run["op"])
        assert_one_rounding(got, want, oracle(g, np.abs(x), run["op"]))


@pytest.mark.mpi
def test_a_bf16_sharded_dataset_stores_half_the_feature_bytes_and_trains(tmp_path):
    spec = "planted:nodes=400,classes=3,features=16"
    outs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / dtype
        r = mpirun(
            1, "mgg", "partition", spec, "--np", "2", "--out", out, "--dtype", dtype, "--json"
        )
        assert r.returncode == 0, r.stderr[-2000:]
        outs[dtype] = out
    man = json.loads((outs["bfloat16"] / "manifest.json").read_text())
    assert man["feature_dtype"] == "bfloat16"
    x16 = np.load(outs["bfloat16"] / "rank-0001" / "x.npy")
    x32 = np.load(outs["float32"] / "rank-0001" / "x.npy")
    assert x16.dtype == np.uint16 and x16.nbytes * 2 == x32.nbytes
    np.testing.assert_array_equal(x16, bits(x32.astype(BF16)))
    r = mpirun(
        2, "mgg", "train", "--dataset", outs["bfloat16"], "--dtype", "bfloat16",
        "--epochs", "30", "--check-sync", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    assert res["dtype"] == "bfloat16" and res["test_acc"] > 0.6
    assert res["bytes_per_epoch"] > 0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_normalize_the_errors_suggest_works_on_features_near_float32s_largest(dtype):
    """Features near 3.4e38: mgg's errors suggest --row-normalize, whose float32 row sums
    were inf, so every feature became 0 and the run 'trained' at chance with exit 0.
    Summed in float64, each row sums to 1 and equals the unscaled data's, and it learns."""
    ds = resolve("planted:nodes=300,classes=3,features=8")
    x = np.asarray(ds.x, np.float32)
    scale = np.float32(3.4e38 / np.abs(x).max())  # past bf16's range, within float32's
    masks = dict(train_mask=ds.train_mask, val_mask=ds.val_mask, test_mask=ds.test_mask)
    big = Dataset(ds.name, ds.graph, x * scale, ds.y, num_classes=ds.num_classes, **masks)
    with np.errstate(over="ignore"):  # as float32 sums, the rows are inf
        assert np.isfinite(big.x).all() and np.isinf(np.abs(big.x).sum(axis=1)).mean() > 0.9
    if dtype == "bfloat16":  # the error that suggests the remedy
        with pytest.raises(InputError, match="--row-normalize"):
            prepare(big, None, "gcn", dtype=dtype)
    _, want = prepare(ds, None, "gcn", dtype=dtype, row_normalize=True)
    dg, data = prepare(big, None, "gcn", dtype=dtype, row_normalize=True)
    got = data.x.float().numpy()
    assert np.isfinite(got).all() and (np.abs(got).sum(axis=1) > 0).all()
    np.testing.assert_allclose(np.abs(got).sum(axis=1), 1.0, rtol=0.02)
    np.testing.assert_allclose(got, want.x.float().numpy(), rtol=0.01, atol=1e-6)
    net = mt.build_model("gcn", data.num_features, data.num_classes, seed=0)
    t = Trainer(dg, data, net, build_optimizer("adam", net, 0.01, 5e-4), eval_every=0)
    t.fit(30)
    assert t.summary()["test_acc"] > 0.6  # chance: 1/3
