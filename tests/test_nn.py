import numpy as np
import pytest
import scipy.sparse as sp

from mgg.distgraph import DistGraph
from mgg.graph import Graph
from mgg.nn import GCN, GIN, Adam, GCNConv, GINConv, softmax_cross_entropy
from mgg.nn.layers import Dropout

from conftest import random_graph


def tiny(rng, n=14, e=50, directed=True):
    g = random_graph(rng, n, e, self_loops=False).dedup()
    return g if directed else g.symmetrize()


def loss_of(model, x, g, y, mask):
    return softmax_cross_entropy(model.forward(x, g), y, mask)[0]


def check_grads(model, x, g, y, mask, h=1e-6, tol=1e-6):
    # move every parameter off zero: a bias of exactly 0 can put a pre-activation on the
    # ReLU kink, where a central difference is meaningless
    rng = np.random.default_rng(7)
    for p in model.parameters():
        p.value += 0.1 * rng.standard_normal(p.value.shape)
    model.zero_grad()
    logits = model.forward(x, g)
    _, dlogits, _, _ = softmax_cross_entropy(logits, y, mask)
    model.backward(dlogits)
    checked = 0
    for name, p in model.named_parameters().items():
        flat, grad = p.value.reshape(-1), p.grad.reshape(-1)
        for i in range(0, flat.size, max(1, flat.size // 7)):
            old = flat[i]
            flat[i] = old + h
            up = loss_of(model, x, g, y, mask)
            flat[i] = old - h
            down = loss_of(model, x, g, y, mask)
            flat[i] = old
            fd = (up - down) / (2 * h)
            assert abs(fd - grad[i]) <= tol * max(1.0, abs(fd)), (name, i, fd, grad[i])
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("directed", [True, False])
@pytest.mark.parametrize("in_dim, hidden", [(9, 4), (3, 6)])  # transform- or aggregate-first
def test_gcn_gradients_match_finite_differences(rng, directed, in_dim, hidden):
    g0 = tiny(rng, directed=directed)
    g = DistGraph.build(g0.gcn_norm(), None, ps=2, dtype=np.float64)
    x = rng.standard_normal((g0.num_nodes, in_dim))
    y = rng.integers(0, 3, g0.num_nodes)
    mask = rng.random(g0.num_nodes) < 0.7
    model = GCN(in_dim, hidden, 3, num_layers=3, dropout=0.3, dtype=np.float64)
    model.layers[1].input_grad = True  # also check the input gradient path
    check_grads(model, x, g, y, mask)


@pytest.mark.parametrize("directed", [True, False])
@pytest.mark.parametrize("in_dim, hidden", [(9, 4), (3, 6)])
def test_gin_gradients_match_finite_differences(rng, directed, in_dim, hidden):
    g0 = tiny(rng, directed=directed)
    g = DistGraph.build(g0, None, ps=3, dtype=np.float64)
    x = rng.standard_normal((g0.num_nodes, in_dim))
    y = rng.integers(0, 3, g0.num_nodes)
    mask = rng.random(g0.num_nodes) < 0.7
    model = GIN(in_dim, hidden, 3, num_layers=3, dropout=0.2, train_eps=True, dtype=np.float64)
    check_grads(model, x, g, y, mask)


def test_transform_first_equals_aggregate_first(rng):
    g0 = tiny(rng, n=30, e=120)
    for conv, gg in (
        (GCNConv(5, 5, rng=np.random.default_rng(1), dtype=np.float64), g0.gcn_norm()),
        (GINConv(5, 5, 5, eps=0.3, rng=np.random.default_rng(1), dtype=np.float64), g0),
    ):
        g = DistGraph.build(gg, None, dtype=np.float64)
        x = rng.standard_normal((30, 5))
        a = conv.forward(x, g)
        conv.in_dim = 6  # pretend the input is wider: the layer now transforms first
        assert conv.transform_first(x)
        b = conv.forward(x, g)
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_gcn_layer_equals_dense_formula(rng):
    g0 = tiny(rng, n=25, e=90, directed=False)
    g = DistGraph.build(g0.gcn_norm(), None, dtype=np.float64)
    conv = GCNConv(4, 3, dtype=np.float64)
    conv.bias.value[:] = [0.1, -0.2, 0.3]
    x = rng.standard_normal((25, 4))
    a = (g0.to_scipy().toarray() != 0).astype(float) + np.eye(25)
    d = a.sum(1)
    ahat = a / np.sqrt(np.outer(d, d))
    # the graph's edge weights are float32
    np.testing.assert_allclose(
        conv.forward(x, g), ahat @ x @ conv.weight.value + conv.bias.value, rtol=1e-6, atol=1e-7
    )


class _NoDense(sp.csr_matrix):
    """A CSR matrix that fails the test when anything densifies it."""

    def toarray(self, *a, **k):
        raise AssertionError("sparse features were densified")

    todense = toarray

    def __array__(self, *a, **k):
        raise AssertionError("sparse features were densified")


def test_sparse_features_are_never_densified(rng):
    g0 = tiny(rng, n=40, e=150)
    g = DistGraph.build(g0.gcn_norm(), None, dtype=np.float64)
    xs = sp.random(40, 500, density=0.02, format="csr", random_state=0)
    x = _NoDense(xs)
    y, mask = rng.integers(0, 3, 40), np.ones(40, bool)

    def grads(model, feats):
        model.zero_grad()
        _, dl, _, _ = softmax_cross_entropy(model.forward(feats, g), y, mask)
        model.backward(dl)
        return {k: p.grad.copy() for k, p in model.named_parameters().items()}

    # forward and backward (dropout on the features, dW = x.T @ dt) stay sparse...
    model = GCN(500, 8, 3, dropout=0.5, dtype=np.float64)
    got = grads(model, x)
    assert sp.issparse(model.layers[0].forward(x, g))
    # ...and give the gradients of the same model on the dense features
    want = grads(GCN(500, 8, 3, dropout=0.5, dtype=np.float64), xs.toarray())
    assert set(got) == set(want)
    for k in got:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert np.abs(got["layers.1.weight"]).sum() > 0


class _Rows:
    """Stands in for a DistGraph: only the first global row matters to dropout."""

    def __init__(self, lb):
        self.lb = lb


def test_dropout_masks_do_not_depend_on_the_split():
    x = np.ones((1000, 7), np.float32)
    drop = Dropout(0.3, seed=5, stream=2)
    whole = drop.forward(x, _Rows(0))
    parts = np.vstack(
        [drop.forward(x[a:b], _Rows(a)) for a, b in ((0, 17), (17, 600), (600, 1000))]
    )
    assert np.array_equal(whole, parts)
    assert abs((whole == 0).mean() - 0.3) < 0.03 and set(np.unique(whole)) == {
        0,
        np.float32(1 / 0.7),
    }
    drop.epoch = 1
    assert not np.array_equal(whole, drop.forward(x, _Rows(0)))
    # sparse input: an entry survives exactly when it does in the dense case
    xs = sp.random(1000, 7, density=0.5, format="csr", random_state=1, dtype=np.float32)
    drop.epoch = 0
    np.testing.assert_allclose(
        drop.forward(xs, _Rows(0)).toarray(), drop.forward(xs.toarray(), _Rows(0)), rtol=1e-6
    )


def test_adam_reduces_the_loss(rng):
    g0 = tiny(rng, n=60, e=300, directed=False)
    g = DistGraph.build(g0.gcn_norm(), None)
    x = rng.standard_normal((60, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int)
    model = GCN(6, 8, 2, dropout=0.0)
    opt = Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        model.zero_grad()
        loss, dl, _, _ = softmax_cross_entropy(model.forward(x, g), y, np.ones(60, bool))
        model.backward(dl)
        opt.step()
        losses.append(loss)
    assert losses[-1] < 0.7 * losses[0]


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="dropout"):
        GCN(4, 4, 2, dropout=1.0)
    with pytest.raises(ValueError, match="num_layers"):
        GIN(4, 4, 2, num_layers=0)
    with pytest.raises(ValueError, match="learning rate"):
        Adam([], lr=0)
    g = Graph.from_edges([0], [1], 2)
    with pytest.raises(ValueError, match="plan is for"):
        from mgg.partition import build_plan

        DistGraph(build_plan(g, 2, rank=0), None)
