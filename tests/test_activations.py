"""Large dense input features read a chunk at a time in training (ChunkedRows: no
dropped-out copy of every row), the same numbers, and mgg.memory's estimate without the
copy."""

import numpy as np
import pytest
import torch

import mgg.torch.models as models
from mgg.distgraph import DistGraph
from mgg.footprint import job_estimate
from mgg.graph.facts import facts
from mgg.graph.generators import planted_partition
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.torch import MODELS, ChunkedRows, build_model, dropout, linear
from mgg.torch.chunks import INPUT_CHUNKS
from mgg.train import Trainer

from conftest import random_graph

N, D = 300, 24  # the GEMM test's rows


def _trained(name, monkeypatch, chunk_above, *, hidden=None, recompute=False, dtype="float32"):
    """3 epochs' losses and weights of a registered model on a planted graph with 48 dense
    features, reading its input in chunks when their bytes reach ``chunk_above``; and
    the ChunkedRows the model made."""
    made = []

    class Spy(ChunkedRows):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr("mgg.torch.chunks.CHUNKED_INPUT_ABOVE", chunk_above)
    monkeypatch.setattr(models, "STREAM_MIN_ROWS", 64)  # 2,000 rows: chunks of 250
    monkeypatch.setattr(models, "ChunkedRows", Spy)
    ds = planted_partition(2000, 4, num_features=48, seed=2)
    dg, data = prepare(ds, None, name, dtype=dtype)
    spec = MODELS[name]
    net = build_model(
        name, data.num_features, data.num_classes, hidden=hidden, seed=1, recompute=recompute
    )
    t = Trainer(dg, data, net, build_optimizer("adam", net, spec.lr, spec.weight_decay),
                eval_every=0)  # fmt: skip
    t.fit(3)
    weights = torch.cat([p.detach().flatten() for p in net.parameters()])
    return np.array([h["loss"] for h in t.history]), weights, made


@pytest.mark.parametrize(
    "name,hidden,recompute",
    [
        ("gcn", None, False),
        ("sage", None, False),
        ("gin", 32, False),
        ("gat", None, False),
        ("gcn", 48, True),
    ],  # fmt: skip  (the last: equal widths, chunked while recomputing)
)
def test_models_read_large_inputs_in_chunks_and_train_alike(monkeypatch, name, hidden, recompute):
    held, w_held, none = _trained(name, monkeypatch, 2**62, hidden=hidden, recompute=recompute)
    chunked, w_chunked, made = _trained(name, monkeypatch, 0, hidden=hidden, recompute=recompute)
    assert not none and made and made[0].chunk == 2000 // INPUT_CHUNKS
    tol = 1e-5 if recompute else 2e-6  # recomputing: aggregated after the GEMM, not before
    assert np.allclose(chunked, held, rtol=tol), (chunked, held)
    assert torch.allclose(w_chunked, w_held, rtol=tol, atol=tol)


def test_equal_widths_read_whole_inputs_unless_recomputing(monkeypatch):
    """GCN 48 -> 48 aggregates before its GEMM, so its backward needs no aggregation:
    chunks would add one; recomputing, the held input is worth it."""
    assert not _trained("gcn", monkeypatch, 0, hidden=48)[2]
    assert _trained("gcn", monkeypatch, 0, hidden=48, recompute=True)[2]


def test_chunked_input_takes_the_first_layers_gemm_and_its_gradient(rng):
    g = DistGraph.build(random_graph(rng, N, 3 * N), None)
    x = torch.from_numpy(rng.standard_normal((N, D)).astype(np.float32))
    w = torch.randn(5, D, requires_grad=True)
    g.begin_step(2)
    y = linear(dropout(ChunkedRows(x, g, 37), g, 0.5), w)
    y.backward(torch.ones_like(y))
    w_chunked, w.grad = w.grad, None
    g.begin_step(2)
    xd = dropout(x, g, 0.5)
    assert torch.allclose(y, xd @ w.detach().T, rtol=1e-6, atol=1e-6)
    assert torch.allclose(w_chunked, torch.ones(N, 5).T @ xd, rtol=1e-5, atol=1e-5)


def test_the_estimate_holds_no_dropped_copy_of_chunked_inputs(monkeypatch):
    n, f = 600_000, 128  # float32 features: 293 MiB, above CHUNKED_INPUT_ABOVE
    d = facts(n, 6 * n, features=f, classes=8)

    def acts(hidden, recompute=False, above=256 << 20):
        monkeypatch.setattr("mgg.torch.chunks.CHUNKED_INPUT_ABOVE", above)
        est = job_estimate(d, 1, "train", model=MODELS["gcn"], hidden=hidden, device=True,
                           recompute=recompute)  # fmt: skip
        return est["activations"]

    copy = 4 * n * (f - f // INPUT_CHUNKS)  # the dropped-out input, less one chunk of it
    assert acts(64, above=2**62) - acts(64) == copy  # narrower: chunked
    assert acts(128) == acts(128, above=2**62)  # equal widths: held whole
    assert acts(128, True, above=2**62) - acts(128, True) == copy
    assert acts(64, above=4 * n * f + 1) == acts(64, above=2**62)  # below the threshold
