"""mgg.torch: the layers against PyG's, gradients against finite differences, and P ranks
against one process (real mpiexec runs; the oracle is the single-process run)."""

import textwrap

import numpy as np
import pytest
import torch

import mgg.torch as mt
from mgg.distgraph import DistGraph
from mgg.errors import InputError
from mgg.graph import Graph

from conftest import mpirun, random_graph

pyg = pytest.importorskip("torch_geometric.nn")


def graph_for(layer: str, g: Graph) -> Graph:
    return {
        "gcn": g.gcn_norm,
        "gat": lambda: g.remove_self_loops().add_self_loops(),
        "gin": g.remove_self_loops,
        "sage": lambda: g,
    }[layer]()


def edge_index(g: Graph) -> torch.Tensor:
    src, dst = g.edges()
    return torch.tensor(np.stack([src, dst]).astype(np.int64))


def pair(kind: str, fin: int, fout: int):
    """(ours, PyG's) with the same weights."""
    if kind == "gcn":
        ours, theirs = mt.GCNConv(fin, fout), pyg.GCNConv(fin, fout)
    elif kind == "sage":
        ours, theirs = mt.SAGEConv(fin, fout), pyg.SAGEConv(fin, fout)
    elif kind == "gat":
        ours = mt.GATConv(fin, fout, heads=3, dropout=0.0)
        theirs = pyg.GATConv(fin, fout, heads=3, add_self_loops=False)
    else:
        mlp = torch.nn.Sequential(
            torch.nn.Linear(fin, 7), torch.nn.ReLU(), torch.nn.Linear(7, fout)
        )
        ours, theirs = mt.GINConv(mlp, train_eps=True), pyg.GINConv(mlp, train_eps=True)
        with torch.no_grad():
            theirs.eps.fill_(0.3)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin", "gat"])
@pytest.mark.parametrize("fin,fout", [(12, 5), (6, 16)])  # transform first, aggregate first
def test_layers_equal_pyg_forward_and_gradients(rng, kind, fin, fout):
    g = random_graph(rng, 40, 200, hub_dst=True, isolated=3)  # directed, duplicates, loops
    gk = graph_for(kind, g)
    ours, theirs = pair(kind, fin, fout)
    dg = DistGraph.build(gk, None, ps=3)
    x = torch.randn(40, fin)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = ours(xa, dg)
    # PyG's GCNConv adds the self loops and normalizes itself
    yb = theirs(xb, edge_index(g.remove_self_loops() if kind == "gcn" else gk))
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(ya)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
    theirs_grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs_grads[name].grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_attention_equals_the_softmax_torch_computes_edge_by_edge(rng, dtype):
    """mt.attention's one-kernel softmax (and its backward) against torch's composition:
    gather the scores per edge, LeakyReLU, softmax; hubs and nodes without in-edges."""
    g = random_graph(rng, 60, 500, hub_dst=True, isolated=5)
    dg = DistGraph.build(g, None, ps=4, dtype=np.dtype(str(dtype)[6:]))
    a_src = (3 * torch.randn(60, 4, dtype=dtype)).requires_grad_()
    a_dst = (3 * torch.randn(60, 4, dtype=dtype)).requires_grad_()
    alpha = mt.attention(a_src, a_dst, dg, 0.1)
    src, dst = mt.edge_index(dg)
    s0, d0 = a_src.detach().clone().requires_grad_(), a_dst.detach().clone().requires_grad_()
    score = torch.nn.functional.leaky_relu(s0[src] + d0[dst], 0.1)
    want = mt.softmax(score, dst, num_nodes=60)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(alpha, want, atol=tol, rtol=tol)
    w = torch.randn_like(want)
    (alpha * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(a_src.grad, s0.grad, atol=10 * tol, rtol=10 * tol)
    torch.testing.assert_close(a_dst.grad, d0.grad, atol=10 * tol, rtol=10 * tol)
    with pytest.raises(ValueError, match="two \\[n, heads\\] tensors"):
        mt.attention(a_src, a_dst[:, :2], dg)


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin"])
@pytest.mark.parametrize("fin,fout", [(12, 5), (6, 16)])
def test_pyg_widths_aggregates_where_pyg_does_and_computes_the_same(
    rng, monkeypatch, kind, fin, fout
):
    from mgg.torch.layers import gcn, gin, sage

    g = graph_for(kind, random_graph(rng, 40, 200, hub_dst=True, isolated=3))
    ours, theirs = pair(kind, fin, fout)
    dg = DistGraph.build(g, None, ps=3)
    widths = []
    real = mt.aggregate
    for family in (gcn, sage, gin):
        monkeypatch.setattr(
            family, "aggregate", lambda x, *a, **k: widths.append(x.shape[1]) or real(x, *a, **k)
        )
    x = torch.randn(40, fin)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = ours(xa, dg)
    with mt.pyg_widths(ours):
        yb = ours(xb, dg)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(ya)
    (ya * w).sum().backward()
    (yb * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
    first = theirs.nn[0].out_features if kind == "gin" else fout
    narrow = min(fin, first)
    pyg_width = first if kind == "gcn" else fin  # PyG: GCN transforms first, SAGE/GIN not
    assert widths == [narrow, pyg_width]


@pytest.mark.parametrize("kind", ["gcn", "sage", "gin", "gat"])
def test_gradients_match_finite_differences(rng, kind):
    g = graph_for(kind, random_graph(rng, 9, 30))
    torch.manual_seed(0)
    layer = {
        "gcn": lambda: mt.GCNConv(6, 4),
        "sage": lambda: mt.SAGEConv(6, 4),
        "gin": lambda: mt.GINConv(mt.MLP([6, 5, 3]), train_eps=True),
        "gat": lambda: mt.GATConv(6, 2, heads=2),
    }[kind]().double()
    dg = DistGraph.build(g, None, ps=2, dtype=np.float64)
    x = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    names = [k for k, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in layer.parameters())

    def f(x, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps, strict=True)), (x, dg))

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-6)


def test_sparse_features_are_never_densified(rng):
    import scipy.sparse as sp

    g = random_graph(rng, 30, 120).gcn_norm()
    dg = DistGraph.build(g, None, ps=4)
    m = sp.random(30, 50, 0.1, format="csr", dtype=np.float32, random_state=1)
    dense = torch.from_numpy(m.toarray())
    x = mt.SparseRows(m)
    m.toarray = m.todense = None  # densifying would now fail
    torch.manual_seed(0)
    conv = mt.GCNConv(50, 4)
    y = conv(x, dg)
    y.sum().backward()
    ref = mt.GCNConv(50, 4)
    ref.load_state_dict(conv.state_dict())
    yr = ref(dense, dg)
    yr.sum().backward()
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv.lin.weight.grad, ref.lin.weight.grad, atol=1e-5, rtol=1e-5)


def test_batch_norm_equals_torch_on_one_rank(rng):
    dg = DistGraph.build(random_graph(rng, 20, 60), None)
    bn, ref = mt.BatchNorm(5), torch.nn.BatchNorm1d(5)
    x = torch.randn(20, 5) * 3 + 1
    for _ in range(3):
        torch.testing.assert_close(bn(x, dg), ref(x))
    torch.testing.assert_close(bn.running_var, ref.running_var)
    bn.eval(), ref.eval()
    torch.testing.assert_close(bn(x, dg), ref(x))


def test_gin_evaluates_with_the_graphs_statistics(rng):
    """GIN's norms keep no running statistics: without dropout, the evaluation's logits
    are the training pass's (running ones would differ), and a state written with running
    statistics loads, dropping them."""
    from mgg.graph.core import job_graph
    from mgg.torch.models import GIN

    dg = DistGraph.build(job_graph(random_graph(rng, 40, 160), "no_self_loops"), None)
    x = torch.randn(40, 6) * 2 + 1
    torch.manual_seed(0)
    model = GIN(6, 8, 3, dropout=0.0, input_dropout=0.0)
    assert not [k for k in model.state_dict() if "running" in k]
    trained = model.train()(x, dg)
    torch.testing.assert_close(model.eval()(x, dg), trained)
    old = {**model.state_dict(), "convs.0.nn.norms.0.running_mean": torch.full((8,), 5.0)}
    old["convs.0.nn.norms.0.running_var"] = torch.full((8,), 9.0)
    old["convs.0.nn.norms.0.num_batches_tracked"] = torch.tensor(3)
    model.load_state_dict(old)
    torch.testing.assert_close(model(x, dg), trained)


def test_dropout_masks_are_keyed_by_step_and_call(rng):
    g = random_graph(rng, 50, 100)
    one = DistGraph.build(g, None)
    x = torch.ones(50, 7)
    one.begin_step(3)
    full = mt.dropout(x, one, 0.5)
    assert 0.3 < (full == 0).float().mean() < 0.7
    torch.testing.assert_close(full[full != 0], torch.full_like(full[full != 0], 2.0))
    one.begin_step(3)
    again = mt.dropout(x, one, 0.5)
    assert torch.equal(full, again)
    second = mt.dropout(x, one, 0.5)  # the next call of the step draws another mask
    assert not torch.equal(full, second)
    one.begin_step(4)
    assert not torch.equal(full, mt.dropout(x, one, 0.5))
    # that a rank of a P-rank job draws the same entries: test_p_ranks_equal_one_process


def test_a_captured_steps_key_slots_draw_the_eager_steps_masks(rng):
    """A CUDA graph replays its kernels with fixed arguments, so a captured step's dropout
    kernels read their keys from key_slots, which mgg.torch.graphs fills before each
    replay (step_keys). The kernels' CPU twins read the slots too: the masks a step draws
    from its slots are the masks an eager step draws, and the slots, not the host's step,
    decide them."""
    from mgg.torch.graphs import SLOTS, step_keys

    g = DistGraph.build(random_graph(rng, 60, 300), None)
    g.keys.seed = 11
    x = torch.randn(60, 9)

    def draws(step):
        g.begin_step(step)
        masks = [mt.dropout(x, g, 0.5), mt.dropout(x, g, 0.3)]
        return masks + [mt.edge_dropout(torch.ones(g.plan.num_edges, 2), g, 0.5)]

    eager = {s: draws(s) for s in (5, 6)}
    g.keys.key_slots = torch.from_numpy(step_keys(11, 5))
    for got, want in zip(draws(5), eager[5], strict=True):
        assert torch.equal(got, want)
    for got, want in zip(draws(6), eager[5], strict=True):  # the host says 6, slots say 5
        assert torch.equal(got, want)
    assert not torch.equal(eager[5][0], eager[6][0])
    g.keys.key_slots = torch.from_numpy(step_keys(11, 6))
    assert torch.equal(draws(5)[0], eager[6][0])
    g.begin_step(0)
    with pytest.raises(RuntimeError, match=f"more than {SLOTS} dropout masks"):
        for _ in range(SLOTS + 1):
            mt.dropout(x, g, 0.5)
    g.keys.key_slots = None


def test_every_function_over_mgg_kernels_runs_cupy_on_torchs_stream():
    """Autograd runs a CUDA backward on a thread of its own, where CuPy's stream is its
    default while torch's is the forward's (a captured step's): every autograd Function
    of the ops' modules and message is an Op, whose forward and backward follow torch's
    stream."""
    from mgg.torch import (
        aggregation,
        collectives,
        dropouts,
        gat_softmax,
        inputs,
        interop,
        message,
        recompute,
    )

    found = [
        c
        for m in (aggregation, gat_softmax, collectives, dropouts, inputs, recompute, message)
        for c in vars(m).values()
        if isinstance(c, type) and issubclass(c, torch.autograd.Function) and c is not interop.Op
    ]
    assert len(found) >= 10
    for c in found:
        assert issubclass(c, interop.Op), c
        for name in ("forward", "backward"):
            assert getattr(c, name).__wrapped__ is not None, (c, name)


def test_a_cuda_graph_step_is_refused_where_it_cannot_replay(rng):
    from mgg.errors import InputError
    from mgg.graph.generators import planted_partition
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.train import Trainer

    dg, data = prepare(planted_partition(200, 3, avg_degree=5, num_features=6, seed=0))
    m = mt.build_model("gcn", data.num_features, data.num_classes)
    opt = build_optimizer("adam", m, 0.01, 0.0)
    with pytest.raises(InputError, match=r"^--cuda-graph: it needs --backend cuda$"):
        Trainer(dg, data, m, opt, cuda_graph=True)


def test_clear_errors(rng):
    dg = DistGraph.build(random_graph(rng, 10, 30).gcn_norm(), None)
    conv = mt.GCNConv(4, 3)
    with pytest.raises(ValueError, match="has 9 rows but rank 0 owns 10 nodes"):
        conv(torch.randn(9, 4), dg)
    with pytest.raises(TypeError, match="^GCNConv: the graph argument g must be .*inside an mgg"):
        conv(torch.randn(10, 4), edge_index(random_graph(rng, 10, 30)))
    with pytest.raises(ValueError, match="unknown aggregation op"):
        mt.aggregate(torch.randn(10, 4), dg, "max")
    with pytest.raises(ValueError, match="weights have 3 rows"):
        mt.aggregate(torch.randn(10, 4), dg, weights=torch.ones(3))
    with pytest.raises(ValueError, match="heads do not divide"):
        mt.aggregate(torch.randn(10, 4), dg, weights=torch.ones(dg.plan.num_local_edges, 3))
    with pytest.raises(ValueError, match="dropout probability"):
        mt.dropout(torch.randn(10, 4), dg, 1.0)


def test_every_layer_and_op_names_a_graph_that_is_not_the_jobs(rng):
    """g = None (or an edge_index, or a Graph) is named before anything touches it."""
    x = torch.randn(10, 4)
    calls = {
        "GCNConv": lambda g: mt.GCNConv(4, 3)(x, g),
        "SAGEConv": lambda g: mt.SAGEConv(4, 3)(x, g),
        "GINConv": lambda g: mt.GINConv(mt.MLP([4, 3, 2]))(x, g),
        "GATConv": lambda g: mt.GATConv(4, 3, heads=2)(x, g),
        "BatchNorm": lambda g: mt.BatchNorm(4).eval()(x, g),  # eval: g unused, still checked
        "MLP": lambda g: mt.MLP([4, 3], batch_norm=False)(x, g),
        "aggregate": lambda g: mt.aggregate(x, g),
        "halo": lambda g: mt.halo(x, g),
        "all_reduce": lambda g: mt.all_reduce(x, g),
        "dropout": lambda g: mt.dropout(x, g, 0.5, training=False),
        "edge_dropout": lambda g: mt.edge_dropout(torch.ones(5, 1), g, 0.5),
        "edge_index": lambda g: mt.edge_index(g),
    }
    graph = random_graph(rng, 10, 30)
    for what, call in calls.items():
        for g, name in ((None, "NoneType"), (edge_index(graph), "Tensor"), (graph, "Graph")):
            with pytest.raises(TypeError) as e:
                call(g)
            assert str(e.value).startswith(
                f"{what}: the graph argument g must be the job's DistGraph, got {name}: "
            ), (what, str(e.value))


def test_aggregate_computes_in_the_jobs_dtype_and_refuses_others(rng):
    """Never a silent cast: float64 rows reach float32 kernels only if the caller casts;
    a float64 DistGraph (cpu) aggregates in float64."""
    g = random_graph(rng, 10, 30).gcn_norm()
    dg32, dg64 = DistGraph.build(g, None), DistGraph.build(g, None, dtype=np.float64)
    x = torch.randn(10, 4, dtype=torch.float64)
    for t, dg, want in (
        (x, dg32, "float32"),
        (x.float(), dg64, "float64"),
        (x.half(), dg32, "float32"),
    ):
        with pytest.raises(InputError) as e:
            mt.aggregate(t, dg, "gcn")
        assert str(e.value).startswith(
            f"aggregate: x is {t.dtype} but this job aggregates torch.{want} (the DistGraph's "
            f"dtype): pass x.to(torch.{want}), or build"
        )
    with pytest.raises(InputError, match=r"^aggregate: weights is torch.float64 but this job"):
        mt.aggregate(x.float(), dg32, weights=torch.ones(dg32.plan.num_local_edges).double())
    with pytest.raises(
        InputError, match=r"x must be a torch.float32 tensor \[n, D\], got shape \(10,\)$"
    ):
        mt.aggregate(x[:, 0].float(), dg32)
    with pytest.raises(TypeError, match=r"^aggregate: x must be a tensor of this rank's rows"):
        mt.aggregate(x.numpy(), dg64)
    ref = g.to_scipy().astype(np.float64) @ x.numpy()
    y = mt.aggregate(x, dg64, "gcn")
    assert y.dtype == torch.float64
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-12, atol=1e-15)
    y32 = mt.aggregate(x.float(), dg32, "gcn")  # float32: what the caller asked for
    assert y32.dtype == torch.float32 and not np.allclose(y32.numpy(), ref, rtol=1e-12, atol=0)


F64_JOB = """
import json
import numpy as np, torch
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
from mgg.graph.generators import rmat

comm = get_comm()
g = rmat(7, 6, seed=3).gcn_norm()
X = torch.randn(g.num_nodes, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
out = {}
for design in ("pipelined", "bulk_halo", "direct"):
    dg = DistGraph.build(g, comm, design=design, dtype=np.float64)
    x = X[dg.lb : dg.ub].clone().requires_grad_()
    y = mt.aggregate(x, dg, "gcn")
    y.sum().backward()
    ys, dxs = comm.gather(y.detach().numpy()), comm.gather(x.grad.numpy())
    if comm.rank == 0:
        a = g.to_scipy().astype(np.float64)
        y_err = np.abs(np.concatenate(ys) - a @ X.numpy()).max()
        dx_err = np.abs(np.concatenate(dxs) - a.T @ np.ones_like(X.numpy())).max()
        out[design] = [str(y.dtype), float(y_err), float(dx_err)]
    dg.free()
if comm.rank == 0:
    print(json.dumps(out))
"""


@pytest.mark.mpi
def test_p_ranks_aggregate_float64_in_float64(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(F64_JOB)
    r = mpirun(2, "python", job, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    for design, (dtype, y_err, dx_err) in json.loads(r.stdout.strip().splitlines()[-1]).items():
        assert dtype == "torch.float64" and y_err < 1e-12 and dx_err < 1e-12, design


LAYERS_JOB = """
import json, sys
import numpy as np, torch
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
from mgg.graph.generators import rmat

comm = get_comm()
g0 = rmat(7, 6, seed=3)  # directed, hubs, duplicates
KIND, DESIGN = sys.argv[1], sys.argv[2]
g = {"gcn": g0.gcn_norm, "gat": lambda: g0.remove_self_loops().add_self_loops(),
     "gin": g0.remove_self_loops, "sage": lambda: g0}[KIND]()
n = g.num_nodes

def make():
    torch.manual_seed(1)
    return {
        "gcn": lambda: mt.GCNConv(12, 5),
        "sage": lambda: mt.SAGEConv(12, 5),
        "gin": lambda: mt.GINConv(mt.MLP([12, 8, 5]), train_eps=True),
        "gat": lambda: mt.GATConv(12, 3, heads=4, dropout=0.3),
    }[KIND]()

def run(dg, lb, ub):
    layer = make()
    torch.manual_seed(2)
    x = torch.randn(n, 12)[lb:ub].clone().requires_grad_()
    w = torch.randn(n, 5 if KIND != "gat" else 12)[lb:ub]
    dg.begin_step(7)
    y = layer(mt.dropout(x, dg, 0.2), dg)
    (y * w).sum().backward()
    mt.sync_gradients(layer.parameters(), dg.comm)  # the mean of the ranks' gradients
    grads = {k: (p.grad * dg.size).numpy() for k, p in layer.named_parameters()}  # their sum
    return y.detach().numpy(), x.grad.numpy(), grads

dg = DistGraph.build(g, comm, ps=4, design=DESIGN)
y, dx, grads = run(dg, dg.lb, dg.ub)
refused = ""
if KIND == "gin":  # torch's own BatchNorm would normalize each rank alone
    seq = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.BatchNorm1d(8))
    try:
        mt.GINConv(seq)(torch.randn(dg.num_local_nodes, 12), dg)
    except ValueError as e:
        refused = str(e)
ys, dxs = comm.gather(y), comm.gather(dx)
if comm.rank == 0:
    y1, dx1, grads1 = run(DistGraph.build(g, None, ps=4), 0, n)
    err = {
        "y": float(np.abs(np.concatenate(ys) - y1).max()),
        "dx": float(np.abs(np.concatenate(dxs) - dx1).max()),
        "params": {k: float(np.abs(grads[k] - grads1[k]).max()) for k in grads1},
        "scale": float(np.abs(y1).max()),
        "refused": refused,
    }
    print(json.dumps(err))
"""


@pytest.mark.mpi
@pytest.mark.parametrize(
    "kind,nprocs,design",
    [
        ("gcn", 4, "pipelined"),
        ("sage", 3, "bulk_halo"),
        ("gin", 4, "pipelined"),
        ("gat", 4, "pipelined"),
        ("gat", 2, "direct"),
    ],
)
def test_p_ranks_equal_one_process(tmp_path, kind, nprocs, design):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(LAYERS_JOB))
    r = mpirun(nprocs, "python", job, kind, design, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    err = json.loads(r.stdout.strip().splitlines()[-1])
    assert err["scale"] > 0.1
    assert err["y"] < 1e-4 and err["dx"] < 1e-4, err
    for name, e in err["params"].items():
        assert e < 1e-3, (name, err)
    if kind == "gin":
        assert "normalizes each rank's rows alone" in err["refused"]


@pytest.mark.parametrize("eps_stays", [False, True])
def test_gin_aggregate_and_its_eps_gradient_equal_scipy(rng, monkeypatch, eps_stays):
    """(1 + eps) x + A x, dx = (1 + eps) w + Aᵀ w and d eps = <x, w> against scipy, both
    ways: eps read by the kernel (the CPU), and eps left on the device with eps x added
    after the kernel (what a GPU does: _Aggregate.eps_stays, forced here)."""
    from mgg.torch.aggregation import _Aggregate

    if eps_stays:
        monkeypatch.setattr(_Aggregate, "eps_stays", staticmethod(lambda eps, x: eps is not None))
    g = random_graph(rng, 30, 150, hub_dst=True).remove_self_loops()
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    x = torch.randn(30, 5, dtype=torch.float64, requires_grad=True)
    eps = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 5, dtype=torch.float64)
    y = mt.aggregate(x, dg, "gin", eps=eps)
    (y * w).sum().backward()
    a, xn, wn = g.to_scipy().astype(np.float64), x.detach().numpy(), w.numpy()
    np.testing.assert_allclose(y.detach().numpy(), 1.3 * xn + a @ xn, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), 1.3 * wn + a.T @ wn, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(eps.grad.numpy(), [(xn * wn).sum()], rtol=1e-12)


def test_batch_norm_counts_the_rows_of_every_rank_from_the_plan(rng):
    """The count over the ranks is the plan's node count (no allreduce, no device read),
    so x must be this rank's rows: other rows are refused, naming both counts."""
    dg = DistGraph.build(random_graph(rng, 20, 60), None)
    with pytest.raises(ValueError, match=r"^BatchNorm: the input has 19 rows but rank 0 owns 20"):
        mt.BatchNorm(5)(torch.randn(19, 5), dg)


BN_JOB = """
import json
import numpy as np, torch
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
from mgg.graph.generators import rmat

comm = get_comm()
g = rmat(7, 6, seed=3)
dg = DistGraph.build(g, comm, ps=4)
torch.manual_seed(0)
x_all = torch.randn(g.num_nodes, 5) * 0.5 + 1000.0  # a mean 2,000 deviations away
w_all = torch.randn(g.num_nodes, 5)
calls = []
allreduce = comm.allreduce
comm.allreduce = lambda a, op="sum": calls.append(a.size) or allreduce(a, op)
bn = mt.BatchNorm(5)
x = x_all[dg.lb : dg.ub].clone().requires_grad_()
y = bn(x, dg)
forward = len(calls)
(y * w_all[dg.lb : dg.ub]).sum().backward()
ys, dxs = comm.gather(y.detach().numpy()), comm.gather(x.grad.numpy())
if comm.rank == 0:
    ref = torch.nn.BatchNorm1d(5).double()
    xr = x_all.double().requires_grad_()
    yr = ref(xr)
    (yr * w_all.double()).sum().backward()
    print(json.dumps({
        "y": float(np.abs(np.concatenate(ys) - yr.detach().numpy()).max()),
        "dx": float(np.abs(np.concatenate(dxs) - xr.grad.numpy()).max()),
        "var": float(np.abs(bn.running_var.numpy() - ref.running_var.numpy()).max()),
        "forward": forward, "backward": len(calls) - forward,
    }))
"""


@pytest.mark.mpi
def test_batch_norm_on_ranks_reduces_once_each_way_and_keeps_its_precision(tmp_path):
    """Each rank's mean and its squares' mean about it, combined in float64 in one
    allreduce (one more in the backward pass), equal float64 torch on the whole graph,
    even with the mean 2,000 deviations from zero (x² - μ² in float32 would lose it)."""
    job = tmp_path / "job.py"
    job.write_text(BN_JOB)
    r = mpirun(3, "python", job, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    err = json.loads(r.stdout.strip().splitlines()[-1])
    assert err["forward"] == 1 and err["backward"] == 1, err
    assert err["y"] < 2e-3 and err["dx"] < 2e-3 and err["var"] < 1e-5, err
