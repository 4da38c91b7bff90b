import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgg.kernels import aggregate, gather_halo, reference
from mgg.partition import build_plan

from conftest import assert_agg_close, random_graph

OPS = ["sum", "mean", "gcn", "gin"]


def stitched(plans, x, op, eps=0.25):
    return np.concatenate(
        [aggregate(p, x[p.lb : p.ub], op, halo=gather_halo(p, x), eps=eps) for p in plans]
    )


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("p", range(1, 9))
def test_stitched_ranks_equal_scipy(rng, op, p):
    for kind in range(4):  # plain, hub source, hub destination, isolated nodes
        g = random_graph(
            rng, 500, 4000, hub_src=kind == 1, hub_dst=kind == 2, isolated=100 if kind == 3 else 0
        )
        if op == "gcn":
            g = g.gcn_norm()
        x = rng.standard_normal((g.num_nodes, 24)).astype(np.float32)
        plans = build_plan(g, p, ps=int(rng.integers(1, 33)))
        out = stitched(plans, x, op)
        assert_agg_close(out, reference.aggregate(g, x, op, eps=0.25), g, x)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    e=st.integers(0, 400),
    p=st.integers(1, 8),
    ps=st.integers(1, 8),
    d=st.integers(1, 9),
    op=st.sampled_from(OPS),
    seed=st.integers(0, 2**31),
)
def test_random_small_graphs_float64(n, e, p, ps, d, op, seed):
    rng = np.random.default_rng(seed)
    g = random_graph(rng, n, e)
    if op == "gcn":
        g = g.gcn_norm()
    x = rng.standard_normal((n, d))
    out = stitched(build_plan(g, p, ps), x, op)
    np.testing.assert_allclose(out, reference.aggregate(g, x, op, eps=0.25), rtol=1e-10, atol=1e-10)


def test_rows_beyond_the_rank_are_ignored_and_out_is_reused(rng):
    g = random_graph(rng, 100, 800)
    x = rng.standard_normal((100, 8)).astype(np.float32)
    plans = build_plan(g, 2, 4)
    p = plans[0]
    padded = np.vstack([x[p.lb : p.ub], np.full((7, 8), np.nan, np.float32)])
    out = np.full((p.num_local_nodes, 8), 123.0, np.float32)
    got = aggregate(p, padded, "sum", halo=gather_halo(p, x), out=out)
    assert got is out
    ref = reference.aggregate(g, x, "sum")[p.lb : p.ub]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_bad_inputs_are_named(rng):
    g = random_graph(rng, 50, 300)
    p = build_plan(g, 2, 4)[1]
    x = np.ones((p.num_local_nodes, 4), np.float32)
    with pytest.raises(ValueError, match="unknown aggregation op"):
        aggregate(p, x, "max", halo=gather_halo(p, np.ones((50, 4), np.float32)))
    with pytest.raises(ValueError, match="gcn_norm"):
        aggregate(p, x, "gcn")
    with pytest.raises(ValueError, match="halo"):
        aggregate(p, x, "sum")
    with pytest.raises(ValueError, match="halo has shape"):
        aggregate(p, x, "sum", halo=np.ones((p.num_halo, 5), np.float32))
    with pytest.raises(ValueError, match="unknown backend"):
        aggregate(p, x, "sum", halo=gather_halo(p, np.ones((50, 4), np.float32)), backend="tpu")
    with pytest.raises(ValueError, match="x has shape"):
        aggregate(p, x[:1], "sum", halo=gather_halo(p, np.ones((50, 4), np.float32)))
