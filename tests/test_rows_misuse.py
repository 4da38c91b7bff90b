"""Rows misused, and what mgg does: every reduction over the nodes covers every rank or is
refused naming the op (mgg.torch.reductions's tables, which docs/pyg.md's list is written
from), an op with a dim in no table caught by a walk of torch, DistributedModel refusing
what it cannot wrap, and mgg.pyg.load refusing bad arguments where they enter. One
process where the answer does not depend on P; one 2-rank mpiexec run against the
whole tensor in one process."""

import inspect
import json
import math
import pickle
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mgg.torch as mt
from mgg.distgraph import DistGraph
from mgg.errors import InputError
from mgg.torch import reductions
from mgg.torch.rows import plain

from conftest import mpirun, random_graph

N = 40

# ---- the list: docs and torch -------------------------------------------------------------------


def test_the_docs_list_is_what_the_code_does():
    text = reductions.DOC.read_text()
    assert reductions.documented(text) == reductions.doc(), (
        "docs/pyg.md's reductions list differs from mgg/torch/reductions.py's tables: "
        "run python -m mgg.torch.reductions --write"
    )


def test_every_torch_op_that_takes_a_dim_is_in_a_table():
    """torch's overridable functions with a dim argument: each covered, refused or on the
    rank, so a new torch reduction is refused or listed, never silently local."""
    known = set(reductions._BY_FUNCTION) | reductions.ON_THE_RANK_FUNCTIONS
    missing = []
    for f, sig in torch.overrides.get_testing_overrides().items():
        try:
            params = inspect.signature(sig).parameters
        except (TypeError, ValueError):
            continue
        if getattr(f, "__name__", "").startswith("_"):
            continue  # torch's private ops, some listed only once a module registers them
        if {"dim", "dims", "axis", "dim0", "start_dim"} & set(params) and f not in known:
            missing.append(getattr(f, "__qualname__", str(f)))
    assert not missing, f"in no table of mgg/torch/reductions.py: {sorted(missing)}"
    for name in (*reductions.REFUSED, *reductions.ON_THE_RANK):
        assert reductions.functions(name), f"{name} names no torch function"


# ---- one process: what is covered equals torch, what is refused raises ---------------------------


@pytest.fixture(scope="module")
def dg():
    return DistGraph.build(random_graph(np.random.default_rng(0), N, 160), None, dtype=np.float64)


def whole():
    x = torch.tensor(np.random.default_rng(3).normal(size=(N, 4)))
    x[5, 2] = math.nan
    return x


# name: f(x) on Rows and on the whole tensor alike; x has a NaN at [5, 2] (z: none)
COVERED = {
    "sum": lambda x, z: z.sum(),
    "sum0": lambda x, z: torch.sum(z, 0, keepdim=True),
    "nansum": lambda x, z: torch.nansum(x),
    "nansum0": lambda x, z: x.nansum(0),
    "mean01": lambda x, z: z.mean((0, 1)),
    "nanmean": lambda x, z: torch.nanmean(x),
    "nanmean0": lambda x, z: x.nanmean(dim=0),
    "count_nonzero0": lambda x, z: torch.count_nonzero(z > 0.3, 0),
    "any0": lambda x, z: (z > 2).any(0),
    "all": lambda x, z: (z > -9).all(),
    "linalg.norm": lambda x, z: torch.linalg.norm(z),
    "linalg.vector_norm3_0": lambda x, z: torch.linalg.vector_norm(z, 3, dim=0),
    "linalg.vector_norm_inf": lambda x, z: torch.linalg.vector_norm(z, math.inf),
    "linalg.vector_norm0": lambda x, z: torch.linalg.vector_norm(z, 0),
    "linalg.matrix_norm": lambda x, z: torch.linalg.matrix_norm(z),
    "norm": lambda x, z: z.norm(),
    "norm1_0": lambda x, z: torch.norm(z, 1, 0, keepdim=True),
    "dist": lambda x, z: torch.dist(z, z * 0.5),
    "logsumexp0": lambda x, z: torch.logsumexp(z, 0),
    "logsumexp": lambda x, z: z.logsumexp((0, 1), keepdim=True),
    "special.logsumexp": lambda x, z: torch.special.logsumexp(z, 0),
    "max": lambda x, z: z.max(),
    "amin0": lambda x, z: z.amin(0),
    "aminmax0": lambda x, z: torch.aminmax(z, dim=0),
    "prod": lambda x, z: (1 + 0.1 * z[:, 0]).prod(),
    "F.smooth_l1_loss": lambda x, z: F.smooth_l1_loss(z, z * 0.5),
    "F.huber_loss": lambda x, z: F.huber_loss(z, z * 0.3, reduction="sum"),
    "F.kl_div": lambda x, z: F.kl_div(z.log_softmax(-1), z.softmax(-1), reduction="batchmean"),
    "F.cosine_embedding_loss": lambda x, z: F.cosine_embedding_loss(
        z, z.flip(1), (z[:, 0] > 0).double() * 2 - 1
    ),
    "F.multilabel_soft_margin_loss": lambda x, z: F.multilabel_soft_margin_loss(
        z, (z > 0).double()
    ),
    "F.triplet_margin_loss": lambda x, z: F.triplet_margin_loss(z, z * 0.5, z.flip(1)),
}
DIFFERENTIABLE = [
    *("sum", "sum0", "nansum", "nansum0", "mean01", "nanmean", "nanmean0", "linalg.norm"),
    *("linalg.vector_norm3_0", "linalg.matrix_norm", "norm", "norm1_0", "dist"),
    *("logsumexp0", "logsumexp", "special.logsumexp", "F.smooth_l1_loss", "F.huber_loss"),
    *("F.kl_div", "F.cosine_embedding_loss", "F.multilabel_soft_margin_loss"),
    "F.triplet_margin_loss",
]

# name in the error: f(x) on Rows, which must raise
REFUSED = {
    "cumsum": lambda x: x.cumsum(0),
    "cummax": lambda x: torch.cummax(x, dim=0),
    "cumprod": lambda x: x.cumprod(-2),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, 0),
    "bincount": lambda x: (x[:, 0].nan_to_num().abs() * 3).long().bincount(),
    "histc": lambda x: x.histc(),
    "sort": lambda x: x[:, 0].sort(),
    "argsort": lambda x: x.argsort(dim=0),
    "unique": lambda x: x.unique(dim=1),
    "quantile": lambda x: x.quantile(0.5, dim=0),
    "median": lambda x: x.median(),
    "mode": lambda x: x[:, 0].mode(),
    "kthvalue": lambda x: x.kthvalue(2, 0),
    "topk": lambda x: x.topk(3, dim=0),
    "std": lambda x: x.std(0),
    "var_mean": lambda x: torch.var_mean(x),
    "argmax": lambda x: x.argmax(),
    "max(dim=0)": lambda x: x.max(0),
    "F.softmax": lambda x: F.softmax(x, dim=0),
    "log_softmax": lambda x: x.log_softmax(0),
    "F.normalize": lambda x: F.normalize(x, dim=0),
    "diff": lambda x: x.diff(dim=0),
    "roll": lambda x: x.roll(1, 0),
    "flip": lambda x: x.flip(0),
    "cov": lambda x: x.cov(),
    "fft.fft": lambda x: torch.fft.fft(x, dim=0),
    "linalg.norm(ord='nuc')": lambda x: torch.linalg.norm(x, "nuc"),
    "F.batch_norm": lambda x: F.batch_norm(x, None, None, training=True),
    "F.ctc_loss": lambda x: F.ctc_loss(x, x, x, x),
    "amax over every rank's rows has no gradient": lambda x: x.requires_grad_().amax(),
    "size_average": lambda x: F.smooth_l1_loss(x, x, size_average=True),
}
OWN_MESSAGE = {  # refused with a message of their own
    "max(dim=0)",
    "linalg.norm(ord='nuc')",
    "amax over every rank's rows has no gradient",
    "size_average",
}

# row-wise: stays on the rank as Rows, equal to torch on the rank's rows
ROW_WISE = {
    "sum(-1)": lambda x: x.sum(-1),
    "softmax(-1)": lambda x: x.softmax(-1),
    "argmax(-1)": lambda x: x.argmax(-1),
    "norm(dim=1)": lambda x: torch.linalg.vector_norm(x, dim=1),
    "logsumexp(1)": lambda x: x.logsumexp(1),
    "max(x, y)": lambda x: torch.max(x, x * 2),
    "max(1)": lambda x: x.max(1).values,
    "cumsum(1)": lambda x: x.cumsum(1),
    "sort(-1)": lambda x: x.sort(-1).values,
    "index_select(0)": lambda x: x.index_select(0, torch.tensor([1, 0])),
    "cat(0)": lambda x: torch.cat([x, x], dim=0),
    "F.normalize": lambda x: F.normalize(x),
}


def _close(got, want):
    if isinstance(want, tuple):
        for a, b in zip(got, want, strict=True):
            _close(a, b)
        return
    assert not isinstance(got, mt.Rows), "a value over every rank is no rank's rows"
    torch.testing.assert_close(plain(got), want, equal_nan=True, check_dtype=False)


@pytest.mark.parametrize("name", COVERED)
def test_a_covered_reduction_equals_torch_on_the_whole_tensor(dg, name):
    x = whole()
    got = COVERED[name](mt.Rows.of(x, dg), mt.Rows.of(x.nan_to_num(), dg))
    _close(got, COVERED[name](x, x.nan_to_num()))
    if name in DIFFERENTIABLE:
        lin = torch.nn.Linear(4, 4, dtype=torch.float64)
        grads = []
        for rows in (True, False):
            lin.zero_grad()
            y = lin(mt.Rows.of(x, dg) if rows else x)
            out = COVERED[name](y, torch.tanh(y))
            plain(out).sum().backward()
            grads.append(lin.weight.grad.clone())
        torch.testing.assert_close(grads[0], grads[1], equal_nan=True)


@pytest.mark.parametrize("name", REFUSED)
def test_a_reduction_mgg_does_not_cover_is_refused_naming_it(dg, name):
    x = mt.Rows.of(whole(), dg)
    with pytest.raises(InputError) as e:
        REFUSED[name](x)
    assert name.split("(")[0] in str(e.value)
    if name not in OWN_MESSAGE:
        assert "would cover one rank's rows only" in str(e.value)


@pytest.mark.parametrize("name", ROW_WISE)
def test_row_wise_ops_stay_on_the_rank(dg, name):
    x = whole().nan_to_num()
    got = ROW_WISE[name](mt.Rows.of(x, dg))
    assert isinstance(got, mt.Rows)
    torch.testing.assert_close(plain(got), ROW_WISE[name](x))


def test_an_unlisted_op_given_dim_over_the_nodes_is_refused(dg, monkeypatch):
    """A torch op in no table (a new reduction, say): refused when dim= covers dim 0."""
    monkeypatch.setattr(reductions, "_BY_FUNCTION", {})  # as if torch added cumsum today
    x = mt.Rows.of(whole(), dg)
    with pytest.raises(InputError, match=r"cumsum\(dim=0\) of Rows is not known to mgg"):
        x.cumsum(dim=0)
    assert isinstance(x.cumsum(dim=1), mt.Rows)


# ---- DistributedModel ------------------------------------------------------------------------


def test_distributed_model_refuses_what_it_cannot_wrap(dg):
    def fn(x):
        return x

    lin = torch.nn.Linear(4, 2)
    with pytest.raises(TypeError, match="DistributedModel: model must be a torch.nn.Module"):
        mt.DistributedModel(fn, dg)
    with pytest.raises(InputError, match="model must be a torch.nn.Module, got function"):
        mt.DistributedModel(fn)
    with pytest.raises(InputError, match="DistributedModel: the graph argument g must be"):
        mt.DistributedModel(lin)
    with pytest.raises(InputError, match="g must be the job's DistGraph, got str"):
        mt.DistributedModel(lin, "g")
    inner = mt.DistributedModel(lin, dg)
    with pytest.raises(InputError, match="DistributedModel: model is a DistributedModel already"):
        mt.DistributedModel(inner, dg)
    seq = torch.nn.Sequential(torch.nn.ReLU(), inner)
    with pytest.raises(InputError, match="model.1 is a DistributedModel already"):
        mt.DistributedModel(seq, dg)


# ---- mgg.pyg.load --------------------------------------------------------------------------------


def test_load_refuses_bad_arguments_naming_them(tmp_path):
    pytest.importorskip("torch_geometric")
    import mgg.pyg
    import mgg.pyg.transforms as T

    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    spec = "planted:nodes=30,classes=3"
    cases = [  # (call, error type, what the message says)
        (lambda: mgg.pyg.load(tmp_path / "nope.npz"), InputError, "no such file or folder"),
        (lambda: mgg.pyg.load(str(tmp_path)), InputError, "is a folder, not a graph file"),
        (lambda: mgg.pyg.load(tmp_path / "notes.txt"), InputError, "notes.txt: line 1"),
        (lambda: mgg.pyg.load(tmp_path / "bad.npz"), InputError, "bad.npz"),
        (lambda: mgg.pyg.load(None), TypeError, "source must be a path"),
        (lambda: mgg.pyg.load(np.zeros(3)), TypeError, "source must be .* got ndarray"),
        (lambda: mgg.pyg.load(""), InputError, "source is empty"),
        (lambda: mgg.pyg.load("corax"), InputError, "unknown graph 'corax'"),
        (lambda: mgg.pyg.load(spec, kind="gcnn"), InputError, "kind must be one of"),
        (lambda: mgg.pyg.load(spec, kind=None), InputError, "kind must be one of .* None"),
        (lambda: mgg.pyg.load(spec, row_normalize="yes"), TypeError, "row_normalize must be"),
        (lambda: mgg.pyg.load(spec, seed=1.5), InputError, "seed must be an integer"),
        (lambda: mgg.pyg.load(spec, seed=-1), InputError, "seed must be an integer"),
        (lambda: mgg.pyg.load(spec, comm="world"), TypeError, "comm must be the job's"),
        (lambda: mgg.pyg.load(spec, transform="norm"), TypeError, "transform: 'norm' is not"),
        (lambda: mgg.pyg.load(spec, transform=T.NormalizeFeatures), TypeError, "an instance"),
        (
            lambda: mgg.pyg.load(spec, transform=T.GCNNorm(), kind="self_loops"),
            InputError,
            "both set the graph's kind",
        ),
        (lambda: mgg.pyg.load(spec, ps=0), InputError, "ps: must be in"),
    ]
    for call, kind, message in cases:
        with pytest.raises(kind, match=message):
            call()
    for call, _, _ in cases:  # every one mgg's own error
        with pytest.raises(InputError):
            call()
    assert mgg.pyg.load(spec, seed=3).num_nodes == 30


# ---- two ranks: the same reductions over every rank ------------------------------------------

JOB = """
import json, math, pickle, sys
import torch
import mgg.pyg
import mgg.torch as mt
from mgg.errors import InputError
from mgg.pyg.inside import inside
from mgg.torch.rows import plain

sys.path.insert(0, sys.argv[2])
from test_rows_misuse import COVERED, DIFFERENTIABLE, REFUSED

with open(sys.argv[1], "rb") as f:
    data = mgg.pyg.load(pickle.load(f), split="nodes")
g, x = data.g, data.x
x = torch.where(x > 1.5, float("nan"), x)  # Rows: NaNs on some rank
res = {"rank": g.rank, "n": int(plain(x).shape[0]), "values": {}, "grads": {}, "refused": {}}
for name, f in COVERED.items():
    out = f(x, x.nan_to_num())
    out = out if isinstance(out, tuple) else (out,)
    res["values"][name] = [plain(o).double().tolist() for o in out]
for name in DIFFERENTIABLE:
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 5)
    y = lin(x.nan_to_num())
    plain(COVERED[name](y, torch.tanh(y))).sum().backward()
    res["grads"][name] = lin.weight.grad.tolist()
for name, f in REFUSED.items():
    try:
        f(x.detach().clone())
        res["refused"][name] = None
    except InputError as e:
        res["refused"][name] = str(e)
lin = torch.nn.Linear(5, 2)
try:
    mt.DistributedModel(mt.DistributedModel(lin, g), g)
except InputError as e:
    res["nested"] = str(e)
with inside(g):  # inside a PyG layer: the whole-tensor forms over every rank too
    z = plain(x.nan_to_num())
    res["inside"] = [float(torch.linalg.vector_norm(z)), float(torch.nansum(z)), float(z.amax())]
every = g.comm.gather(res)  # every rank joins; rank 0 prints
print(json.dumps(every) if g.rank == 0 else "", flush=True)
"""


def dataset():
    from mgg.graph.dataset import Dataset

    rng = np.random.default_rng(4)
    x = rng.normal(size=(N, 5)).astype(np.float32)
    y = rng.integers(0, 3, N)
    train = np.zeros(N, bool)
    train[:10] = True
    return Dataset("toy", random_graph(rng, N, 160), x, y, train, None, ~train, num_classes=3)


@pytest.mark.mpi
def test_two_ranks_cover_every_rank_or_refuse(tmp_path):
    from conftest import ROOT

    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    (tmp_path / "toy.pkl").write_bytes(pickle.dumps(dataset()))
    r = mpirun(2, "python", job, tmp_path / "toy.pkl", ROOT / "tests", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [o["rank"] for o in got] == [0, 1] and min(o["n"] for o in got) > 0
    x = torch.tensor(dataset().x)  # the oracle: the whole tensor in one process
    x = torch.where(x > 1.5, float("nan"), x)
    for name, f in COVERED.items():
        want = f(x, x.nan_to_num())
        want = want if isinstance(want, tuple) else (want,)
        for o in got:
            for a, b in zip(o["values"][name], want, strict=True):
                np.testing.assert_allclose(a, b.double().numpy(), rtol=1e-5, err_msg=name)
    for name in DIFFERENTIABLE:
        torch.manual_seed(0)
        lin = torch.nn.Linear(5, 5)
        y = lin(x.nan_to_num())
        COVERED[name](y, torch.tanh(y)).sum().backward()
        for o in got:
            np.testing.assert_allclose(o["grads"][name], lin.weight.grad, atol=1e-5, err_msg=name)
    for o in got:
        for name, message in o["refused"].items():
            assert message is not None and name.split("(")[0] in message, (name, message)
        assert "model is a DistributedModel already" in o["nested"]
        z = x.nan_to_num()
        want = [float(torch.linalg.vector_norm(z)), float(torch.nansum(z)), float(z.amax())]
        np.testing.assert_allclose(o["inside"], want, rtol=1e-5)
