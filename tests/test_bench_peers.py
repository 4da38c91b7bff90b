"""The peers the benchmarks time mgg against: each graph form PyG runs on computes the
same model (so PyG's best time is a time of the same function), and the host-floor
arithmetic of bench/gpu/e2e_vs_pyg.py."""

import subprocess
import sys

import numba
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


def test_the_gpu_locality_run_keeps_its_orders_and_reads_ncu_s_hit_rates(rng, tmp_path):
    """bench/gpu/kernel_ab.py --orders on a CPU: each order's graph file is the graph
    renumbered (computed once, then read back from --order-dir), and the L1/L2 hit rates
    come out of ncu's CSV by metric name."""
    from kernel_ab import ordered_graphs, parse_hit_rates

    g = random_graph(rng, 200, 1500).symmetrize()
    keep = tmp_path / "orders"
    first = ordered_graphs(g, ["natural", "rcm", "metis"], 4, str(tmp_path), str(keep))
    assert sorted(p.name for p in keep.iterdir()) == ["metis.npy", "rcm.npy"]
    from mgg.partition import order as node_order

    z = np.load(first["rcm"])
    want = g.permute(np.load(keep / "rcm.npy"))
    np.testing.assert_array_equal(z["indices"], want.indices)
    mine = node_order.Order("rcm", np.arange(g.num_nodes)[::-1].copy())  # read, not redone
    node_order.save(keep / "rcm.npy", mine, node_order.fingerprint_of(g))
    (tmp_path / "x").mkdir()
    z = np.load(ordered_graphs(g, ["rcm"], 4, str(tmp_path / "x"), str(keep))["rcm"])
    want = g.permute(mine.perm)
    np.testing.assert_array_equal(z["indptr"], want.indptr)
    np.testing.assert_array_equal(z["indices"], want.indices)
    csv = "\n".join(
        [
            '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
            '"0","mgg_aggregate","l1tex__t_sector_hit_rate.pct","%","7.5"',
            '"0","mgg_aggregate","lts__t_sector_hit_rate.pct","%","81.25"',
            '"1","mgg_aggregate","l1tex__t_sector_hit_rate.pct","%","9.5"',
        ]
    )
    assert parse_hit_rates(csv) == {"l1_hit_pct": [7.5, 9.5], "l2_hit_pct": [81.25]}


def test_kernel_ab_profiles_one_inner_run_never_itself():
    """Under ncu, kernel_ab.py without --inner would run the whole benchmark again, and
    call ncu again (GPU run 8: the stage ran past its command into the next)."""
    from kernel_ab import profiled

    script = str(ROOT / "bench" / "gpu" / "kernel_ab.py")
    out = subprocess.run([sys.executable, script, "--profile"], capture_output=True, text=True)
    assert out.returncode == 2 and "--profile profiles one inner run" in out.stderr
    me = [sys.executable, "-u", script, "--repeat", "3", "--dims", "16"]
    cmd = profiled("ncu", ["--section", "Occupancy"], me, "/tmp/graph.npz")
    assert cmd[0] == "ncu" and cmd[-3:] == ["--inner", "/tmp/graph.npz", "--profile"]


def test_a_side_that_fails_costs_its_own_cell_and_fails_the_run(monkeypatch):
    """e2e_vs_pyg: a side that raises (GAT's captured step, GPU run 8) is recorded and
    named, its memory freed, the others still run, and the run's status says it failed."""
    import e2e_vs_pyg

    ran, freed = [], []
    monkeypatch.setattr(e2e_vs_pyg, "free_gpu", lambda: freed.append(1))
    monkeypatch.setattr(e2e_vs_pyg, "FAILED", [])  # the run's list, this test's alone

    def broken():
        raise RuntimeError("the stream was capturing\nmore")

    fns, skipped = e2e_vs_pyg.build_sides(
        {"a": lambda: lambda: ran.append("a"), "b": broken, "c": lambda: lambda: ran.append("c")}
    )
    assert sorted(fns) == ["a", "c"] and ran == ["a", "c"]
    assert skipped == {"b": "failed: RuntimeError: the stream was capturing"}
    assert e2e_vs_pyg.FAILED == ["b: failed: RuntimeError: the stream was capturing"]
    assert freed == [1]


@numba.njit(cache=False)
def _twice(a):
    return a.sum() * 2


def test_a_step_s_costs_are_counted_where_they_arise():
    """bench/step_costs.py: the torch calls, autograd nodes and numba kernel calls of a
    known step, and its compiled time apart from its Python time."""
    from step_costs import autograd_nodes, dispatch_counts, profile_steps

    x, w = torch.ones(4, 3), torch.ones(3, requires_grad=True)
    a = np.ones(1000)

    def loss():
        return (x * w).sum()

    def step():
        _twice(a), _twice(a)  # two kernel calls
        loss().backward()

    step()
    assert autograd_nodes(loss()) == 3  # SumBackward0, MulBackward0, AccumulateGrad
    counts = dispatch_counts(step)
    assert counts["torch_calls"] == 3 and counts["aten_ops"] >= 3  # __mul__, sum, backward
    prof = profile_steps(step, 4)
    assert prof["kernel_calls"] == 2 and prof["native_ms"] > 0 and prof["python_calls"] >= 2
