"""PyG's contract: MessagePassing and the layers on it against PyG's own layers (forward
and gradients), the generic path against the fused one, P ranks against PyG on the
whole graph (real mpiexec runs), and the graph each layer needs checked or derived."""

import json
import pickle
import textwrap

import numpy as np
import pytest
import torch

import mgg.torch as mt
from mgg.distgraph import DistGraph
from mgg.errors import InputError
from mgg.graph import Graph

from conftest import ROOT, mpirun, random_graph

pyg = pytest.importorskip("torch_geometric.nn")

N, FIN = 40, 6


def mlp(a, b):
    return torch.nn.Sequential(torch.nn.Linear(a, 7), torch.nn.ReLU(), torch.nn.Linear(7, b))


# (name, ours, PyG's, forward keywords: 'w' edge weights, 'e' edge features [E, 4],
#  'e6' edge features of x's width, 'x0' GCNII's initial rows)
CASES = {
    "gcn": (lambda: mt.GCNConv(FIN, 5), lambda: pyg.GCNConv(FIN, 5), ()),
    "gcn_improved": (  # with weights: PyG fills no loop weight 2 without (its quirk)
        lambda: mt.GCNConv(FIN, 5, improved=True),
        lambda: pyg.GCNConv(FIN, 5, improved=True),
        ("w",),
    ),
    "gcn_weighted": (lambda: mt.GCNConv(FIN, 5), lambda: pyg.GCNConv(FIN, 5), ("w",)),
    "gcn_no_loops": (
        lambda: mt.GCNConv(FIN, 9, add_self_loops=False),
        lambda: pyg.GCNConv(FIN, 9, add_self_loops=False),
        (),
    ),
    "gcn_raw": (
        lambda: mt.GCNConv(FIN, 5, normalize=False),
        lambda: pyg.GCNConv(FIN, 5, normalize=False),
        ("w",),
    ),
    "sage_mean": (lambda: mt.SAGEConv(FIN, 5), lambda: pyg.SAGEConv(FIN, 5), ()),
    "sage_max": (
        lambda: mt.SAGEConv(FIN, 5, aggr="max"),
        lambda: pyg.SAGEConv(FIN, 5, aggr="max"),
        (),
    ),
    "sage_min_project": (
        lambda: mt.SAGEConv(FIN, 5, aggr="min", project=True, normalize=True),
        lambda: pyg.SAGEConv(FIN, 5, aggr="min", project=True, normalize=True),
        (),
    ),
    "sage_sum": (
        lambda: mt.SAGEConv(FIN, 8, aggr="sum", root_weight=False),
        lambda: pyg.SAGEConv(FIN, 8, aggr="sum", root_weight=False),
        (),
    ),
    "gat_loops": (
        lambda: mt.GATConv(FIN, 3, heads=2),
        lambda: pyg.GATConv(FIN, 3, heads=2),
        (),
    ),
    "gatv2": (
        lambda: mt.GATv2Conv(FIN, 3, heads=2),
        lambda: pyg.GATv2Conv(FIN, 3, heads=2),
        (),
    ),
    "gatv2_edges": (
        lambda: mt.GATv2Conv(FIN, 4, heads=2, concat=False, edge_dim=4, add_self_loops=False),
        lambda: pyg.GATv2Conv(FIN, 4, heads=2, concat=False, edge_dim=4, add_self_loops=False),
        ("e",),
    ),
    "gcn2": (
        lambda: mt.GCN2Conv(FIN, alpha=0.1, theta=0.5, layer=3),
        lambda: pyg.GCN2Conv(FIN, alpha=0.1, theta=0.5, layer=3),
        ("x0",),
    ),
    "gcn2_raw": (  # normalize=False on an unweighted graph: the fused op's plain sum
        lambda: mt.GCN2Conv(FIN, alpha=0.3, theta=0.5, layer=2, normalize=False),
        lambda: pyg.GCN2Conv(FIN, alpha=0.3, theta=0.5, layer=2, normalize=False),
        ("x0",),
    ),
    "gcn2_two_weights": (
        lambda: mt.GCN2Conv(FIN, alpha=0.2, theta=1.0, layer=1, shared_weights=False),
        lambda: pyg.GCN2Conv(FIN, alpha=0.2, theta=1.0, layer=1, shared_weights=False),
        ("x0",),
    ),
    "appnp": (lambda: mt.APPNP(K=3, alpha=0.1), lambda: pyg.APPNP(K=3, alpha=0.1), ()),
    "gine": (
        lambda: mt.GINEConv(mlp(FIN, 5), train_eps=True, edge_dim=4),
        lambda: pyg.GINEConv(mlp(FIN, 5), train_eps=True, edge_dim=4),
        ("e",),
    ),
    "gine_same_width": (
        lambda: mt.GINEConv(mlp(FIN, 5)),
        lambda: pyg.GINEConv(mlp(FIN, 5)),
        ("e6",),
    ),
    "edgeconv": (lambda: mt.EdgeConv(mlp(2 * FIN, 5)), lambda: pyg.EdgeConv(mlp(2 * FIN, 5)), ()),
    "edgeconv_mean": (
        lambda: mt.EdgeConv(mlp(2 * FIN, 5), aggr="mean"),
        lambda: pyg.EdgeConv(mlp(2 * FIN, 5), aggr="mean"),
        (),
    ),
}


def build_pair(name):
    ours, theirs, extra = CASES[name]
    torch.manual_seed(3)
    theirs = theirs().double()
    ours = ours().double()
    with torch.no_grad():
        for p in theirs.parameters():  # away from PyG's zero biases and eps
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs, extra


def inputs(g: Graph, seed=5):
    """Whole-graph inputs: x [N, FIN], x0, per-edge weights and features in the graph's
    CSR order (PyG's edge_index order here)."""
    gen = torch.Generator().manual_seed(seed)
    e = g.num_edges
    return {
        "x": torch.randn(g.num_nodes, FIN, generator=gen, dtype=torch.float64),
        "x0": torch.randn(g.num_nodes, FIN, generator=gen, dtype=torch.float64),
        "w": torch.rand(e, generator=gen, dtype=torch.float64) + 0.1,
        "e": torch.randn(e, 4, generator=gen, dtype=torch.float64),
        "e6": torch.randn(e, FIN, generator=gen, dtype=torch.float64),
    }


def pyg_call(layer, g: Graph, data, extra):
    src, dst = g.edges()
    ei = torch.tensor(np.stack([src, dst]).astype(np.int64))
    if "x0" in extra:
        return layer(data["x"], data["x0"], ei)
    if "w" in extra:
        return layer(data["x"], ei, data["w"])
    if "e" in extra or "e6" in extra:
        return layer(data["x"], ei, data["e" if "e" in extra else "e6"])
    return layer(data["x"], ei)


def ours_call(layer, dg, g: Graph, data, extra, lb, ub):
    """Our layer on rows lb..ub, with the per-edge inputs in edge_index(dg)'s order."""
    src, dst = g.edges()
    pos = {(int(d), int(s)): i for i, (s, d) in enumerate(zip(src, dst, strict=True))}
    d, s = mt.edge_ids(dg) if hasattr(mt, "edge_ids") else mt.ops.edge_ids(dg)
    order = torch.tensor([pos[(int(a), int(b))] for a, b in zip(d, s, strict=True)])
    x = data["x"][lb:ub]
    if "x0" in extra:
        return layer(x, data["x0"][lb:ub], dg)
    if "w" in extra:
        return layer(x, dg, data["w"][order])
    if "e" in extra or "e6" in extra:
        return layer(x, dg, data["e" if "e" in extra else "e6"][order])
    return layer(x, dg)


def with_grads(fn, data, keys, weight):
    """fn()'s output and the gradients of (output * weight).sum() in ``keys``' inputs."""
    for k in keys:
        data[k] = data[k].detach().requires_grad_()
    y = fn()
    (y * weight).sum().backward()
    return y.detach(), {k: data[k].grad for k in keys}


def graph(rng):
    g = random_graph(rng, N, 200, hub_dst=True, isolated=3)  # loops, a hub, isolated nodes
    src, dst = g.edges()
    keys = np.unique(dst.astype(np.int64) * N + src)  # once each: per-edge inputs match
    indptr = np.searchsorted(keys // N, np.arange(N + 1))
    return Graph(indptr, keys % N, num_nodes=N)  # unweighted: PyG's default


@pytest.mark.parametrize("name", list(CASES))
def test_layer_equals_pyg(rng, name):
    g = graph(rng)
    ours, theirs, extra = build_pair(name)
    keys = ["x", *[k for k in ("x0", "w", "e", "e6") if k in extra]]
    ref = inputs(g)
    weight = torch.randn_like(pyg_call(theirs, g, ref, extra).detach())
    y_ref, grads_ref = with_grads(lambda: pyg_call(theirs, g, ref, extra), ref, keys, weight)
    theirs.zero_grad()
    y_ref, grads_ref = with_grads(lambda: pyg_call(theirs, g, ref, extra), ref, keys, weight)
    pref = {k: p.grad for k, p in theirs.named_parameters()}
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    data = inputs(g)
    y, grads = with_grads(lambda: ours_call(ours, dg, g, data, extra, 0, N), data, keys, weight)
    assert y.shape == y_ref.shape
    assert float(y_ref.abs().max()) > 0.05
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    for k in keys:
        if k in ("e", "e6", "w"):  # per-edge gradients: ours in edge_index(dg)'s order
            assert torch.isclose(grads[k].sum(), grads_ref[k].sum(), atol=1e-5), k
            assert torch.isclose(grads[k].abs().sum(), grads_ref[k].abs().sum(), atol=1e-5), k
        else:
            torch.testing.assert_close(grads[k], grads_ref[k], atol=1e-5, rtol=1e-5)
    for k, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, pref[k], atol=1e-5, rtol=1e-5, msg=k)


@pytest.mark.parametrize(
    "name", ["gcn", "gcn_improved", "gat_loops", "sage_sum", "sage_mean", "appnp", "gcn2"]
)
def test_generic_path_equals_fused(rng, name):
    """fuse=False runs message/aggregate by index ops: the same numbers as mgg's kernels."""
    g = graph(rng)
    ours, _, extra = build_pair(name)
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    out = {}
    for fuse in (True, False):
        for m in ours.modules():
            if isinstance(m, mt.MessagePassing):
                m.fuse = fuse
        data = inputs(g)
        data["x"].requires_grad_()
        y = ours_call(ours, dg, g, data, extra, 0, N)
        y.square().sum().backward()
        out[fuse] = y.detach(), data["x"].grad
    torch.testing.assert_close(out[False][0], out[True][0], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out[False][1], out[True][1], atol=1e-10, rtol=1e-10)


class EdgeMax(mt.MessagePassing):
    """A user's layer: max over in-edges of w_e * x_u, plus x_v."""

    def __init__(self):
        super().__init__(aggr="max")

    def forward(self, x, g, w):
        return self.propagate(g, x=x, w=w)

    def message(self, x_j, w):
        return x_j * w[:, None]

    def update(self, inputs, x):
        return inputs + x


def test_a_new_layer_is_one_class(rng):
    g = graph(rng)
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    x = torch.randn(N, 3, dtype=torch.float64)
    d, s = mt.edge_ids(dg)
    w = torch.rand(len(d), dtype=torch.float64)
    y = EdgeMax()(x, dg, w)
    want = x.clone()
    for v in range(N):
        sel = np.flatnonzero(d == v)
        if sel.size:
            want[v] += (x[torch.as_tensor(s[sel])] * w[sel, None]).max(0).values
    torch.testing.assert_close(y, want)


class DoubledMean(mt.MessagePassing):
    """A user's layer whose aggregate has PyG's signature (no graph): twice the mean."""

    def __init__(self):
        super().__init__(aggr="mean")

    def aggregate(self, inputs, index, ptr=None, dim_size=None):
        return 2 * super().aggregate(inputs, index, ptr, dim_size)


def test_an_aggregate_with_pygs_signature_gets_no_graph_and_none_is_parked(rng):
    """propagate hands the graph to an aggregate that takes ``graph`` (the base's: mgg's
    segment sum), and calls one with PyG's signature without it (a scatter)."""
    dg = DistGraph.build(graph(rng), None, ps=3, dtype=np.float64)
    x = torch.randn(N, 3, dtype=torch.float64)
    layer = DoubledMean()
    y = layer.propagate(dg, x=x)
    torch.testing.assert_close(y, 2 * mt.MessagePassing(aggr="mean").propagate(dg, x=x))
    assert not hasattr(layer, "_graph")


def test_layers_refuse_a_graph_they_cannot_use(rng):
    g = graph(rng)
    normalized = DistGraph.build(g.gcn_norm(), None)  # no source kept: nothing to derive
    x = torch.randn(N, FIN)
    for layer in (mt.SAGEConv(FIN, 3), mt.GINConv(mlp(FIN, 3)), mt.EdgeConv(mlp(2 * FIN, 3))):
        with pytest.raises(InputError, match="needs the graph 'as_is'.*'gcn_norm'"):
            layer(x, normalized)
    with pytest.raises(ValueError, match="edge_weight on a graph normalized for GCN"):
        mt.GCNConv(FIN, 3)(x, normalized, torch.ones(normalized.plan.num_local_edges))
    loops = DistGraph.build(g.gcn_norm(), None)
    assert mt.GATConv(FIN, 2)(x, loops).shape == (N, 2)  # its loops are there
    plain = DistGraph(DistGraph.build(g, None).plan, None)  # built from a plan: no source
    with pytest.raises(InputError, match="GATConv .*needs the graph 'self_loops'"):
        mt.GATConv(FIN, 2)(x, plain)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: mt.GATConv(4, 2, edge_dim=3), "GATv2Conv"),
        (lambda: mt.GCNConv(4, 2, add_self_loops=True, normalize=False), "normalize=True"),
        (lambda: mt.SAGEConv(4, 2, aggr="lstm"), "aggr must be one of"),
        (lambda: mt.GATv2Conv(4, 2, edge_dim=3), "add_self_loops=False"),
        (lambda: mt.MessagePassing(flow="target_to_source"), "transposed graph"),
    ],
)
def test_pyg_arguments_mgg_lacks_are_refused_saying_what_to_do(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def weights(width: int) -> torch.Tensor:
    """[N, width]: the loss's weights of each output entry."""
    return torch.linspace(-1, 1, N * width, dtype=torch.float64).view(N, width)


LAYERS_JOB = """
import json, sys
import numpy as np, torch
sys.path.insert(0, "tests")
import test_pyg as t
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
from conftest import random_graph

comm = get_comm()
g = t.graph(np.random.default_rng(11))
out = {}
for name in sys.argv[1].split(","):
    ours, _, extra = t.build_pair(name)
    dg = DistGraph.build(g, comm, ps=3, dtype=np.float64, design="bulk_halo")
    data = t.inputs(g)
    x = data["x"][dg.lb:dg.ub].clone().requires_grad_()
    data["x"] = torch.cat([data["x"][:dg.lb], x, data["x"][dg.ub:]])
    y = t.ours_call(ours, dg, g, data, extra, dg.lb, dg.ub)
    (y * t.weights(y.shape[1])[dg.lb:dg.ub]).sum().backward()
    grads = {k: p.grad.numpy() for k, p in ours.named_parameters()}
    total = {k: comm.allreduce(v) for k, v in grads.items()}
    ys, dxs = comm.gather(y.detach().numpy()), comm.gather(x.grad.numpy())
    if comm.rank == 0:
        out[name] = {"y": np.concatenate(ys).tolist(), "dx": np.concatenate(dxs).tolist(),
                     "params": {k: v.tolist() for k, v in total.items()}}
if comm.rank == 0:
    print(json.dumps(out))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [3])  # two peers for the middle rank; 4 oversubscribes CI
def test_p_ranks_equal_pyg_on_the_whole_graph(tmp_path, rng, nprocs):
    names = ["gcn_improved", "sage_max", "gat_loops", "gatv2", "gcn2", "appnp", "edgeconv"]
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(LAYERS_JOB))
    r = mpirun(nprocs, "python", job, ",".join(names), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    g = graph(np.random.default_rng(11))
    for name in names:
        _, theirs, extra = build_pair(name)
        data = inputs(g)
        data["x"].requires_grad_()
        y = pyg_call(theirs, g, data, extra)
        (y * weights(y.shape[1])).sum().backward()
        np.testing.assert_allclose(got[name]["y"], y.detach().numpy(), atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got[name]["dx"], data["x"].grad.numpy(), atol=1e-5)
        for k, p in theirs.named_parameters():
            np.testing.assert_allclose(got[name]["params"][k], p.grad.numpy(), atol=1e-5)


# ---- Rows: losses, metrics and gradients over every rank ----------------------------------

ROWS_JOB = """
import json, pickle, sys
import torch
import torch.nn.functional as F
import mgg.pyg
import mgg.torch as mt
from mgg.errors import InputError

with open(sys.argv[1], "rb") as f:  # toy_dataset(), pickled: ranks skip importing PyG
    data = mgg.pyg.load(pickle.load(f), split="nodes")
g = data.g
torch.manual_seed(0)
lin = torch.nn.Linear(data.num_features, data.num_classes)
opt = torch.optim.SGD(lin.parameters(), lr=0.5)
out = lin(data.x)
loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
reg = 0.1 * lin.weight.square().sum()  # the same on every rank: counted once
(loss + reg).backward()
opt.step()
pred = out.argmax(-1)
mask = data.test_mask
refused = []
for f in (lambda: data.x.std(0), lambda: out.argmax(), lambda: data.x.max(0)):
    try:
        f()
    except InputError as e:
        refused.append(str(e)[:40])
lin2 = torch.nn.Linear(data.num_features, 2)
model = mt.DistributedModel(lin2, g)
local = mt.rows.plain(model(data.x)).square().mean()  # this rank's own mean: DDP's average
local.backward()
res = {
    "rank": g.rank,
    "lb": g.lb,
    "ub": g.ub,
    "ddp_grad": lin2.weight.grad.tolist(),
    "lin2": lin2.state_dict()["weight"].tolist() + [lin2.bias.tolist()],
    "train_here": int(torch.as_tensor(data.train_mask).as_subclass(torch.Tensor).sum()),
    "loss": float(loss.detach()),
    "correct": int((pred[mask] == data.y[mask]).sum()),
    "count": int(mask.sum()),
    "mean": data.x.mean(0).tolist(),
    "max": float(data.x.amax()),
    "nll": float(F.nll_loss(out.log_softmax(-1)[mask], data.y[mask], reduction="sum")),
    "weight": lin.weight.detach().tolist(),
    "refused": refused,
}
every = g.comm.gather(res)
if g.rank == 0:
    print(json.dumps(every))
"""


def toy_dataset():
    """40 nodes, 5 features, 3 classes; the training rows all among the last 10 nodes,
    so a rank of a 3-rank job holds none."""
    from mgg.graph.dataset import Dataset

    rng = np.random.default_rng(4)
    g = graph(rng)
    x = rng.normal(size=(N, 5)).astype(np.float32)
    y = rng.integers(0, 3, N)
    train = np.zeros(N, bool)
    train[-10:] = True
    test = np.zeros(N, bool)
    test[:30:3] = True
    return Dataset("toy", g, x, y, train, ~(train | test), test, num_classes=3)


@pytest.mark.mpi
def test_rows_reduce_over_every_rank(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(ROWS_JOB))
    (tmp_path / "toy.pkl").write_bytes(pickle.dumps(toy_dataset()))
    r = mpirun(3, "python", job, tmp_path / "toy.pkl", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) == 3
    assert min(o["train_here"] for o in got) == 0  # a rank holds no training row
    ds = toy_dataset()  # the oracle: the whole graph in one process, plain torch
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    x, y = torch.tensor(ds.x), torch.tensor(ds.y)
    train, test = torch.tensor(ds.train_mask), torch.tensor(ds.test_mask)
    out = lin(x)
    loss = F_cross_entropy(out[train], y[train])
    (loss + 0.1 * lin.weight.square().sum()).backward()
    opt.step()
    for o in got:
        assert o["loss"] == pytest.approx(float(loss.detach()), abs=1e-6)
        assert o["count"] == int(test.sum())
        assert o["correct"] == int((out.argmax(-1)[test] == y[test]).sum())
        np.testing.assert_allclose(o["mean"], x.mean(0).numpy(), atol=1e-6)
        assert o["max"] == pytest.approx(float(x.max()))
        nll = F_nll(out.log_softmax(-1)[test], y[test])
        assert o["nll"] == pytest.approx(float(nll.detach()), rel=1e-5)
        np.testing.assert_allclose(o["weight"], lin.weight.detach().numpy(), atol=1e-6)
        assert len(o["refused"]) == 3, o["refused"]
    lin2 = torch.nn.Linear(5, 2)  # the ranks' replica, as they built it after lin
    with torch.no_grad():
        lin2.weight.copy_(torch.tensor(got[0]["lin2"][:2]))
        lin2.bias.copy_(torch.tensor(got[0]["lin2"][2]))
    grads = []
    for o in got:
        lin2.zero_grad()
        lin2(x[o["lb"] : o["ub"]]).square().mean().backward()
        grads.append(lin2.weight.grad.clone())
    for o in got:
        np.testing.assert_allclose(o["ddp_grad"], torch.stack(grads).mean(0), atol=1e-6)


def F_cross_entropy(a, b):
    return torch.nn.functional.cross_entropy(a, b)


def F_nll(a, b):
    return torch.nn.functional.nll_loss(a, b, reduction="sum")


def test_rows_in_one_process_are_the_whole():
    import torch.nn.functional as F

    import mgg.pyg

    data = mgg.pyg.load(toy_dataset())
    assert isinstance(data.x, mt.Rows) and data.x.shape == (N, 5)
    assert int(data.train_mask.sum()) == 10 and data.num_nodes == N
    out = torch.nn.Linear(5, 3)(data.x)
    assert isinstance(out, mt.Rows) and isinstance(out.relu()[data.test_mask], mt.Rows)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    assert not isinstance(loss, mt.Rows) and loss.ndim == 0
    y = torch.as_tensor(toy_dataset().y)  # plain tensors: torch's own loss is the oracle
    ref = F.cross_entropy(mt.rows.plain(out)[-10:], y[-10:])  # the training rows: the last 10
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-6)
    empty = F.cross_entropy(out[:0], data.y[:0])  # no row anywhere: torch's nan
    assert torch.isnan(empty)
    with pytest.raises(InputError, match="argmax over dim 0 reduces the nodes of every rank"):
        out.argmax(0)
    step = data.g.keys.step
    loss.backward()
    assert data.g.keys.step == step + 1  # the next step's dropout masks


def test_sparse_features_behave_as_a_tensor():
    import torch.nn.functional as F

    import mgg.pyg
    from mgg.graph.dataset import Dataset

    rng = np.random.default_rng(1)
    x = (rng.random((N, 300)) < 0.02).astype(np.float32)  # bag of words: kept sparse
    ds = Dataset("bow", graph(rng), x, rng.integers(0, 3, N), num_classes=3)
    data = mgg.pyg.load(ds)
    assert isinstance(data.x, mt.SparseRows)
    assert data.x.size() == (N, 300) and data.x.size(1) == 300 and data.x.to("cpu") is data.x
    lin = torch.nn.Linear(300, 4)
    y = lin(F.dropout(data.x, p=0.5, training=True))
    assert isinstance(y, mt.Rows) and y.shape == (N, 4)
    dense = data.x.to_dense()
    kept = F.dropout(data.x, p=0.5, training=False)
    torch.testing.assert_close(lin(kept), lin(dense))
    some = data.x[torch.arange(N) % 4 == 0]  # a mask selects dense rows
    assert isinstance(some, mt.Rows)
    torch.testing.assert_close(mt.rows.plain(some), mt.rows.plain(dense)[::4])
    with pytest.raises(TypeError, match="softmax on sparse input features.*to_dense"):
        F.softmax(data.x, dim=-1)


def test_prepare_without_comm_in_a_multi_rank_job_is_refused(monkeypatch):
    from mgg.prepare import prepare

    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(InputError, match="one of 2 ranks but no comm was given"):
        prepare(toy_dataset(), None, "gcn")


CORA = ROOT / ".." / "shared" / "data" / "cora.npz"


def epochs_of(stdout: str) -> list[list[float]]:
    """[epoch, loss, train, val, test] of each 'Epoch: ...' line an example printed."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("Epoch")]
    return [[float(v.split(": ")[1]) for v in ln.split(", ")] for ln in lines]


@pytest.mark.mpi
@pytest.mark.skipif(not CORA.exists(), reason="no Cora")
def test_a_pyg_style_script_loses_the_same_at_1_and_3_ranks():
    """examples/pyg/gcn2_cora.py (sparse features through nn.Linear and F.dropout,
    GCN2Conv on a GCNNorm graph): the same losses and accuracies, line for line."""
    runs = {}
    for np_ in (1, 3):
        script = ROOT / "examples" / "pyg" / "gcn2_cora.py"
        r = mpirun(np_, "python", script, "--epochs", "4", "--layers", "4", timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[np_] = epochs_of(r.stdout)
    assert len(runs[1]) == len(runs[3]) == 4  # rank 0 alone prints
    for line in runs[3]:
        ref = runs[1][int(line[0]) - 1]
        assert line[1] == pytest.approx(ref[1], abs=1e-5)  # the loss
        assert line[2:] == ref[2:]  # accuracies


@pytest.mark.mpi
@pytest.mark.skipif(not CORA.exists(), reason="no Cora")
def test_a_pyg_style_script_and_its_pyg_twin_learn_alike(tmp_path):
    """examples/pyg/gcn.py at 2 ranks against its PyG twin (its three marked import lines
    swapped: bench/pyg_ports.py) in one process: the same accuracy within 3 points."""
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    from pyg_ports import twin

    twin_dir = ROOT / "examples" / f".pyg_twin_test_{tmp_path.name}"  # as deep as examples/pyg
    twin_dir.mkdir()
    try:
        assert twin(ROOT / "examples" / "pyg" / "gcn.py", twin_dir / "gcn.py") == 3
        env = dict(__import__("os").environ, PYTHONPATH=str(ROOT / "bench"))
        r = subprocess.run(
            [sys.executable, twin_dir / "gcn.py", "--epochs", "60"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        pyg = epochs_of(r.stdout)[-1][4]
        assert "mgg" not in (twin_dir / "gcn.py").read_text().split('"""')[2]
    finally:
        import shutil

        shutil.rmtree(twin_dir)
    r = mpirun(2, "python", ROOT / "examples" / "pyg" / "gcn.py", "--epochs", "60", timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    ours = epochs_of(r.stdout)[-1][4]
    assert pyg > 0.75 and ours > 0.75 and abs(pyg - ours) < 0.03, (pyg, ours)


def test_attention_weights_and_batch_norm_take_pygs_arguments(rng):
    import mgg.pyg

    data = mgg.pyg.load(toy_dataset())
    conv = mt.GATConv(5, 2, heads=3)
    y, (ei, alpha) = conv(data.x, data.edge_index, return_attention_weights=True)
    assert isinstance(y, mt.Rows) and alpha.shape == (ei.shape[1], 3)
    g = graph(np.random.default_rng(4))
    src, dst = g.edges()
    want = {(int(s), int(d)) for s, d in zip(src, dst, strict=True) if s != d}
    got = {(int(s), int(d)) for s, d in ei.T}
    assert got == want | {(v, v) for v in range(N)}  # its edges and one loop per node
    torch.testing.assert_close(  # a softmax per destination and head
        mt.scatter(mt.rows.plain(alpha), ei[1], N), torch.ones(N, 3), atol=1e-5, rtol=0
    )
    bn = mt.BatchNorm(5, affine=False, track_running_stats=False).eval()
    out = mt.rows.plain(bn(data.x))  # no g: the Rows bring theirs; batch statistics in eval
    x = mt.rows.plain(data.x)
    torch.testing.assert_close(out, (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + 1e-5))
    assert list(bn.state_dict()) == []


@pytest.mark.skipif(not CORA.exists(), reason="no Cora")
def test_a_transform_set_after_loading_applies_as_in_pyg():
    """PyG's citation benchmark sets ``dataset.transform`` after making the dataset."""
    import mgg.pyg.transforms as T
    from mgg.pyg.datasets import Planetoid

    dataset = Planetoid(str(CORA.parent), "Cora")
    raw = dataset[0].x.to_dense()
    dataset.transform = T.NormalizeFeatures()
    x = dataset[0].x.to_dense()
    assert not torch.allclose(raw.sum(1), torch.ones(raw.shape[0], dtype=raw.dtype))
    rows = x.sum(1).as_subclass(torch.Tensor)
    torch.testing.assert_close(rows[rows > 0], torch.ones_like(rows[rows > 0]))
    assert dataset.num_features == raw.shape[1]


def test_torch_manual_seed_moves_mgg_dropout_masks(rng):
    """A PyG script's torch.manual_seed(s) draws other masks for another s, the same for
    the same s (and P ranks draw one process's: test_a_pyg_style_script_loses_the_same)."""
    g = graph(rng)
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    x = mt.Rows.of(torch.ones(N, 8, dtype=torch.float64), dg)

    def masks(seed):
        torch.manual_seed(seed)
        dg.begin_step(0)
        return torch.nn.functional.dropout(x, 0.5).as_subclass(torch.Tensor) != 0

    a, b, c = masks(1), masks(2), masks(1)
    assert torch.equal(a, c)
    assert not torch.equal(a, b)


def test_data_edge_index_is_pygs_and_what_scripts_import_works():
    """data.edge_index is a [2, E] edge_index that PyG's utils, PyG's classes and mgg's
    fused layers all take; PyG's lazy Linear(-1, ...) sizes itself on the features."""
    import torch_geometric.nn as tgnn
    from torch_geometric.utils import degree

    import mgg.pyg
    import mgg.pyg.nn as mn
    import mgg.pyg.transforms as T
    from mgg.pyg.utils import add_self_loops

    ds = toy_dataset()
    data = mgg.pyg.load(ds)
    src, dst = ds.graph.edges()
    assert tuple(data.edge_index.shape) == (2, ds.graph.num_edges)
    want = np.bincount(src, minlength=N)  # out-degrees: the sources' side
    np.testing.assert_array_equal(degree(data.edge_index[0], N).numpy(), want)
    loops, _ = add_self_loops(data.edge_index, num_nodes=N)
    assert loops.shape[1] == ds.graph.num_edges + N
    lazy = mn.Linear(-1, 4)
    assert tuple(lazy(data.x).shape) == (N, 4) and lazy.in_channels == 5
    torch.manual_seed(0)
    fused, theirs = mn.GCNConv(5, 3), tgnn.GCNConv(5, 3)
    theirs.load_state_dict(fused.state_dict())
    ei = torch.tensor(np.stack([src, dst]).astype(np.int64))
    x = torch.as_tensor(ds.x)
    want = theirs(x, ei)
    torch.testing.assert_close(mt.rows.plain(fused(data.x, data.edge_index)), want)
    with pytest.raises(InputError, match="GCNConv: mgg's fused layer .* changed"):
        fused(data.x, loops)  # a changed edge_index: only PyG's own class takes it
    assert "edge_weight" not in data  # loaded as is: PyG's Data has none either
    normed = mgg.pyg.load(ds, transform=T.GCNNorm())
    assert normed.edge_weight.shape == (normed.edge_index.shape[1],)
    raw = mn.GraphConv(5, 3)
    with pytest.raises(InputError, match="normalized for GCN"):
        raw(normed.x, normed.g)
