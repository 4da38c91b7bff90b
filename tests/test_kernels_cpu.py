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


@pytest.mark.parametrize("shape,lb", [((37, 13), 0), ((5, 64), 1000), ((1, 1), 7)])
def test_dense_dropout_draws_the_masks_of_its_hash(rng, shape, lb):
    """The vectorized kernel keeps entry (i, j) exactly where the hash of the counter
    (lb + i) * ncols + j + 1 is >= threshold, and the CSR kernel draws the same mask."""
    import scipy.sparse as sp

    from mgg.hashing import GOLDEN, mix64
    from mgg.kernels import cpu_nn

    x = rng.standard_normal(shape).astype(np.float32) + 3  # no stored zeros
    key, threshold, scale = np.uint64(0xDEADBEEF12345), np.uint32(3 << 30), np.float32(4.0)
    n, d = shape
    want = np.zeros_like(x)
    for i in range(n):
        for j in range(d):
            with np.errstate(over="ignore"):  # the hash's counter wraps mod 2^64
                z = mix64(key + np.uint64((lb + i) * d + j + 1) * GOLDEN)
            if np.uint32(z >> np.uint64(32)) >= threshold:
                want[i, j] = x[i, j] * scale
    got = cpu_nn.dropout_dense(x, key, lb, threshold, scale)
    np.testing.assert_array_equal(got, want)
    assert 0 < (got != 0).sum() < x.size or x.size == 1
    np.testing.assert_array_equal(
        got, cpu_nn.dropout_dense(np.asfortranarray(x), key, lb, threshold, scale)
    )
    csr = cpu_nn.dropout_csr(sp.csr_matrix(x), key, lb, threshold, scale)
    np.testing.assert_array_equal(csr.toarray(), want)
