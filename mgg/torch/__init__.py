"""mgg's PyTorch front-end: bring your model.

Differentiable ops over the distributed graph (``aggregate``, ``halo``, ``all_reduce``,
GAT's ``attention``, rank-invariant ``dropout`` and ``edge_dropout``), layers with PyG's signatures
(GCNConv, SAGEConv, GINConv, GATConv, and BatchNorm/MLP whose statistics span every
rank), ``sync_gradients`` for any torch.optim optimizer, and the registered models.
"""

from .layers import (
    MLP,
    BatchNorm,
    GATConv,
    GCNConv,
    GINConv,
    SAGEConv,
    edge_softmax,
    pyg_widths,
)
from .models import GAT, GCN, GIN, MODELS, SAGE, build_model, graph_kind
from .ops import (
    SparseRows,
    aggregate,
    all_reduce,
    as_array,
    as_features,
    as_tensor,
    attention,
    check_rows,
    dropout,
    edge_dropout,
    edge_index,
    halo,
    linear,
    sync_gradients,
)

__all__ = [
    "aggregate",
    "halo",
    "all_reduce",
    "attention",
    "dropout",
    "edge_dropout",
    "edge_index",
    "linear",
    "sync_gradients",
    "check_rows",
    "as_array",
    "as_features",
    "as_tensor",
    "SparseRows",
    "GCNConv",
    "SAGEConv",
    "GINConv",
    "GATConv",
    "BatchNorm",
    "MLP",
    "edge_softmax",
    "pyg_widths",
    "GCN",
    "SAGE",
    "GIN",
    "GAT",
    "MODELS",
    "build_model",
    "graph_kind",
]
