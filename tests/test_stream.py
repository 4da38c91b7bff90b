"""Input features streamed from host memory (mgg.torch.HostRows) under a device budget: the
same rows, masks and gradients as features held on the device, no tensor holding every
feature row, and a memory plan that streams exactly what does not fit (a simulated device
on CPUs; the GPU stage runs it with --device-memory)."""

import json

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mgg.distgraph import DistGraph
from mgg.footprint import estimate, job_estimate, plan
from mgg.graph.facts import facts
from mgg.graph.generators import planted_partition
from mgg.job import build_optimizer
from mgg.memory import budget_for
from mgg.prepare import prepare
from mgg.torch import MODELS, HostRows, build_model, dropout, linear
from mgg.train import Trainer

from conftest import gpu, mpi_runs, random_graph

N, F = 600, 40
CHUNKS = [1, 7, 256, N, N + 5]  # one row; uneven; even-ish; whole; beyond the rows


def _rows(rng, dtype):
    x = torch.from_numpy(rng.standard_normal((N, F)).astype(np.float32)).to(dtype)
    return x, DistGraph.build(random_graph(rng, N, 3 * N), None, dtype=str(dtype)[6:])


def _dropped_twice(x, g):
    g.begin_step(3)
    return dropout(dropout(x, g, 0.5), g, 0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_streamed_rows_are_the_dropped_out_rows_bit_for_bit(rng, dtype, chunk):
    x, g = _rows(rng, dtype)
    want = _dropped_twice(x, g)
    streamed = _dropped_twice(HostRows.of(x, g, chunk), g)
    assert isinstance(streamed, HostRows) and len(streamed.drops) == 2
    eye = torch.eye(F)  # x Iᵀ is x itself: products with 1, sums with 0
    assert torch.equal(linear(streamed, eye), want)
    assert torch.equal(torch.as_tensor(streamed.to_dense()), want)
    picked = torch.arange(0, N, 13)
    assert torch.equal(torch.as_tensor(streamed[picked]), want[picked])
    assert 0.2 < float((want == 0).float().mean()) < 0.8  # the masks dropped something


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_streamed_linear_and_its_gradient_match_a_float64_oracle(rng, dtype, chunk):
    x, g = _rows(rng, dtype)
    w = torch.randn(5, F, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    xs = _dropped_twice(HostRows.of(x, g, chunk), g)
    y = linear(xs, w, b)
    assert y.dtype == dtype and y.shape == (N, 5)
    dy = torch.randn(N, 5).to(dtype)
    y.backward(dy)
    xd = _dropped_twice(x, g).double()
    wd = w.detach().to(dtype).double()  # bf16 rows multiply a bf16 copy of w
    ref = xd @ wd.T + b.detach().to(dtype).double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: y rounded to 8 bits once
    assert torch.allclose(y.double(), ref, rtol=tol, atol=tol * float(ref.abs().max()))
    # dW: each chunk's product in the rows' dtype (bf16: rounded once), the chunks summed in
    # float32; bf16's roundings of each chunk's product are the oracle's too
    size = max(1, min(chunk, N))
    dw = sum(
        (dy[i : i + size].double().T @ xd[i : i + size]).to(dtype).double()
        for i in range(0, N, size)
    )
    assert torch.allclose(w.grad.double(), dw, rtol=1e-5, atol=1e-5 * float(dw.abs().max()))
    db = dy.double().sum(0)  # the bias is added in the rows' dtype, as on the device
    assert torch.allclose(b.grad.double(), db, rtol=tol, atol=tol * float(db.abs().max()))


class _Sizes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_holds_every_feature_row(rng):
    x, g = _rows(rng, torch.float32)
    w = torch.randn(3, F, requires_grad=True)
    xs = HostRows.of(x, g, 7)
    with _Sizes() as sizes:
        y = linear(dropout(xs, g, 0.5), w)
        y.backward(torch.ones_like(y))
    assert w.grad is not None
    # the output [N, 3] is the largest; a chunk is 7 x F, every row N x F
    assert sizes.largest == N * 3, sizes.largest
    with _Sizes() as whole:  # the check itself: the rows on the device, as unstreamed
        linear(dropout(x, g, 0.5), w).backward(torch.ones(N, 3))
    assert whole.largest >= N * F


@pytest.mark.parametrize("name", list(MODELS))
def test_models_train_alike_with_streamed_features(name):
    def losses(stream):
        ds = planted_partition(500, 4, num_features=48, seed=2)
        dg, data = prepare(ds, None, name, stream_rows=stream)
        spec = MODELS[name]
        net = build_model(name, data.num_features, data.num_classes, seed=1)
        t = Trainer(dg, data, net, build_optimizer("adam", net, spec.lr, spec.weight_decay),
                    eval_every=0)  # fmt: skip
        t.fit(3)
        return [h["loss"] for h in t.history], data

    kept, held = losses(None)
    streamed, data = losses(64)
    assert isinstance(data.x, HostRows) and not isinstance(held.x, HostRows)
    assert np.allclose(kept, streamed, rtol=2e-6), (kept, streamed)


# ---- the plan --------------------------------------------------------------------------
WIDE = facts(4000, 40_000, features=2000, classes=4)


def _device(budget, d=WIDE, **kw):
    out = plan(d, 1, "train", budget={"host": 2**62, "device": budget}, device=True,
               model=MODELS["gcn"], **kw)  # fmt: skip
    return out, out["per_rank"][0]["device"]


def _total(stream, d=WIDE, **kw):
    return job_estimate(d, 1, "train", model=MODELS["gcn"], rows=4000, device=True,
                        stream=stream, **kw)["total"]  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_plan_streams_the_largest_chunk_that_fits(dtype):
    held = _total(0, dtype=dtype)
    smallest = _total(1024, dtype=dtype)
    assert smallest < held  # features kept on the host free more than a chunk takes
    for room in (held - 1, (held + smallest) // 2, smallest):  # a budget's usable part
        out, dev = _device(budget_for(room), dtype=dtype)
        k = dev["stream_rows"]
        assert out["fits"] and dev["total_bytes"] <= room
        assert dev["total_bytes"] == _total(k, dtype=dtype)
        assert k == 4000 or _total(k + 1, dtype=dtype) > room  # the most rows that fit
        assert dev["parts"]["stream"] > 0 and dev["parts"]["dataset"] < held // 1000
    out, dev = _device(budget_for(held), dtype=dtype)  # fits as it is: nothing streams
    assert out["fits"] and "stream_rows" not in dev and "stream" not in dev["parts"]
    out, dev = _device(budget_for(smallest) - 1, dtype=dtype)  # a chunk under 1,024: offload
    assert out["fits"] and dev["offload"] and dev["total_bytes"] < smallest
    floor = _total(1024, dtype=dtype, offload=True)
    out, dev = _device(budget_for(floor) - 1, dtype=dtype)  # still under 1,024 rows: refused
    assert not out["fits"] and "stream_rows" not in dev and out["fixes"]


def test_only_dense_training_features_stream():
    sparse = facts(4000, 40_000, features=2000, classes=4, feature_nnz=400_000)
    budget = budget_for(_total(0, d=sparse)) - 1
    out, dev = _device(budget, d=sparse)
    assert "stream_rows" not in dev and dev["offload"]  # its activations leave instead
    check = plan(WIDE, 1, "check", budget={"host": 2**62, "device": 1}, device=True)
    assert "stream_rows" not in check["per_rank"][0]["device"]
    host = estimate(4000, 40_000, features=2000, classes=4, stream=64)  # the host's: unchanged
    assert host == estimate(4000, 40_000, features=2000, classes=4)


# ---- the command ---------------------------------------------------------------------------
WIDE_SPEC = "planted:nodes=3000,classes=4,features=1500"
TRAIN = ["train", "--dataset", WIDE_SPEC, "--epochs", "3", "--json"]


def test_train_streams_under_a_simulated_device_budget(capsys):
    from mgg.cli import main

    assert main(TRAIN) == 0
    held = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert held["stream_rows"] is None and held["planned_device_bytes"] is None
    room = _held_total(WIDE_SPEC) - 4 * 2**20  # usable: 4 MiB short of the features held
    assert main([*TRAIN, "--device-memory", str(budget_for(room))]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert 1024 <= out["stream_rows"] < 3000
    assert out["planned_device_bytes"] <= room
    assert "streamed from host memory" in out["notes"]
    assert np.allclose(out["losses"], held["losses"], rtol=2e-6)
    assert out["test_acc"] == pytest.approx(held["test_acc"], abs=1e-9)
    assert main([*TRAIN, "--device-memory", "100M"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mgg train: error: --device-memory 100M: ")
    assert "per device" in err[0]


def _held_total(spec, ranks=1, model="gcn"):
    """The device plan's peak of the largest rank with the features on the device."""
    from mgg.graph.specs import resolve

    out = plan(resolve(spec), ranks, "train", budget={"host": 2**62, "device": 2**62},
               device=True, model=MODELS[model])  # fmt: skip
    return max(r["device"]["total_bytes"] for r in out["per_rank"])


TWO = "planted:nodes=6000,classes=4,features=1500"  # 3,000 rows a rank


@pytest.mark.mpi
def test_ranks_stream_their_own_rows_with_the_masks_of_one_process():
    budget = budget_for(_held_total(TWO, 2, "sage") - 4 * 2**20)
    args = [*TRAIN, "--dataset", TWO, "--model", "sage", "--dropout", "0.5"]
    runs = mpi_runs(2, args, [[], ["--device-memory", budget]])
    assert len(runs) == 2 and runs[0]["np"] == 2
    assert runs[0]["stream_rows"] is None and runs[1]["stream_rows"] < 3000
    assert np.allclose(runs[0]["losses"], runs[1]["losses"], rtol=2e-6)


# ---- on a GPU (the GPU stage 'tests' runs these) ---------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_streamed_rows_on_a_gpu_are_the_held_rows_and_gradients(rng, dtype):
    """Pinned host rows through a side stream: the same dropped-out rows bit for bit as
    rows held on the device (the copies ordered before their use, the buffers not reused
    before their GEMM ended), weight gradients within float32 rounding of float64."""
    x = torch.from_numpy(rng.standard_normal((N, F)).astype(np.float32)).to(dtype)
    g = DistGraph.build(random_graph(rng, N, 3 * N), None, backend="cuda", dtype=str(dtype)[6:])
    xs = HostRows.of(x, g, 7)
    assert xs.rows.is_pinned() and xs.device.type == "cuda"
    want = _dropped_twice(x.cuda(), g)
    streamed = _dropped_twice(xs, g)
    assert torch.equal(linear(streamed, torch.eye(F, device="cuda")), want)
    w = torch.randn(5, F, device="cuda", requires_grad=True)
    y = linear(streamed, w)
    dy = torch.randn(N, 5, device="cuda").to(dtype)
    y.backward(dy)
    dw = dy.double().T @ want.double()
    assert torch.allclose(w.grad.double(), dw, rtol=1e-5, atol=1e-5 * float(dw.abs().max()))


@gpu
@pytest.mark.gpu
def test_a_gpu_job_streams_under_its_device_budget_and_trains_alike(capsys):
    from mgg.cli import main

    args = [*TRAIN, "--backend", "cuda"]
    assert main(args) == 0
    held = json.loads(capsys.readouterr().out.splitlines()[-1])
    room = _held_total(WIDE_SPEC) - 4 * 2**20
    assert main([*args, "--device-memory", str(budget_for(room))]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert 1024 <= out["stream_rows"] < 3000 and out["planned_device_bytes"] <= room
    assert np.allclose(out["losses"], held["losses"], rtol=1e-4)
    assert out["peak_device_bytes"][0] > 0 and held["peak_device_bytes"][0] > 0


def test_pes_sharing_a_gpu_plan_against_their_share_of_it(monkeypatch):
    """mggrun gives rank r device r % GPUs: the ranks of a node split each GPU's memory."""
    import sys
    import types

    from mgg.cli.common import device_budget

    gpus = {"count": 1}

    class Device:
        mem_info = (0, 80 * 2**30)

    cuda = types.SimpleNamespace(
        Device=Device, runtime=types.SimpleNamespace(getDeviceCount=lambda: gpus["count"])
    )
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    assert device_budget(None, "80G", 1)[0] == 80 * 2**30
    assert device_budget(None, "80G", 4) == (20 * 2**30, "the GPU's 80.0 GiB / 4 PEs sharing it")
    gpus["count"] = 2
    assert device_budget(None, "80G", 3)[0] == 40 * 2**30  # ranks 0 and 2 share GPU 0
    assert device_budget("1G", "80G", 4) == (2**30, "--device-memory 1G")  # as given
