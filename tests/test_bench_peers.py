"""The peers the benchmarks time mgg against: each graph form PyG runs on computes the
same model (so PyG's best time is a time of the same function), and the host-floor
arithmetic of bench/gpu/e2e_vs_pyg.py."""

import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, random_graph

pytest.importorskip("torch_geometric.nn")
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
from pyg_models import PATHS, pyg_graph, pyg_model  # noqa: E402


@pytest.mark.parametrize("name", list(PATHS))
def test_every_pyg_graph_form_computes_the_same_model(rng, name):
    g = random_graph(rng, 60, 400, hub_dst=True, self_loops=False, isolated=3)
    x = torch.from_numpy(rng.standard_normal((60, 11)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((60, 5)).astype(np.float32))
    got = {}
    for form in PATHS[name]:
        torch.manual_seed(0)  # the same weights on every form
        model = pyg_model(name, 11, 5, form).eval()
        xx = x.clone().requires_grad_()
        y = model(xx, pyg_graph(g, form))
        (y * w).sum().backward()
        got[form] = (y.detach(), xx.grad, next(model.parameters()).grad)
    (a, *_), *rest = got.values()
    assert a.abs().max() > 0
    first = next(iter(got.values()))
    for other in rest:
        for u, v in zip(first, other, strict=True):
            torch.testing.assert_close(u, v, atol=1e-4, rtol=1e-4)


def test_gat_loops_form_holds_each_self_loop_once_grouped_by_destination(rng):
    g = random_graph(rng, 30, 200, self_loops=True)
    src, dst = pyg_graph(g, "loops").numpy()
    assert np.all(np.diff(dst) >= 0)
    assert sorted(src[src == dst]) == list(range(30))
    s0, d0 = g.edges()
    keep, other = s0 != d0, src != dst
    got = sorted(zip(src[other], dst[other], strict=True))
    assert got == sorted(zip(s0[keep], d0[keep], strict=True))


def test_a_model_refuses_a_graph_form_it_does_not_run_on():
    with pytest.raises(ValueError, match="runs on edge_index, loops"):
        pyg_model("gat", 4, 2, "csr")


def test_busy_time_is_the_union_of_device_intervals():
    from e2e_vs_pyg import busy_seconds

    assert busy_seconds([]) == 0
    # overlapping, nested, touching and disjoint spans, unsorted
    spans = [(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 1.7), (3.0, 4.0), (8.0, 8.5)]
    assert busy_seconds(spans) == pytest.approx(4.0 + 1.0 + 0.5)
