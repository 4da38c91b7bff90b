"""Full-graph node classification models over mgg layers, and the registry the CLI uses.

A model is a torch.nn.Module with ``forward(x, g)`` -> logits [n, classes] over this
rank's rows, a ``graph`` attribute (the graph its layers expect: 'gcn_norm',
'self_loops', 'no_self_loops' or 'as_is') and ``param_groups(weight_decay)``. Register a
new one in MODELS with its defaults to train it with ``mgg train --model NAME``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import nn

from ..graph.core import GRAPH_KINDS
from .chunks import INPUT_CHUNKS, STREAM_MIN_ROWS, reads_in_chunks
from .dropouts import dropout
from .inputs import ChunkedRows
from .layers import MLP, GATConv, GCNConv, GINConv, SAGEConv
from .offload import offloaded
from .recompute import recompute


def _dims(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[int]:
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if hidden < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")
    return [in_dim] + [hidden] * (num_layers - 1) + [out_dim]


class Model(nn.Module):
    """What every model here shares: [dropout -> conv -> activation] x (L-1) -> dropout ->
    conv, with dropout ``p_in`` on the input features and ``p`` between layers.
    ``recompute``: in training, each conv with its activation keeps only its input and
    runs again in the backward pass (mgg.torch.recompute). ``offload``: in training,
    what the backward pass needs waits for it in host memory (mgg.torch.offload; the
    last forward's counts in ``offloaded``).

    In training, large dense input features are read a chunk at a time (ChunkedRows:
    dropout and the first GEMM per chunk, no dropped-out copy of every row) where the first
    layer multiplies them first anyway (or could, recomputing: _chunked)."""

    graph = "as_is"
    act = staticmethod(F.relu)
    offloaded = None  # what the last forward in training kept in host memory (Offloaded)
    picks_rows = False  # its last layer can compute some rows alone (forward's rows=)
    pyg_order = False  # its layers aggregate where PyG's do (pyg_widths): no ChunkedRows

    def __init__(self, *, recompute: bool = False, offload: bool = False):
        super().__init__()
        self.recompute, self.offload = bool(recompute), bool(offload)

    def forward(self, x, g, upto: int | None = None, rows=None):
        """Logits [n, classes] over this rank's rows; with ``upto`` = K, the output of
        layer K (1-based; after its activation unless it is the last): embeddings.
        ``rows``: g restricted to some rows R (g.restricted): the last layer computes
        only rows R, over their in-edges only: logits [L, classes]."""
        if rows is not None:
            check_rows_of(self, g, rows, upto)
        convs = self.convs[:upto]
        if self.training and convs and _chunked(convs[0], x, self.recompute, self.pyg_order):
            x = ChunkedRows(x, g, max(STREAM_MIN_ROWS, -(-x.shape[0] // INPUT_CHUNKS)))
        if self.offload and self.training and torch.is_grad_enabled():
            with offloaded(g, keep=[x, *self.parameters()]) as self.offloaded:
                return self._layers(x, g, convs, rows)
        return self._layers(x, g, convs, rows)

    def _layers(self, x, g, convs, rows):
        last = len(self.convs) - 1
        for i, conv in enumerate(convs):
            x = dropout(x, g, self.p if i else self.p_in, self.training)

            def layer(h, conv=conv, i=i):
                y = conv(h, rows if rows is not None and i == last else g)
                return y if i == last else self.act(y)

            x = recompute(layer, x, conv, g) if self.recompute and self.training else layer(x)
        return x

    def param_groups(self, weight_decay: float) -> list[dict]:
        """Optimizer parameter groups: L2 weight decay on every parameter."""
        return [{"params": list(self.parameters()), "weight_decay": weight_decay}]


def _chunked(conv, x, recompute: bool, pyg_order: bool) -> bool:
    """Whether the first layer ``conv`` reads the input x as ChunkedRows: x is a plain
    dense tensor without a gradient, and reads_in_chunks says so by its bytes
    and conv's multiplies_first; never in PyG's order (``pyg_order``: pyg_widths)."""
    if type(x) is not torch.Tensor or x.ndim != 2 or x.requires_grad or pyg_order:
        return False
    takes = getattr(conv, "multiplies_first", None)
    first = None if takes is None else takes(x.shape[1])
    return reads_in_chunks(first, recompute, x.element_size() * x.numel())


def check_rows_of(model, g, rows, upto) -> None:
    """ValueError unless ``model``'s last layer can compute only the rows of ``rows`` (g
    restricted: DistGraph.restricted) and ``upto`` leaves it the last."""
    convs = getattr(model, "convs", None)
    if not convs:
        raise ValueError(
            f"{type(model).__name__} is not an mgg.torch Model (its convs computed in turn): "
            "only those compute the labeled rows alone"
        )
    last = convs[-1]
    if rows.full is not g:
        raise ValueError("rows= must be the job's graph restricted to some rows: g.restricted")
    if upto is not None and upto != len(convs):
        raise ValueError(f"rows= computes the last layer's rows; upto={upto} stops before it")
    if not getattr(last, "picks_rows", False):
        raise ValueError(
            f"{type(model).__name__}'s last layer ({type(last).__name__}) computes every row; "
            "only GCNConv and SAGEConv compute the labeled rows alone"
        )


class GCN(Model):
    """Kipf & Welling: [dropout -> GCNConv -> ReLU] x (L-1) -> dropout -> GCNConv.
    Weight decay on the first layer only, as the original (MGG §5: 2 x 16)."""

    graph = "gcn_norm"
    picks_rows = True

    def __init__(self, in_dim, hidden, out_dim, *, num_layers=2, dropout=0.5, **mode):
        super().__init__(**mode)
        d = _dims(in_dim, hidden, out_dim, num_layers)
        self.convs = nn.ModuleList(GCNConv(a, b) for a, b in pairwise(d))
        self.p = self.p_in = dropout

    def param_groups(self, weight_decay):
        first = list(self.convs[0].parameters())
        rest = [p for c in self.convs[1:] for p in c.parameters()]
        return [
            {"params": first, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ]


class SAGE(Model):
    """GraphSAGE (mean): [dropout -> SAGEConv -> ReLU] x (L-1) -> dropout -> SAGEConv."""

    graph = "as_is"
    picks_rows = True

    def __init__(self, in_dim, hidden, out_dim, *, num_layers=2, dropout=0.5, **mode):
        super().__init__(**mode)
        d = _dims(in_dim, hidden, out_dim, num_layers)
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in pairwise(d))
        self.p = self.p_in = dropout


class GIN(Model):
    """GIN (Xu et al.): GINConv layers whose MLPs (Linear -> BatchNorm -> ReLU -> Linear)
    normalize over every rank's rows; ReLU and dropout between layers, and dropout of
    ``input_dropout`` on the input features (bag-of-words features overfit without it:
    Cora 0.70 at 0.5, 0.76 at 0.9; dense features want less: the products stand-in 0.91
    at 0.5, 0.84 at 0.8 after 60 epochs). The norms evaluate with the whole graph's
    statistics, as they train, not running ones: gathered under dropout, these misjudge
    the evaluation's rows (amazon_computers, seeds 0-9: test 70.9 ± 9.5 with running
    statistics, down to 52 on one seed; 77.6 ± 3.5 with the graph's)."""

    graph = "no_self_loops"

    def __init__(
        self,
        in_dim,
        hidden,
        out_dim,
        *,
        num_layers=2,
        dropout=0.5,
        input_dropout=0.9,
        train_eps=True,
        batch_norm=True,
        **mode,
    ):
        super().__init__(**mode)
        d = _dims(in_dim, hidden, out_dim, num_layers)
        self.convs = nn.ModuleList(
            GINConv(MLP([a, hidden, b], batch_norm, running_stats=False), train_eps=train_eps)
            for a, b in pairwise(d)
        )
        self.p, self.p_in = dropout, input_dropout


class GAT(Model):
    """Veličković et al.: dropout -> GATConv(heads x hidden, concat) -> ELU -> ... ->
    dropout -> GATConv(out, 1 head); attention dropout as the input dropout."""

    graph = "self_loops"
    act = staticmethod(F.elu)

    def __init__(self, in_dim, hidden, out_dim, *, num_layers=2, dropout=0.6, heads=8, **mode):
        super().__init__(**mode)
        d = _dims(in_dim, hidden, out_dim, num_layers)
        convs = []
        for i in range(num_layers):
            last = i == num_layers - 1
            width = d[i] if i == 0 else d[i] * heads
            convs.append(
                GATConv(
                    width, d[i + 1], heads=1 if last else heads, concat=not last, dropout=dropout
                )
            )
        self.convs = nn.ModuleList(convs)
        self.p = self.p_in = dropout


@dataclass(frozen=True)
class Spec:
    """A registered model and its defaults (the paper's settings where there is one)."""

    cls: type
    hidden: int
    layers: int
    dropout: float
    lr: float
    weight_decay: float
    heads: int = 1  # attention heads of the hidden layers (the class's default)
    # what mgg.memory's estimate counts per layer (measured: bench/memory_estimate.py)
    copies: int = 6  # [nodes, hidden] tensors held at the peak: kept, grads, temporaries
    offload_copies: int = 4  # those a device holds with --offload (bench/offload.py)
    # its output layer for the labeled rows (--output-rows labeled): the [nodes, width]
    # tensors it holds over every row (bench/offload.py on papers100m, bf16)
    picked_copies: int = 2
    edge_floats: int = 0  # per edge and head (attention)


# the GCN paper's training settings (Kipf & Welling), which SAGE and GIN take too
KIPF_WELLING = dict(layers=2, dropout=0.5, lr=0.01, weight_decay=5e-4)
MODELS = {
    "gcn": Spec(GCN, hidden=16, **KIPF_WELLING),
    # picked_copies: the root's rows and the aggregation's, both scattered back
    "sage": Spec(SAGE, hidden=16, copies=9, offload_copies=5, picked_copies=5, **KIPF_WELLING),
    "gin": Spec(GIN, hidden=64, copies=25, offload_copies=6, **KIPF_WELLING),
    "gat": Spec(
        GAT,
        hidden=8,
        layers=2,
        dropout=0.6,
        lr=0.005,
        weight_decay=5e-4,
        heads=8,
        copies=9,
        edge_floats=13,
    ),
}


def graph_kind(model: str) -> str:
    """The graph kind (mgg.graph.core.GRAPH_KINDS) a registered model's layers expect, or
    a graph kind itself."""
    if model in MODELS:
        return MODELS[model].cls.graph
    if model in GRAPH_KINDS:
        return model
    raise ValueError(
        f"unknown model {model!r}; choose one of {', '.join(MODELS)} "
        f"(or a graph kind: {', '.join(GRAPH_KINDS)})"
    )


def build_model(
    name: str,
    in_dim: int,
    out_dim: int,
    *,
    hidden: int | None = None,
    layers: int | None = None,
    dropout: float | None = None,
    seed: int = 0,
    recompute: bool = False,
    offload: bool = False,
    **kw,
) -> nn.Module:
    """A registered model with its defaults where an argument is None; the weights are
    drawn from ``seed`` (the same on every rank). ``recompute``, ``offload``: how it holds
    what training saves (Model), not part of its ``config``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    spec = MODELS[name]
    hidden = spec.hidden if hidden is None else hidden
    layers = spec.layers if layers is None else layers
    dropout = spec.dropout if dropout is None else dropout
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mode = dict(recompute=recompute, offload=offload)
        model = spec.cls(in_dim, hidden, out_dim, num_layers=layers, dropout=dropout, **mode, **kw)
    model.config = {
        "model": name,
        "in_dim": in_dim,
        "hidden": hidden,
        "out_dim": out_dim,
        "num_layers": layers,
        "dropout": dropout,
        "seed": seed,
        **kw,
    }
    return model
