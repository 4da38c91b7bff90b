import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mgg.graph.core import Graph
from mgg.kernels import aggregate, cpu, gather_halo, reference
from mgg.kernels.bf16 import store_rows, sums_for
from mgg.partition import build_plan
from mgg.precision import BF16

from conftest import assert_agg_close, held_weights, random_graph

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


def _three_steps(plan, x, op, w, eps):
    """The rows as a rank with peers sums them (init, accumulate into float sums,
    finalize, round once): the path aggregate_rows folds into one pass."""
    out = np.empty((plan.num_local_nodes, x.shape[1]), x.dtype)
    sums = sums_for(out, x.dtype)
    cpu.init_out(op, x, sums, eps)
    n = plan.lnp_node.size
    cpu.accumulate(plan.lnp_ptr, plan.lnp_node, 0, n, plan.local_indices, w, x, sums)
    cpu.finalize(op, plan.in_degrees(), sums)
    store_rows(sums, out)
    return out


def _oracle(plan, x, op, w, eps):
    """float64 from the plan's CSR (edge order = the weights'), with PyG's conventions."""
    import scipy.sparse as sp

    n, (ptr, idx) = plan.num_local_nodes, (plan.local_indptr, plan.local_indices)
    xd = np.asarray(x, np.float32 if x.dtype == BF16 else x.dtype).astype(np.float64)
    if w is None or w.ndim == 1:
        data = np.ones(idx.size) if w is None else w.astype(np.float64)
        out = sp.csr_matrix((data, idx, ptr), shape=(n, xd.shape[0])) @ xd
    else:  # per head: column j takes w[e, j // C]
        c = xd.shape[1] // w.shape[1]
        out = np.hstack(
            [
                sp.csr_matrix((w[:, h].astype(np.float64), idx, ptr), shape=(n, xd.shape[0]))
                @ xd[:, h * c : (h + 1) * c]
                for h in range(w.shape[1])
            ]
        )
    deg = np.diff(ptr)
    if op == "mean":
        out[deg > 0] /= deg[deg > 0, None]
    if op == "gin":
        out += (1.0 + eps) * xd[:n]
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, BF16])
@pytest.mark.parametrize("weights", [None, "edge", "heads"])
@pytest.mark.parametrize("ps", [2, 1000])
def test_rows_summed_once_equal_the_three_steps_bit_for_bit(rng, threads, dtype, weights, ps):
    """aggregate_rows (P = 1: each row summed in its thread's float row and stored once)
    against the init/accumulate/finalize/round path and float64, on a graph whose hubs'
    partitions span many chunks (ps = 2), or three chunks with empty ones between
    (ps = 1000: a partition past several chunks' shares), with rows that have no
    in-edge; every op and weight kind, 1 and 2 threads (32 and 64 chunks)."""
    import numba

    n, d = 400, 12
    src = rng.integers(0, n, 6000)
    dst = rng.integers(0, 350, 6000)  # rows 350.. have no in-edge
    dst[:3000], dst[3000:3800] = 3, 200  # hubs
    g = Graph.from_edges(src, dst, n)
    x = (rng.standard_normal((n + 5, d)) * 4).astype(dtype)  # 5 rows past the rank's
    plan = build_plan(g, 1, ps)[0]
    e = plan.local_indices.size
    w = {
        None: None,
        "edge": rng.standard_normal(e).astype(np.float32),
        "heads": rng.standard_normal((e, 3)).astype(np.float32),
    }[weights]
    if dtype == np.float64 and w is not None:
        w = w.astype(np.float64)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        node, ptr, k = plan.lnp_node, plan.lnp_ptr, threads * 32  # the kernels' chunks:
        cuts = np.searchsorted(ptr, ptr[-1] * np.arange(k + 1) // k)  # edge-balanced cuts
        c0 = cuts[1:-1][np.diff(cuts)[1:] > 0]
        tails = np.bincount(node[c0[node[c0] == node[c0 - 1]]])
        assert tails.max() >= 2  # a hub goes on past two chunk boundaries or more
        assert (np.diff(cuts) == 0).any() == (ps == 1000)
        for op in ["sum", "mean", "gin"] if w is None else ["sum"]:
            got = np.empty((n, d), dtype)
            eps = 0.25
            parts = (plan.lnp_ptr, node, plan.local_indices, w, x)
            cpu.aggregate_rows(op, *parts, got, eps, plan.in_degrees())
            want = _three_steps(plan, x, op, w, eps)
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=op)
            ref = _oracle(plan, x, op, w, eps)
            tol = {np.float32: 1e-5, np.float64: 1e-12}.get(dtype, 2.0**-8)
            mag = _oracle(
                plan, np.abs(x.astype(np.float64)), op, None if w is None else np.abs(w), eps
            )
            np.testing.assert_array_less(
                np.abs(got.astype(np.float64) - ref), tol * (mag + 1e-3) + 1e-12
            )
    finally:
        numba.set_num_threads(before)


def test_gcn_plans_keep_the_weights_factors_not_the_weights(rng):
    """A gcn_norm plan keeps D^-1/2 of its rows and halo, 4 bytes a node, in place of 4
    bytes an edge (each direction); the weights the CPU kernels make of them are the
    graph's, bit for bit, and its aggregation the oracle's, one rank or three."""
    g = random_graph(rng, 500, 5000, hub_src=True, isolated=3).gcn_norm()
    x = rng.standard_normal((g.num_nodes, 20)).astype(np.float32)
    want = reference.aggregate(g, x, "gcn")
    for p in build_plan(g, 1, 8) + build_plan(g, 3, 8):
        held = held_weights(p)
        assert p.local_weights is None and p.has_weights and held.norm is None
        size = {q: sum(a.nbytes for a in q.arrays().values()) for q in (p, held)}
        both = (p,) if p.symmetric else (p, p.transposed)
        edges = sum(q.num_local_edges + q.num_remote_edges for q in both)
        nodes = sum(q.num_local_nodes + q.num_halo for q in both)
        assert size[held] - size[p] == 4 * edges - 4 * nodes > 0
        src, dst = g.edges()  # the graph's weight of each of the plan's edges, by key
        keys = dst.astype(np.int64) * g.num_nodes + src
        order = np.argsort(keys, kind="stable")
        mine = np.concatenate(p.edge_keys())
        graph_w = g.weights[order[np.searchsorted(keys[order], mine)]]
        np.testing.assert_array_equal(np.concatenate(p.edge_weights()), graph_w)
        got = aggregate(p, x[p.lb : p.ub], "gcn", halo=gather_halo(p, x))
        np.testing.assert_allclose(got, want[p.lb : p.ub], rtol=1e-5, atol=1e-6)


def test_a_plan_counts_its_in_degrees_and_isolated_rows_once(rng):
    """The aggregations of a step read them: made once per plan, and a plan without
    isolated rows skips their pass (the kernel still writes every row)."""
    g = random_graph(rng, 200, 900, isolated=7)
    plans = build_plan(g, 2, ps=4)
    deg = np.diff(g.indptr)
    assert sum(p.num_isolated for p in plans) == np.count_nonzero(deg == 0) >= 7
    for p in plans:
        assert p.in_degrees() is p.in_degrees()
        np.testing.assert_array_equal(p.in_degrees(), deg[p.lb : p.ub])
    full = Graph(np.arange(0, 3 * 50 + 1, 3), rng.integers(0, 50, 150).astype(np.int32))
    (alone,) = build_plan(full, 1, ps=2)
    assert alone.num_isolated == 0
    x = rng.standard_normal((50, 5)).astype(np.float32)
    out = np.full((50, 5), np.nan, np.float32)  # every row written, none left from before
    aggregate(alone, x, "sum", out=out)
    np.testing.assert_allclose(out, reference.aggregate(full, x, "sum"), rtol=1e-5, atol=1e-5)
    (holes,) = build_plan(g, 1, ps=4)  # isolated rows: still zeroed over what out held
    x = rng.standard_normal((200, 5)).astype(np.float32)
    out = np.full((200, 5), np.nan, np.float32)
    aggregate(holes, x, "sum", out=out)
    np.testing.assert_allclose(out, reference.aggregate(g, x, "sum"), rtol=1e-5, atol=1e-5)
