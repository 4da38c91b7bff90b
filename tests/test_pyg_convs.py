"""Any PyG layer: every conv class of the installed PyG runs over mgg's distributed graph
(equal to PyG's own class on the whole graph, forward and every gradient, at 1, 2 and 4
ranks, on Cora and on a directed graph with hubs and an empty rank; in one process on a
messy graph with self loops too) or is refused at import with its reason. The cases are
made from the lists in mgg.pyg.convs."""

import inspect
import json
import sys
import textwrap

import numpy as np
import pytest
import torch

from mgg.errors import InputError
from mgg.graph import Graph

from conftest import ROOT, mpirun

tg = pytest.importorskip("torch_geometric.nn")
import mgg.pyg.nn as mn  # noqa: E402
from mgg.pyg.convs import FUSED, REFUSED, RUNS  # noqa: E402

FIN = 6


def lin(a, b):
    return torch.nn.Linear(a, b)


def mlp(a, b):
    return torch.nn.Sequential(lin(a, 7), torch.nn.ReLU(), lin(7, b))


def pna(nn, deg):
    return nn.PNAConv(FIN, 5, ["mean", "min", "max", "std"], ["identity", "amplification"], deg)


def user_layer(nn, deg):
    """A user's layer on ``nn.MessagePassing`` (PyG's, or mgg.pyg.nn's with the import
    changed): sources' messages scaled by their out-degree (PyG's degree over the
    sources: a global count), averaged."""
    from torch_geometric.utils import degree

    class Mine(nn.MessagePassing):
        def __init__(self):
            super().__init__(aggr="mean")
            self.lin = lin(FIN, 5)

        def forward(self, x, edge_index):
            out_deg = degree(edge_index[0], x.size(0), dtype=x.dtype)
            return self.propagate(edge_index, x=self.lin(x), d=out_deg.view(-1, 1))

        def message(self, x_j, d_j):
            return x_j / d_j.clamp(min=1).sqrt()

    return Mine()


# name -> [(constructor over a namespace (torch_geometric.nn or mgg.pyg.nn) and the graph's
# in-degree histogram, the call: 'x' (x, g), 'e' (x, g, edge_attr [E, 4]), 'w' (x, g,
# edge_weight), 'x0' (x, x0, g), 'pos' (x, pos, g), 'ppf' (x, pos, normal, g), 'x3' (x
# [N, 3, FIN], g), 'eval' (x, g) in evaluation)]: the defaults, and the arguments that
# change the path
CASES = {
    "SimpleConv": [
        (lambda nn, d: nn.SimpleConv(), "x"),
        (lambda nn, d: nn.SimpleConv("mean", combine_root="self_loop"), "x"),
    ],
    "ChebConv": [
        (lambda nn, d: nn.ChebConv(FIN, 5, K=3), "x"),
        (lambda nn, d: nn.ChebConv(FIN, 5, K=2, normalization="rw"), "w"),
    ],
    "GraphConv": [
        (lambda nn, d: nn.GraphConv(FIN, 5), "w"),
        (lambda nn, d: nn.GraphConv(FIN, 5, aggr="max"), "x"),
    ],
    "GatedGraphConv": [(lambda nn, d: nn.GatedGraphConv(8, 2), "x")],
    "ResGatedGraphConv": [(lambda nn, d: nn.ResGatedGraphConv(FIN, 5), "x")],
    "TransformerConv": [
        (lambda nn, d: nn.TransformerConv(FIN, 5), "x"),
        (lambda nn, d: nn.TransformerConv(FIN, 3, heads=2, beta=True, edge_dim=4), "e"),
        (lambda nn, d: nn.TransformerConv(FIN, 3, heads=2, concat=False), "x"),
    ],
    "AGNNConv": [
        (lambda nn, d: nn.AGNNConv(), "x"),
        (lambda nn, d: nn.AGNNConv(add_self_loops=False), "x"),
    ],
    "TAGConv": [
        (lambda nn, d: nn.TAGConv(FIN, 5), "x"),
        (lambda nn, d: nn.TAGConv(FIN, 5, K=2, normalize=False), "w"),
    ],
    "ARMAConv": [
        (lambda nn, d: nn.ARMAConv(FIN, 5), "x"),
        (lambda nn, d: nn.ARMAConv(FIN, 5, num_stacks=2, num_layers=2, shared_weights=True), "w"),
    ],
    "SGConv": [
        (lambda nn, d: nn.SGConv(FIN, 5, K=2), "x"),
        (lambda nn, d: nn.SGConv(FIN, 5, K=2, cached=True, add_self_loops=False), "x"),
    ],
    "SSGConv": [(lambda nn, d: nn.SSGConv(FIN, 5, alpha=0.1, K=2), "x")],
    "MFConv": [(lambda nn, d: nn.MFConv(FIN, 5), "x")],
    "GMMConv": [(lambda nn, d: nn.GMMConv(FIN, 5, dim=4, kernel_size=2), "e")],
    "NNConv": [(lambda nn, d: nn.NNConv(FIN, 5, lin(4, FIN * 5), aggr="mean"), "e")],
    "CGConv": [(lambda nn, d: nn.CGConv(FIN, dim=4), "e")],
    "LEConv": [(lambda nn, d: nn.LEConv(FIN, 5), "x")],
    "PNAConv": [(lambda nn, d: pna(nn, d), "x")],
    "ClusterGCNConv": [(lambda nn, d: nn.ClusterGCNConv(FIN, 5, diag_lambda=0.5), "x")],
    "GENConv": [
        (lambda nn, d: nn.GENConv(FIN, 5), "x"),
        (
            lambda nn, d: nn.GENConv(
                FIN, 5, aggr="powermean", learn_p=True, msg_norm=True, edge_dim=4
            ),
            "e",
        ),
    ],
    "FiLMConv": [(lambda nn, d: nn.FiLMConv(FIN, 5), "x")],
    "SuperGATConv": [(lambda nn, d: nn.SuperGATConv(FIN, 3, heads=2), "eval")],
    "FAConv": [
        (lambda nn, d: nn.FAConv(FIN), "x0"),
        (lambda nn, d: nn.FAConv(FIN, cached=True, add_self_loops=False), "x0"),
    ],
    "EGConv": [
        (lambda nn, d: nn.EGConv(FIN, 8), "x"),
        (lambda nn, d: nn.EGConv(FIN, 8, aggregators=["symnorm", "max"], num_heads=2), "x"),
    ],
    "PDNConv": [(lambda nn, d: nn.PDNConv(FIN, 5, edge_dim=4, hidden_channels=7), "e")],
    "GeneralConv": [
        (lambda nn, d: nn.GeneralConv(FIN, 5), "x"),
        (lambda nn, d: nn.GeneralConv(FIN, 6, attention=True, heads=2, in_edge_channels=4), "e"),
    ],
    "LGConv": [(lambda nn, d: nn.LGConv(), "x")],
    "AntiSymmetricConv": [(lambda nn, d: nn.AntiSymmetricConv(FIN), "x")],
    "DirGNNConv": [(lambda nn, d: nn.DirGNNConv(tg.GCNConv(FIN, 5)), "x")],
    "MixHopConv": [(lambda nn, d: nn.MixHopConv(FIN, 5), "x")],
    "WLConvContinuous": [(lambda nn, d: nn.WLConvContinuous(), "w")],
    "PointNetConv": [(lambda nn, d: nn.PointNetConv(lin(FIN + 3, 5)), "pos")],
    "PPFConv": [(lambda nn, d: nn.PPFConv(lin(FIN + 4, 5)), "ppf")],
    "PointTransformerConv": [(lambda nn, d: nn.PointTransformerConv(FIN, 5), "pos")],
    "PointGNNConv": [
        (lambda nn, d: nn.PointGNNConv(lin(FIN, 3), lin(3 + FIN, FIN), lin(FIN, FIN)), "pos")
    ],
    "DNAConv": [(lambda nn, d: nn.DNAConv(FIN, heads=2, groups=1), "x3")],
    "FeaStConv": [(lambda nn, d: nn.FeaStConv(FIN, 5, heads=2), "x")],
    "MessagePassing": [(user_layer, "x")],
    "GCNConv": [(lambda nn, d: nn.GCNConv(FIN, 5), "w")],
    "SAGEConv": [(lambda nn, d: nn.SAGEConv(FIN, 5), "x")],
    "GINConv": [(lambda nn, d: nn.GINConv(mlp(FIN, 5), train_eps=True), "x")],
    "GINEConv": [(lambda nn, d: nn.GINEConv(mlp(FIN, 5), edge_dim=4), "e")],
    "GATConv": [(lambda nn, d: nn.GATConv(FIN, 3, heads=2), "x")],
    "GATv2Conv": [(lambda nn, d: nn.GATv2Conv(FIN, 3, heads=2), "x")],
    "GCN2Conv": [(lambda nn, d: nn.GCN2Conv(FIN, alpha=0.1, theta=0.5, layer=2), "x0")],
    "APPNP": [(lambda nn, d: nn.APPNP(K=3, alpha=0.1), "x")],
    "EdgeConv": [(lambda nn, d: nn.EdgeConv(mlp(2 * FIN, 5)), "x")],
}
CASE_IDS = [f"{name}-{i}" for name, cases in CASES.items() for i in range(len(cases))]


def messy(rng_seed=11):
    """40 nodes, self loops, a hub destination, isolated nodes, each edge once."""
    rng = np.random.default_rng(rng_seed)
    n = 40
    src, dst = rng.integers(0, 37, 200), rng.integers(0, 37, 200)
    dst[60:130] = 5
    return _graph(src, dst, n)


def hubs():
    """A directed graph without self loops whose first node takes most in-edges (rank 0
    of 4 holds no node) and whose node 3 sends a third of the others."""
    rng = np.random.default_rng(2)
    n = 40
    src, dst = rng.integers(0, n, 400), rng.integers(0, n, 400)
    dst[:380] = 0
    src[380:] = 3
    keep = src != dst  # no self loops: PyG's loops then follow the graph's edges, which
    return _graph(src[keep], dst[keep], n)  # mgg.pyg.convs.spmm runs on mgg's kernel


def _graph(src, dst, n):
    keys = np.unique(dst.astype(np.int64) * n + src)
    return Graph(np.searchsorted(keys // n, np.arange(n + 1)), keys % n, num_nodes=n)


CORA = ROOT / ".." / "shared" / "data" / "cora.npz"


def cora():
    """Cora's graph (2,708 nodes, 10,556 edges, no self loops): the P-rank cases' real
    graph; the messy one where ../shared is absent."""
    if not CORA.exists():
        return messy()
    from mgg.graph.specs import resolve

    return resolve(str(CORA)).graph


GRAPHS = {"cora": cora, "hubs": hubs}


def inputs(g: Graph):
    """Whole-graph inputs (float64): x, x0, x3, pos, normal; per-edge w, e in CSR order."""
    gen = torch.Generator().manual_seed(5)
    n, e = g.num_nodes, g.num_edges
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    return {
        "x": r(n, FIN),
        "x0": r(n, FIN),
        "x3": r(n, 3, FIN),
        "pos": r(n, 3),
        "normal": r(n, 3),
        "w": torch.rand(e, generator=gen, dtype=torch.float64) + 0.1,
        "e": r(e, 4),
    }


def build(name: str, i: int, g: Graph):
    """(PyG's layer, mgg's) with the same parameters (PyG's, moved off its init values)."""
    make, kind = CASES[name][i]
    src, dst = g.edges()
    deg = torch.bincount(
        torch.bincount(torch.as_tensor(dst, dtype=torch.long), minlength=g.num_nodes)
    )
    torch.manual_seed(3)
    theirs = make(tg, deg).double()
    ours = make(mn, deg).double()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    for layer in (theirs, ours):
        layer.train(kind != "eval")
    return theirs, ours, kind


def call(layer, kind, rows, edge, graph):
    """layer on node inputs ``rows`` (x, x0, x3, pos, normal) and per-edge inputs ``edge``
    (w, e) over ``graph`` (PyG's edge_index, or the DistGraph)."""
    if kind == "x0":
        return layer(rows["x"], rows["x0"], graph)
    if kind == "pos":
        return layer(rows["x"], rows["pos"], graph)
    if kind == "ppf":
        return layer(rows["x"], rows["pos"], rows["normal"], graph)
    if kind == "x3":
        return layer(rows["x3"], graph)
    if kind in ("w", "e"):
        return layer(rows["x"], graph, edge[kind])
    return layer(rows["x"], graph)


def oracle(name, i, g: Graph, seed=7):
    """PyG's layer on the whole graph: (y, grads of x-like inputs, parameter grads) of the
    loss sum(y * weights)."""
    theirs, _, kind = build(name, i, g)
    data = inputs(g)
    for k in ("x", "x0", "x3", "pos"):
        data[k].requires_grad_()
    src, dst = g.edges()
    ei = torch.tensor(np.stack([src, dst]).astype(np.int64))
    y = call(theirs, kind, data, data, ei)
    y = y[0] if isinstance(y, tuple) else y
    weights = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    (y * weights).sum().backward()
    grads = {k: data[k].grad for k in ("x", "x0", "x3", "pos") if data[k].grad is not None}
    return y.detach(), grads, {k: p.grad for k, p in theirs.named_parameters()}, weights


JOB = """
import json, sys
import numpy as np, torch
sys.path.insert(0, "tests")
import test_pyg_convs as t
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
import mgg.torch as mt

comm = get_comm()
out = {}
for graph in t.GRAPHS:
    g = t.GRAPHS[graph]()
    dg = DistGraph.build(g, comm, ps=3, dtype=np.float64)
    for case in sys.argv[1].split(","):
        name, i = case.rsplit("-", 1)
        out[graph + ":" + case] = t.ours(name, int(i), g, dg)
every = comm.gather(out)
if comm.rank == 0:
    print(json.dumps({k: [o[k] for o in every] for k in out}))
"""


def ours(name, i, g: Graph, dg, seed=7):
    """mgg's layer on this rank's rows: its rows of y and of the inputs' gradients, and the
    parameters' gradients (every rank's the whole graph's), as lists."""
    import mgg.torch as mt

    _, layer, kind = build(name, i, g)
    data = inputs(g)
    rows, leaves = {}, {}
    for k in ("x", "x0", "x3", "pos", "normal"):  # as a PyG script's data.x: Rows
        leaves[k] = data[k][dg.lb : dg.ub].clone().requires_grad_(k != "normal")
        rows[k] = mt.Rows.of(leaves[k], dg)
    src, dst = g.edges()
    pos = {(int(d), int(s)): j for j, (s, d) in enumerate(zip(src, dst, strict=True))}
    d, s = mt.edge_ids(dg)
    order = torch.tensor(
        [pos[(int(a), int(b))] for a, b in zip(d, s, strict=True)], dtype=torch.long
    )
    y = call(layer, kind, rows, {k: data[k][order] for k in ("w", "e")}, dg)
    y = y[0] if isinstance(y, tuple) else y
    assert isinstance(y, mt.Rows), f"{name}: its rows come back as Rows (mgg's dropout next)"
    shape = (g.num_nodes, *y.shape[1:])
    weights = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    (y * weights[dg.lb : dg.ub]).sum().backward()
    return {
        "y": mt.rows.plain(y).detach().tolist(),
        "grads": {k: v.grad.tolist() for k, v in leaves.items() if v.grad is not None},
        "params": {k: p.grad.tolist() for k, p in layer.named_parameters() if p.grad is not None},
    }


def _close(got, want, what):
    got = torch.tensor(np.asarray(got, dtype=np.float64)).reshape(want.shape)
    torch.testing.assert_close(got, want.double(), rtol=1e-5, atol=1e-7, msg=what)


def check(result, name, i, g):
    """Rank results (gathered by rank: rows lb..ub in order) against PyG's."""
    y, grads, params, _ = oracle(name, i, g)
    assert float(y.abs().max()) > 1e-3, f"{name}: PyG's output is zero, a weak case"
    _close([r for part in result for r in part["y"]], y, f"{name}: y")
    for k, want in grads.items():
        _close([r for part in result for r in part["grads"].get(k, [])], want, f"{name}: d{k}")
    for k, want in params.items():
        if want is None:
            continue
        for rank, part in enumerate(result):
            _close(part["params"][k], want, f"{name}: d{k} on rank {rank}")


def test_every_conv_of_pyg_is_listed_once():
    import torch_geometric.nn.conv as conv

    classes = {
        n for n in conv.__all__ if inspect.isclass(getattr(conv, n)) and n != "MessagePassing"
    }
    listed = [*RUNS, *FUSED, *REFUSED]
    assert sorted(listed) == sorted(set(listed)), "a layer listed twice"
    assert set(listed) == classes
    assert len(RUNS) + len(FUSED) >= 40
    assert set(CASES) == set(RUNS) | set(FUSED) | {"MessagePassing"}  # and a user's layer
    doc = (ROOT / "docs" / "pyg.md").read_text()
    assert not [n for n in listed if f"`{n}`" not in doc], "docs/pyg.md's lists"


@pytest.mark.parametrize("case", CASE_IDS)
@pytest.mark.parametrize("graph", ["messy", "cora"])
def test_layer_equals_pyg_in_one_process(case, graph):
    from mgg.distgraph import DistGraph

    name, i = case.rsplit("-", 1)
    g = {"messy": messy, "cora": cora}[graph]()
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    check([ours(name, int(i), g, dg)], name, int(i), g)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_layers_at_p_ranks_equal_pyg_on_the_whole_graph(tmp_path, nprocs):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    r = mpirun(nprocs, sys.executable, job, ",".join(CASE_IDS), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for graph, make in GRAPHS.items():
        g = make()
        for case in CASE_IDS:
            name, i = case.rsplit("-", 1)
            check(got[f"{graph}:{case}"], name, int(i), g)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_layer_names_itself_and_its_reason(name):
    with pytest.raises(ImportError, match=f"mgg.pyg.nn.{name}: refused: it "):
        getattr(mn, name)
    with pytest.raises(InputError):
        exec(f"from mgg.pyg.nn import {name}", {})


def test_an_op_without_a_global_meaning_fails_naming_it_and_the_layer():
    from mgg.distgraph import DistGraph

    class Sorting(mn.MessagePassing):
        def forward(self, x, edge_index):
            order = edge_index[0].argsort()  # per-rank local ids: no global meaning
            return self.propagate(edge_index[:, order], x=x)

    g = messy()
    dg = DistGraph.build(g, None, ps=3, dtype=np.float64)
    with pytest.raises(InputError, match=r"Sorting: .*argsort on edge_index\[0\]"):
        Sorting()(torch.randn(40, 3, dtype=torch.float64), dg)
    # PyG's layer infers the node count from the largest id (add_remaining_self_loops
    # without num_nodes): the same layer's other settings run
    egc = mn.EGConv(6, 8, aggregators=["sum", "max"], num_heads=2).double()
    with pytest.raises(InputError, match=r"EGConv: max on edge_index: .*num_nodes"):
        egc(torch.randn(40, 6, dtype=torch.float64), dg)
