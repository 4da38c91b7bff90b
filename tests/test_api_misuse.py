"""The Python API misused: each wrong input is refused where it enters with one of mgg's
errors naming the layer or method, the argument, what was expected and what came (issue
93); never a library's error from deep inside, a silent wrong answer or a segfault. And
the right use still computes the right numbers where a check could be wrong."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mgg.torch as mt
from mgg.distgraph import DistGraph
from mgg.errors import InputError, MggError

from conftest import ROOT, mpirun, random_graph

N, FIN = 40, 6
CORA = ROOT / ".." / "shared" / "data" / "cora.npz"


@pytest.fixture
def dg(rng):
    return DistGraph.build(random_graph(rng, N, 200, hub_dst=True, isolated=3), None, ps=3)


def edges(dg) -> int:
    return dg.plan.num_local_edges + dg.plan.num_remote_edges


class Returns(mt.MessagePassing):
    """A user's layer whose message returns ``f(x_j)``."""

    def __init__(self, f, aggr="add"):
        super().__init__(aggr=aggr)
        self.f = f

    def message(self, x_j):
        return self.f(x_j)


WRONG_MESSAGES = {
    "half the rows": (lambda t: t[: t.shape[0] // 2], r"got shape \(100, 6\)"),
    "one row too few": (lambda t: t[:-1], r"got shape \(199, 6\)"),
    "one row": (lambda t: t[:1], r"got shape \(1, 6\)"),
    "one row too many": (lambda t: torch.cat([t, t[:1]]), r"got shape \(201, 6\)"),
    "1-D": (lambda t: t[:, 0], r"at least 2-D.*got shape \(200,\)"),
    "numpy": (lambda t: t.detach().numpy(), "got ndarray"),
    "None": (lambda t: None, "got NoneType"),
    "a float": (lambda t: 1.0, "got float"),
    "int64": (lambda t: t.long(), "torch.float32 rows .*got torch.int64"),
    "float64": (lambda t: t.double(), "torch.float32 rows .*got torch.float64"),
}


@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
@pytest.mark.parametrize("case", list(WRONG_MESSAGES))
def test_a_message_of_the_wrong_shape_or_type_names_message_and_its_shape(dg, aggr, case):
    f, got = WRONG_MESSAGES[case]
    e = edges(dg)
    assert e == 200
    with pytest.raises(InputError, match=rf"^Returns\.message must return .*\[{e}, \.\.\.\] "):
        Returns(f, aggr).propagate(dg, x=torch.randn(N, FIN))
    with pytest.raises(InputError, match=got):
        Returns(f, aggr).propagate(dg, x=torch.randn(N, FIN))


class BadAggregate(mt.MessagePassing):
    def aggregate(self, inputs, index, ptr=None, dim_size=None, graph=None):
        return super().aggregate(inputs, index, ptr, dim_size, graph)[:-1]


class BadUpdate(mt.MessagePassing):
    def update(self, inputs):
        return inputs.numpy()


class ShortSuper(mt.MessagePassing):
    """An aggregate that hands the base's segment sum fewer rows than edges."""

    def aggregate(self, inputs, index, ptr=None, dim_size=None, graph=None):
        return super().aggregate(inputs[:1], index[:1], ptr, dim_size, graph)


def test_aggregate_and_update_must_return_node_rows(dg):
    x = torch.randn(N, FIN)
    with pytest.raises(
        InputError, match=rf"^BadAggregate\.aggregate must return .*\[{N}, \.\.\.\]"
    ):
        BadAggregate().propagate(dg, x=x)
    with pytest.raises(
        InputError, match=rf"^BadUpdate\.update must return .*\[{N}, \.\.\.\].*ndarray"
    ):
        BadUpdate().propagate(dg, x=x)
    with pytest.raises(InputError, match=r"^ShortSuper\.aggregate: inputs must be \[200, \.\.\.\]"):
        ShortSuper().propagate(dg, x=x)


def test_propagate_names_the_argument_it_cannot_use(dg, rng):
    mp = mt.MessagePassing()
    x = torch.randn(N, FIN)
    with pytest.raises(
        InputError, match=r"^MessagePassing\.propagate: unknown argument 'foo'.* take x$"
    ):
        mp.propagate(dg, x=x, foo=1)
    with pytest.raises(
        InputError, match=rf"^MessagePassing\.propagate: x must be .*\[{N}, \.\.\.\].*\(39, 6\)"
    ):
        mp.propagate(dg, x=x[:-1])
    with pytest.raises(InputError, match=r"^MessagePassing\.message needs 'x_j'"):
        mp.propagate(dg)
    with pytest.raises(InputError, match=r"propagate: x must be a tensor .*got ndarray"):
        mp.propagate(dg, x=x.numpy())
    sparse = mt.SparseRows(__import__("scipy.sparse").sparse.random(N, 30, 0.1, "csr", np.float32))
    with pytest.raises(
        InputError, match=r"propagate: x is sparse input features .*linear layer first"
    ):
        mp.propagate(dg, x=sparse)
    e = edges(dg)
    edge_mlp = mt.GINEConv(torch.nn.Linear(FIN, 3))
    with pytest.raises(
        InputError,
        match=rf"^GINEConv: edge_attr must be \[{e}\] or \[{e}, \.\.\.\].*\({e - 1}, 6\)",
    ):
        edge_mlp(x, dg, torch.randn(e - 1, FIN))


def test_layers_name_x_with_the_wrong_rows_width_dtype_or_kind(dg):
    x = torch.randn(N, FIN)
    layers = {
        "GCNConv": lambda x: mt.GCNConv(FIN, 3)(x, dg),
        "SAGEConv": lambda x: mt.SAGEConv(FIN, 3)(x, dg),
        "GATConv": lambda x: mt.GATConv(FIN, 3, heads=2)(x, dg),
        "GATv2Conv": lambda x: mt.GATv2Conv(FIN, 3)(x, dg),
        "GINConv": lambda x: mt.GINConv(mt.MLP([FIN, 4, 3]))(x, dg),
        "MLP": lambda x: mt.MLP([FIN, 3], batch_norm=False)(x, dg),
    }
    for who, call in layers.items():
        with pytest.raises(
            InputError, match=rf"^{who}: x has {FIN + 1} columns but the layer takes {FIN}"
        ):
            call(torch.randn(N, FIN + 1))
        with pytest.raises(InputError, match=rf"^{who}: x has 39 rows but rank 0 owns {N} nodes"):
            call(x[:-1])
        with pytest.raises(
            InputError, match=rf"^{who}: x is torch.float64 but this job computes in torch.float32"
        ):
            call(x.double())
        with pytest.raises(
            InputError,
            match=rf"^{who}: x must be this rank's rows \[{N}, {FIN}\], got shape \({N},\)",
        ):
            call(x[:, 0])
        with pytest.raises(TypeError, match=rf"^{who}: x must be a tensor"):  # an mgg error too
            call(x.numpy())
        assert call(x).shape[0] == N
    for who, call in {
        "APPNP": lambda x: mt.APPNP(2, 0.1)(x, dg),
        "EdgeConv": lambda x: mt.EdgeConv(torch.nn.Linear(2 * FIN, 3))(x, dg),
    }.items():
        with pytest.raises(InputError, match=rf"^{who}: x has 39 rows"):
            call(x[:-1])
        call(x)
    gin = mt.GINConv(torch.nn.Linear(FIN + 1, 3))  # a bare Linear: its width is checked too
    with pytest.raises(
        InputError, match=rf"^GINConv: x has {FIN} columns but the layer takes {FIN + 1}"
    ):
        gin(x, dg)
    conv2 = mt.GCN2Conv(FIN, 0.1)
    with pytest.raises(InputError, match=rf"^GCN2Conv: x_0 must be \[{N}, {FIN}\].*\({N}, 5\)"):
        conv2(x, x[:, :5], dg)


def test_gcn_edge_weight_is_checked_and_the_right_one_still_computes_gcn(rng):
    g = random_graph(rng, N, 200, hub_dst=True, isolated=3)
    dg = DistGraph.build(g, None, ps=3)
    e = edges(dg)
    x = torch.randn(N, FIN)
    conv = mt.GCNConv(FIN, 3)
    for w, got in (
        (torch.ones(e - 1), rf"\({e - 1},\)"),
        (torch.ones(e + 1), rf"\({e + 1},\)"),
        (torch.ones(e, 2), rf"\({e}, 2\)"),
    ):
        with pytest.raises(
            InputError, match=rf"^GCNConv: edge_weight must be \[{e}\] over .*{got}"
        ):
            conv(x, dg, w)
    with pytest.raises(InputError, match=r"^GCNConv: edge_weight must be a float tensor"):
        conv(x, dg, np.ones(e, np.float32))
    with pytest.raises(InputError, match=r"^GCNConv: edge_weight must be a float tensor .*int64"):
        conv(x, dg, torch.ones(e, dtype=torch.int64))
    # ones of the right length: the graph's own GCN (its plan's weights), to float32 rounding
    torch.testing.assert_close(conv(x, dg, torch.ones(e)), conv(x, dg), atol=1e-5, rtol=1e-5)
    plain = mt.GCNConv(FIN, 3, normalize=False)
    plain.load_state_dict(conv.state_dict())
    w = torch.rand(e, dtype=torch.float64)  # weights of another float dtype: cast, as PyG
    torch.testing.assert_close(plain(x, dg, w), plain(x, dg, w.float()))


def test_gatv2_edge_attr_width_is_named(rng):
    g = random_graph(rng, N, 200).remove_self_loops().add_self_loops()
    dg = DistGraph.build(g, None, ps=3)
    conv = mt.GATv2Conv(FIN, 2, edge_dim=3, add_self_loops=False)
    e = edges(dg)
    with pytest.raises(InputError, match=r"^GATv2Conv: edge_attr has 4 features but edge_dim is 3"):
        conv(torch.randn(N, FIN), dg, torch.randn(e, 4))
    with pytest.raises(InputError, match=rf"^GATv2Conv: edge_attr must be \[{e}\]"):
        conv(torch.randn(N, FIN), dg, torch.randn(e - 2, 3))
    assert conv(torch.randn(N, FIN), dg, torch.randn(e, 3)).shape == (N, 2)


def test_sparse_features_of_another_width_name_the_layer_and_linear():
    import scipy.sparse as sp

    import mgg.pyg
    from mgg.graph.dataset import Dataset

    rng = np.random.default_rng(1)
    x = sp.random(N, 300, 0.02, "csr", np.float32, rng=rng).toarray()
    data = mgg.pyg.load(
        Dataset("bow", random_graph(rng, N, 200), x, rng.integers(0, 3, N), num_classes=3)
    )
    assert isinstance(data.x, mt.SparseRows)
    with pytest.raises(InputError, match=r"^GCNConv: x has 300 columns but the layer takes 301"):
        mt.GCNConv(301, 3)(data.x, data.g)
    with pytest.raises(
        InputError, match=r"^linear: x is \(40, 300\) \(SparseRows\) but the weight .*\(3, 301\)"
    ):
        torch.nn.Linear(301, 3)(data.x)
    with pytest.raises(InputError, match=r"propagate: x is sparse input features"):
        mt.MessagePassing().propagate(data.g, x=data.x)
    assert mt.GCNConv(300, 3)(data.x, data.g).shape == (N, 3)


@pytest.mark.skipif(not CORA.exists(), reason="no Cora")
def test_cora_misuse_is_named():
    import mgg.pyg

    data = mgg.pyg.load(str(CORA))
    n = data.g.num_local_nodes
    with pytest.raises(InputError, match=r"^GCNConv: x has 1433 columns but the layer takes 1438"):
        mt.GCNConv(1438, 16)(data.x, data.g)
    h = torch.nn.Linear(1433, 8)(data.x)
    e = edges(data.g)
    with pytest.raises(
        InputError, match=rf"^Returns\.message must return .*\[{e}, \.\.\.\].*\({e // 2}, 8\)"
    ):
        Returns(lambda t: t[: t.shape[0] // 2]).propagate(data.g, x=h)
    with pytest.raises(InputError, match=rf"\({e - 1}, 8\)"):
        Returns(lambda t: t[:-1]).propagate(data.g, x=h)
    with pytest.raises(InputError, match=rf"^GCNConv: edge_weight must be \[{e}\]"):
        mt.GCNConv(8, 4)(h, data.g, torch.ones(e - 1))
    assert mt.GCNConv(8, 4)(h, data.g).shape == (n, 4)


def test_scatter_and_softmax_name_an_index_of_another_length():
    msg = torch.randn(10, 3)
    with pytest.raises(InputError, match=r"^scatter: index has 9 entries but msg has 10 rows"):
        mt.message.scatter(msg, torch.arange(9), 10)
    with pytest.raises(InputError, match=r"^scatter: index must be an integer tensor \[E\]"):
        mt.message.scatter(msg, torch.arange(10.0), 10)
    with pytest.raises(InputError, match=r"^scatter: reduce must be one of"):
        mt.message.scatter(msg, torch.arange(10), 10, "median")
    with pytest.raises(InputError, match=r"^softmax: index has 9 entries but src has 10 rows"):
        mt.message.softmax(torch.randn(10), torch.arange(9))
    index = torch.tensor([0, 0, 1, 2, 2, 2, 3, 1, 0, 3])
    y = mt.message.scatter(msg, index, 4)
    torch.testing.assert_close(y, torch.zeros(4, 3).index_add(0, index, msg))


def test_kernels_check_lengths_before_they_read():
    """Each launcher checks its arrays' lengths against each other in O(1): an array too
    short for the plan is an InputError, not a read past its end."""
    from mgg.kernels import cpu, cpu_nn

    ptr = np.array([0, 2, 3, 5], np.int64)
    perm = np.arange(5, dtype=np.int64)
    with pytest.raises(InputError, match=r"^segment_sum: values must be \[5, H\]"):
        cpu_nn.segment_sum(ptr, perm, np.ones((1, 4), np.float32), 3)
    with pytest.raises(InputError, match=r"^segment_sum: ptr must be \[5\] for 4 segments"):
        cpu_nn.segment_sum(ptr, perm, np.ones((5, 4), np.float32), 4)
    with pytest.raises(InputError, match=r"^segment_sum: values must be 2-D"):
        cpu_nn.segment_sum(ptr, perm, np.ones(5, np.float32), 3)
    np.testing.assert_array_equal(
        cpu_nn.segment_sum(ptr, perm, np.ones((5, 2), np.float32), 3), [[2, 2], [1, 1], [2, 2]]
    )
    idx = np.array([0, 1, 2, 0, 1], np.int32)
    with pytest.raises(InputError, match=r"^sddmm: a is 4 wide but b is 3"):
        cpu_nn.sddmm(ptr, idx, np.ones((3, 4), np.float32), np.ones((3, 3), np.float32), 1)
    with pytest.raises(InputError, match=r"^sddmm: indptr ends at 5 but indices has 4"):
        cpu_nn.sddmm(ptr, idx[:4], np.ones((3, 4), np.float32), np.ones((3, 4), np.float32), 1)
    lp, rp = ptr, np.zeros(4, np.int64)
    a = np.ones((3, 2), np.float32)
    with pytest.raises(InputError, match=r"^gat_softmax: src must be \[5\]"):
        cpu_nn.gat_softmax(lp, rp, perm[:4], a, a, 0.2)
    with pytest.raises(InputError, match=r"^gat_softmax: a_all has 1 heads, a_dst 2"):
        cpu_nn.gat_softmax(lp, rp, perm, a[:, :1], a, 0.2)
    alpha = cpu_nn.gat_softmax(lp, rp, np.array([0, 1, 2, 0, 1]), a, a, 0.2)
    with pytest.raises(InputError, match=r"^gat_softmax_backward: dalpha must be \[5, 2\]"):
        cpu_nn.gat_softmax_backward(lp, rp, perm, a, a, alpha, alpha[:4], 0.2)
    with pytest.raises(InputError, match=r"^edge_dropout: dst"):
        cpu_nn.edge_dropout(perm, perm[:4], 1, 5, 1, np.uint32(0), 1.0)
    node = np.array([0, 1, 2], np.int32)
    out = np.zeros((3, 4), np.float32)
    src = np.ones((3, 4), np.float32)
    with pytest.raises(InputError, match=r"^accumulate: src is 3 wide but out is 4"):
        cpu.accumulate(ptr, node, 0, 3, idx, None, src[:, :3], out)
    with pytest.raises(InputError, match=r"^accumulate: part_ptr ends at 5 but indices has 4"):
        cpu.accumulate(ptr, node, 0, 3, idx[:4], None, src, out)
    with pytest.raises(InputError, match=r"^accumulate: weights must be \[5\]"):
        cpu.accumulate(ptr, node, 0, 3, idx, np.ones(4, np.float32), src, out)
    with pytest.raises(InputError, match=r"^accumulate: partitions \[0, 4\) outside"):
        cpu.accumulate(ptr, node, 0, 4, idx, None, src, out)
    with pytest.raises(InputError, match=r"^aggregate_rows: x has 2 rows, out 3"):
        cpu.aggregate_rows("sum", ptr, node, idx, None, src[:2], out, 0.0, np.ones(3))
    with pytest.raises(InputError, match=r"^gather_rows: out has 2 rows for 3"):
        cpu.gather_rows(src, np.arange(3), out[:2])
    cpu.accumulate(ptr, node, 0, 3, idx, None, src, out)
    np.testing.assert_array_equal(out[:, 0], [2, 1, 2])


SEGFAULT_JOB = """
import torch
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
from mgg.errors import InputError
from mgg.graph.generators import rmat

class One(mt.MessagePassing):
    def message(self, x_j):
        return x_j[:1]  # one row for every edge: read past its end, once a segfault

comm = get_comm() if {ranks} > 1 else None
dg = DistGraph.build(rmat(16, 4, seed=1), comm)  # 65,536 nodes
try:
    One().propagate(dg, x=torch.randn(dg.num_local_nodes, 8))
except InputError as e:
    print("refused:", e, flush=True)
"""


def test_a_one_row_message_on_a_large_graph_is_refused_not_a_segfault(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(SEGFAULT_JOB.format(ranks=1))
    r = subprocess.run(
        [sys.executable, str(job)], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "refused: One.message must return a tensor [" in r.stdout
    assert "got shape (1, 8)" in r.stdout


@pytest.mark.mpi
def test_a_one_row_message_at_two_ranks_is_refused_on_each(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(SEGFAULT_JOB.format(ranks=2)))
    r = mpirun(2, "python", job, timeout=300, env={"MGG_PRINT_ALL": "1"})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("refused: One.message")]
    assert len(lines) == 2 and all("got shape (1, 8)" in ln for ln in lines), r.stdout[-2000:]


def test_every_refusal_here_is_an_mgg_error(dg):
    """ArgumentTypeError (a wrong type) is both: except TypeError and except MggError."""
    from mgg.torch.checks import ArgumentTypeError

    assert issubclass(ArgumentTypeError, MggError) and issubclass(ArgumentTypeError, TypeError)
    with pytest.raises(MggError):
        mt.GCNConv(FIN, 3)(torch.randn(N, FIN), None)


def test_ops_refuse_with_mgg_errors(dg):
    from mgg.torch.aggregation import gcn2

    x = torch.randn(N, FIN)
    with pytest.raises(InputError, match=r"^unknown aggregation op 'max'"):
        mt.aggregate(x, dg, "max")
    with pytest.raises(InputError, match=r"^eps goes with op 'gin'"):
        mt.aggregate(x, dg, "sum", eps=0.1)
    with pytest.raises(
        InputError, match=rf"^weights have 3 rows but rank 0 holds {edges(dg)} edges"
    ):
        mt.aggregate(x, dg, weights=torch.ones(3))
    with pytest.raises(InputError, match=rf"^gcn2: weight must be \[{FIN}, {FIN}\] .*\({FIN}, 5\)"):
        gcn2(x, x, torch.randn(FIN, 5), dg, "sum", 0.1, 0.5)
    with pytest.raises(InputError, match=r"^aggr must be one of"):
        mt.MessagePassing(aggr="median")
    sparse = mt.SparseRows(__import__("scipy.sparse").sparse.random(N, 30, 0.1, "csr", np.float32))
    with pytest.raises(MggError, match=r"^softmax on sparse input features"):
        torch.nn.functional.softmax(sparse, dim=-1)


def test_aggregate_and_halo_name_sparse_features_and_say_what_to_do(dg):
    import scipy.sparse as sp

    sparse = mt.SparseRows(sp.random(N, 30, 0.1, "csr", np.float32), dg)
    for who, call in (("aggregate", mt.aggregate), ("halo", mt.halo)):
        with pytest.raises(TypeError, match=rf"^{who}: x is sparse input features .*linear layer"):
            call(sparse, dg)
