"""bench/gpu/e2e_vs_pyg.py without a GPU: PyG's step as an expert sets it up (the training
rows an index tensor, the same loss as a boolean mask's; fused Adam), its capture in
PyTorch's whole-network recipe (against a stand-in of torch.cuda). Its CPU dry run, end
to end, is the GPU window's (tests/test_gpu_window.py)."""

import copy
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, random_graph

pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import e2e_vs_pyg as e2e  # noqa: E402
from pyg_models import PATHS  # noqa: E402

from mgg.graph.dataset import Dataset  # noqa: E402


@pytest.fixture(scope="module")
def ds():
    rng = np.random.default_rng(3)
    n = 80
    g = random_graph(rng, n, 600, hub_dst=True, isolated=2)
    x = rng.standard_normal((n, 12)).astype(np.float32)
    y = rng.integers(0, 5, n)
    train = np.zeros(n, bool)
    train[rng.choice(n, 30, replace=False)] = True  # scattered rows, not a prefix
    return Dataset("toy", g, x, y, train, ~train, np.zeros(n, bool), num_classes=5)


@pytest.mark.parametrize("name,form", [(m, f) for m in PATHS for f in PATHS[m]])
def test_pyg_step_indexes_the_training_rows_and_loses_what_a_boolean_mask_would(ds, name, form):
    """The expert's step: the training rows an int64 index tensor (no boolean mask, whose
    indexing waits for the device), fused Adam; its loss is the boolean-mask loss of the
    same weights and dropout draws, and its step moves the weights."""
    side = e2e.PygSide(name, ds, e2e.pyg_inputs(ds, "cpu"), form)
    assert side.rows.dtype == torch.int64 and side.rows.numel() == ds.train_mask.sum()
    setup = side.setup()
    assert setup["train_rows"].startswith("torch.int64 [30]")
    assert setup["adam"]["fused"] and not setup["adam"]["capturable"]
    assert all(g["fused"] for g in side.opt.param_groups)

    mask = torch.from_numpy(ds.train_mask)
    y = torch.from_numpy(ds.y)
    side.model(side.x, side.adj)  # GCN's cached normalization made before the state is kept
    state = copy.deepcopy(side.model.state_dict())
    side.model.train()
    torch.manual_seed(7)
    with torch.no_grad():
        out = side.model(side.x, side.adj)
        want = torch.nn.functional.cross_entropy(out[mask], y[mask])
        shifted = torch.nn.functional.cross_entropy(out[torch.roll(mask, 1)], y[mask])
    assert not torch.allclose(shifted, want)  # the check can fail: other rows, another loss
    side.model.load_state_dict(state)
    before = [p.detach().clone() for p in side.model.parameters()]
    torch.manual_seed(7)
    got = side.step()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, side.model.parameters(), strict=True))


class FakeCuda:
    """torch.cuda's stream, sync-debug and graph calls that capture_pyg makes, recorded;
    ``fail``: 'sync' (the checked step synchronizes) or 'capture' (capture_end raises)."""

    def __init__(self, side, fail=None):
        self.side, self.fail, self.log, self.mode = side, fail, [], 0
        cuda = self

        class Stream:
            def wait_stream(self, other):
                cuda.log.append("wait")

        class CUDAGraph:
            def replay(self):
                cuda.log.append("replay")

        self.Stream, self.CUDAGraph = Stream, CUDAGraph
        self.main = Stream()

    def current_stream(self):
        return self.main

    def stream(self, s):
        return self._ctx("side stream", "main stream")

    def graph(self, g):
        cuda = self

        class Capture:
            def __enter__(self):
                cuda.log.append("capture")
                cuda.grads_at_capture = [p.grad for p in cuda.side.model.parameters()]

            def __exit__(self, *exc):
                cuda.log.append("captured")
                if cuda.fail == "capture" and exc[0] is None:
                    raise RuntimeError("operation not permitted when stream is capturing")

        return Capture()

    def _ctx(self, enter, leave):
        cuda = self

        class Ctx:
            def __enter__(self):
                cuda.log.append(enter)

            def __exit__(self, *exc):
                cuda.log.append(leave)

        return Ctx()

    def get_sync_debug_mode(self):
        return self.mode

    def set_sync_debug_mode(self, mode):
        self.log.append(f"sync {mode}")
        self.mode = mode


def test_the_fake_speaks_torch_cuda_s_names():
    """What capture_pyg calls on the stand-in exists in torch.cuda (CPU builds too)."""
    for name in ("Stream", "current_stream", "stream", "get_sync_debug_mode",
                 "set_sync_debug_mode", "CUDAGraph", "graph"):  # fmt: skip
        assert hasattr(torch.cuda, name), name
    assert hasattr(torch.cuda.CUDAGraph, "replay")


def test_pyg_capture_follows_torch_s_whole_network_recipe(ds):
    """Warm-up steps on a side stream, one more with synchronizations errors, the
    gradients None as the capture begins, forward-loss-backward-step captured once, and
    the replay handed back."""
    side = e2e.PygSide("gcn", ds, e2e.pyg_inputs(ds, "cpu"), "csr", capturable=True)
    steps = []
    real_step = side.step
    side.step = lambda: steps.append(fake.mode) or real_step()
    fake = FakeCuda(side)
    replay = e2e.capture_pyg(side, cuda=fake)
    assert steps == [0] * e2e.PYG_WARMUP + ["error"]
    assert fake.log == ["wait", "side stream", "sync error", "sync 0", "main stream", "wait",
                        "capture", "captured"]  # fmt: skip
    assert fake.mode == 0
    assert fake.grads_at_capture and all(g is None for g in fake.grads_at_capture)
    assert all(p.grad is not None for p in side.model.parameters())  # backward ran inside
    assert side.static_loss.requires_grad and torch.isfinite(side.static_loss)
    assert side.setup()["adam"] == {"fused": True, "foreach": False, "capturable": True}
    replay()
    assert fake.log[-1] == "replay"


def test_a_pyg_step_that_cannot_be_captured_is_skipped_with_its_reason(ds):
    side = e2e.PygSide("gat", ds, e2e.pyg_inputs(ds, "cpu"), "edge_index", capturable=True)
    real_step = side.step

    def step():
        if fake.mode == "error":
            raise RuntimeError("called a synchronizing CUDA operation\nmore")
        return real_step()

    side.step = step
    fake = FakeCuda(side)
    with pytest.raises(e2e.Skipped, match=r"its step synchronizes \(RuntimeError: called a "):
        e2e.capture_pyg(side, cuda=fake)
    assert fake.mode == 0 and "capture" not in fake.log  # restored, never captured
    side = e2e.PygSide("gat", ds, e2e.pyg_inputs(ds, "cpu"), "loops", capturable=True)
    fake = FakeCuda(side, fail="capture")
    with pytest.raises(e2e.Skipped, match="cannot be captured: RuntimeError: operation not"):
        e2e.capture_pyg(side, cuda=fake)


def test_the_captured_sides_are_skipped_without_cuda_and_fail_nothing(ds, monkeypatch):
    monkeypatch.setattr(e2e, "FAILED", [])
    monkeypatch.setattr(e2e, "free_gpu", lambda: None)
    setups = {}
    builders = e2e.pyg_sides("sage", ds, "cpu", setups)
    assert sorted(builders) == ["pyg_csr", "pyg_edge_index", "pyg_graph_csr",
                                "pyg_graph_edge_index"]  # fmt: skip
    builders["mgg_graph"] = e2e.captured("sage", ds, "cpu")
    fns, skipped = e2e.build_sides(builders)
    assert sorted(fns) == ["pyg_csr", "pyg_edge_index"] and sorted(setups) == sorted(fns)
    assert sorted(skipped) == ["mgg_graph", "pyg_graph_csr", "pyg_graph_edge_index"]
    assert all(why.startswith("needs CUDA") for why in skipped.values())
    assert e2e.FAILED == []
