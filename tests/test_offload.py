"""Activations in host memory (mgg.torch.offload, ``mgg train --offload``, and where the
device plan needs it after streaming the features): the same numbers, each saved tensor
moved once, and the plan that chooses it (on CPUs the device is simulated; the GPU stage
'stream' measures it)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import mgg.torch.chunks
from mgg.footprint import estimate, job_estimate, plan
from mgg.graph.generators import planted_partition
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.memory import budget_for
from mgg.prepare import prepare
from mgg.torch import MODELS, build_model
from mgg.torch.interop import copy_thread
from mgg.torch.offload import offloaded
from mgg.train import Trainer

from conftest import gpu, mpi_runs, run_mgg

CPU = SimpleNamespace(backend=SimpleNamespace(gpu=False))  # what offloaded reads of a graph


def _trained(name, monkeypatch, offload, *, recompute=False, dtype="float32", n=2000, **kw):
    """3 epochs' losses and weights, and what the last forward offloaded; ``kw``: the
    Trainer's output_rows, or prepare's stream_rows."""
    monkeypatch.setattr(mgg.torch.chunks, "OFFLOAD_MIN_BYTES", 1024)
    ds = planted_partition(n, 4, num_features=48, seed=2)
    dg, data = prepare(ds, None, name, dtype=dtype, stream_rows=kw.pop("stream_rows", None))
    spec = MODELS[name]
    net = build_model(
        name, data.num_features, data.num_classes, seed=1, offload=offload, recompute=recompute
    )
    t = Trainer(dg, data, net, build_optimizer("adam", net, spec.lr, spec.weight_decay),
                eval_every=0, **kw)  # fmt: skip
    t.fit(3)
    weights = torch.cat([p.detach().flatten() for p in net.parameters()])
    return np.array([h["loss"] for h in t.history]), weights, net.offloaded


@pytest.mark.parametrize(
    "name,recompute,dtype",
    [
        ("gcn", False, "float32"),
        ("sage", False, "float32"),
        ("gin", False, "float32"),
        ("gat", False, "float32"),
        ("gcn", True, "float32"),
        ("gat", True, "float32"),
        ("sage", False, "bfloat16"),
    ],
)
def test_models_train_bit_for_bit_alike_with_activations_on_the_host(
    monkeypatch, name, recompute, dtype
):
    losses, weights, none = _trained(name, monkeypatch, False, recompute=recompute, dtype=dtype)
    off, w_off, moved = _trained(name, monkeypatch, True, recompute=recompute, dtype=dtype)
    assert none is None and moved.tensors > 0 and moved.bytes > 0
    assert np.array_equal(losses, off) and torch.equal(weights, w_off)


@pytest.mark.parametrize("kw", [{"output_rows": "labeled"}, {"stream_rows": 300}])
def test_offload_trains_alike_with_labeled_output_rows_and_streamed_features(monkeypatch, kw):
    losses, weights, _ = _trained("sage", monkeypatch, False, **dict(kw))
    off, w_off, moved = _trained("sage", monkeypatch, True, **dict(kw))
    assert moved.tensors > 0
    assert np.array_equal(losses, off) and torch.equal(weights, w_off)


def test_a_gcn_step_moves_what_its_backward_reads_once(monkeypatch):
    """GCN, 48 features -> 16 -> 4 classes, both layers multiplying first: the backward
    reads the dropped-out input [n, 48] (the first GEMM's), ReLU's output [n, 16] and the
    dropped-out hidden rows [n, 16] (the second GEMM's); the input features themselves and
    the weights stay."""
    n = 2000
    *_, moved = _trained("gcn", monkeypatch, True, n=n)
    assert moved.tensors == 3 and moved.bytes == 4 * n * (48 + 16 + 16)


def test_a_tensor_saved_twice_is_moved_once_and_a_reused_block_is_not_mistaken(monkeypatch):
    monkeypatch.setattr(mgg.torch.chunks, "OFFLOAD_MIN_BYTES", 1024)
    u = torch.randn(256, 64, requires_grad=True)
    block = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    first_values = torch.from_numpy(block.copy())
    with offloaded(CPU) as moved:
        h = u * 3.0
        twice = h * h  # mul saves both inputs: h, twice
        a = torch.from_numpy(block)
        first = a * u  # saves a
        del a
        copy_thread().submit(lambda: None).result()  # a's copy is done
        block *= -2.0  # the block now holds other rows, as a freed one reused does
        b = torch.from_numpy(block)  # another tensor: same block, shape, strides, version
        second = b * u  # saves b
    assert moved.tensors == 3 and moved.bytes == 3 * u.numel() * 4
    (twice.sum() + first.sum() + second.sum()).backward()
    want = 18.0 * u.detach() + first_values - 2.0 * first_values
    assert torch.allclose(u.grad, want, rtol=1e-6, atol=1e-6)


def test_each_saved_tensor_comes_back_once_the_next_one_fetched_ahead(monkeypatch):
    """A chain of ops, each saving its input: the backward unpacks them last first; each
    is copied back once, all but the first fetched ahead while the op after it ran."""
    import mgg.torch.offload as off

    monkeypatch.setattr(mgg.torch.chunks, "OFFLOAD_MIN_BYTES", 1024)
    copies, unpacked = [], []
    to_device, unpack = off._Mover.to_device, off._unpack
    monkeypatch.setattr(
        off._Mover, "to_device", lambda m, h, a: copies.append(h) or to_device(m, h, a)
    )
    monkeypatch.setattr(off, "_unpack", lambda s: unpacked.append(s.ahead is not None) or unpack(s))
    u = torch.randn(256, 64, requires_grad=True)
    with offloaded(CPU) as moved:
        y = u * 1.0
        for _ in range(5):
            y = y.sin()  # saves its input
    assert moved.tensors == 5
    y.sum().backward()
    x = u.detach()
    want = torch.ones_like(x)
    for k in range(5, 0, -1):  # d/dx sin^5(x) by the chain rule, outermost first
        inner = x
        for _ in range(k - 1):
            inner = inner.sin()
        want = want * inner.cos()
    assert torch.allclose(u.grad, want, rtol=1e-5, atol=1e-6)
    assert len(copies) == 5 and unpacked == [False, True, True, True, True]


def test_small_and_integer_tensors_and_kept_ones_stay(monkeypatch):
    monkeypatch.setattr(mgg.torch.chunks, "OFFLOAD_MIN_BYTES", 4096)
    w = torch.randn(64, 64, requires_grad=True)  # 16 KiB: kept, a parameter
    x = torch.randn(64, 64)
    small = torch.randn(8, requires_grad=True)
    idx = torch.randint(0, 64, (4096,))
    with offloaded(CPU, keep=[w]) as moved:
        y = (x @ w).sum() + (small * small).sum()  # mm saves x (kept: no grad? moved) and w
        z = w[idx].sum()  # index saves idx: integers stay
    (y + z).backward()
    # x is the only float tensor of 4 KiB or more that is neither kept nor a parameter
    assert moved.tensors == 1 and moved.bytes == x.numel() * 4
    assert torch.allclose(w.grad, x.T @ torch.ones(64, 64) + torch.bincount(idx, minlength=64)
                          .float()[:, None].expand(64, 64))  # fmt: skip


# ---- the plan ----------------------------------------------------------------------------
WIDE_SPEC = "planted:nodes=3000,classes=4,features=1500"


def _device(budget, d, **kw):
    out = plan(d, 1, "train", budget={"host": 2**62, "device": budget}, device=True,
               model=MODELS["gcn"], **kw)  # fmt: skip
    return out, out["per_rank"][0]


def test_the_plan_keeps_activations_on_the_host_only_where_streaming_is_not_enough():
    d = resolve(WIDE_SPEC)
    est = lambda **kw: job_estimate(d, 1, "train", model=MODELS["gcn"], rows=3000,  # noqa: E731
                                    device=True, **kw)  # fmt: skip
    streamed, offloaded_too = est(stream=1024), est(stream=1024, offload=True)
    assert offloaded_too["total"] < streamed["total"]
    assert offloaded_too["activations"] < streamed["activations"]
    moved = streamed["activations"] - offloaded_too["activations"]
    assert 0 < offloaded_too["offloaded"] <= moved  # the device saves what the host takes
    out, rank = _device(budget_for(streamed["total"]), d)  # streaming is enough: no offload
    assert out["fits"] and "offload" not in rank["device"]
    assert "offloaded" not in rank["parts"]
    out, rank = _device(budget_for(streamed["total"]) - 1, d)  # then activations go too
    assert out["fits"] and rank["device"]["offload"]
    assert rank["parts"]["offloaded"] > 0 and rank["device"]["total_bytes"] < streamed["total"]
    assert "offloaded" not in rank["device"]["parts"]  # the host's, not the device's
    out, rank = _device(2**62, d, offload=True)  # asked for: offloaded though it fits
    assert out["fits"] and rank["device"]["offload"] and "stream_rows" not in rank["device"]


def test_the_output_layer_and_the_hidden_working_set_take_turns_on_the_device():
    """With --offload the device holds the hidden layers' working tensors, or the output
    layer's with a saved one fetched ahead, never both: a wider output costs nothing
    until its tensors outgrow the working set; held, every class costs (one labeled row,
    so that the loss's rows weigh nothing)."""

    def activations(classes, offload, output_rows="all"):
        return estimate(100_000, 1_000_000, features=128, classes=classes, hidden=128,
                        labeled=1, device=True, offload=offload,
                        output_rows=output_rows)["activations"]  # fmt: skip

    assert activations(64, False) > activations(16, False)
    assert activations(64, True) - activations(16, True) == 4 * 2.5 * 48  # the loss's row
    assert activations(1024, True) > activations(64, True) + 100_000 * 4 * 512
    # the output layer for the labeled rows: its [rows, 128] tensors within the turns too
    assert activations(16, True, "labeled") == activations(16, True)


def test_mgg_plan_says_where_the_activations_go(capsys):
    from mgg.cli import main

    args = ["plan", WIDE_SPEC, "--backend", "cuda", "--device-memory", "64G"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "fits"
    assert main([*args, "--offload"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "fits, the activations kept in host memory"
    assert any(line.split()[:1] == ["offloaded"] for line in out)  # the host's part
    assert main([*args, "--offload", "--json"]) == 0
    rank = json.loads(capsys.readouterr().out)["per_rank"][0]
    assert rank["device"]["offload"] and rank["parts"]["offloaded"] > 0


# ---- the command -------------------------------------------------------------------------
TRAIN = ["train", "--dataset", WIDE_SPEC, "--epochs", "3", "--json"]


def test_train_offloads_when_asked_and_under_a_simulated_device_budget(capsys, monkeypatch):
    from mgg.cli import main

    monkeypatch.setattr(mgg.torch.chunks, "OFFLOAD_MIN_BYTES", 4096)
    assert main(TRAIN) == 0
    held = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert held["offload"] is False and held["offloaded_bytes"] == [None]
    assert main([*TRAIN, "--offload"]) == 0
    asked = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert asked["offload"] is True and asked["offloaded_bytes"][0] > 0
    assert np.array_equal(asked["losses"], held["losses"])
    est = job_estimate(resolve(WIDE_SPEC), 1, "train", model=MODELS["gcn"], rows=3000,
                       device=True, stream=1024)  # fmt: skip
    assert main([*TRAIN, "--device-memory", str(budget_for(est["total"]) - 1)]) == 0
    auto = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert auto["offload"] is True and auto["planned_device_bytes"] < est["total"]
    assert np.allclose(auto["losses"], held["losses"], rtol=2e-6)


def test_offload_refuses_a_captured_step(capsys):
    from mgg.cli import main

    assert main([*TRAIN, "--offload", "--cuda-graph"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cuda-graph: --offload" in err[0]


def test_host_memory_running_out_ends_the_job_with_one_line(capsys, monkeypatch):
    import mmap

    from mgg.cli import main

    def full(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mgg.torch.chunks, "OFFLOAD_MIN_BYTES", 4096)
    monkeypatch.setattr(mmap, "mmap", full)
    assert main([*TRAIN, "--offload"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--offload: host memory ran out for a saved tensor of" in err[0]
    assert "Cannot allocate memory" in err[0]


TWO = "planted:nodes=6000,classes=4,features=64"


@pytest.mark.mpi
def test_ranks_offload_their_own_activations_and_train_as_one_process():
    args = [*TRAIN, "--dataset", TWO, "--model", "sage"]
    setup = "import mgg.torch.chunks; mgg.torch.chunks.OFFLOAD_MIN_BYTES = 4096"
    runs = mpi_runs(2, args, [[], ["--offload"]], setup)
    assert len(runs) == 2 and runs[0]["np"] == 2
    assert runs[1]["offload"] and all(b > 0 for b in runs[1]["offloaded_bytes"])
    assert np.array_equal(runs[0]["losses"], runs[1]["losses"])


# ---- on a GPU (the GPU stage 'tests' runs these) ---------------------------------------------
@gpu
@pytest.mark.gpu
def test_a_gpu_job_with_activations_on_the_host_trains_alike_and_peaks_lower():
    """Each run in its own process: the pools' peaks are the process's. Four layers: two
    peak in the first layer's backward pass either way (bench/offload.py)."""
    args = ["train", "--dataset", "planted:nodes=40000,classes=4,features=256", "--hidden",
            "256", "--layers", "4", "--epochs", "3", "--json", "--backend", "cuda"]  # fmt: skip
    runs = []
    for extra in ([], ["--offload"]):
        out = run_mgg(*args, *extra, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.splitlines()[-1]))
    held, off = runs
    assert off["offload"] and off["offloaded_bytes"][0] > 0
    assert np.allclose(off["losses"], held["losses"], rtol=1e-4)
    assert off["peak_device_bytes"][0] < held["peak_device_bytes"][0]
