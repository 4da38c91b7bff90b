"""mgg's PyTorch front-end: bring your model.

Differentiable ops over the distributed graph (``aggregate``, ``halo``, ``all_reduce``,
GAT's ``attention``, rank-invariant ``dropout`` and ``edge_dropout``), PyG's
``MessagePassing`` and layers with PyG's signatures (GCNConv, SAGEConv, GINConv,
GATConv on mgg's kernels; GATv2Conv, GCN2Conv, APPNP, GINEConv, EdgeConv on
MessagePassing; BatchNorm/MLP whose statistics span every rank), ``Rows`` (a rank's
rows that reduce over every rank: global losses and metrics, gradients averaged at the
end of each backward) and ``DistributedModel``, ``sync_gradients`` for any torch.optim
optimizer (each averages the gradients over the ranks, as DistributedDataParallel),
``offloaded`` (what autograd saves kept in host memory until the backward pass: any
model's forward; mgg's set ``offload``), and the registered models.
"""

from .aggregation import aggregate, halo
from .checks import InputRows, check_rows
from .collectives import all_reduce, sync_gradients
from .dropouts import dropout, edge_dropout, edge_ids, edge_index
from .gat_softmax import attention
from .inputs import ChunkedRows, HostRows, SparseRows, as_features, linear
from .interop import as_array, as_tensor
from .layers import (
    APPNP,
    MLP,
    BatchNorm,
    EdgeConv,
    GATConv,
    GATv2Conv,
    GCN2Conv,
    GCNConv,
    GINConv,
    GINEConv,
    SAGEConv,
    pyg_widths,
)
from .message import MessagePassing, scatter, softmax
from .models import GAT, GCN, GIN, MODELS, SAGE, build_model, graph_kind
from .offload import Offloaded, offloaded
from .rows import DistributedModel, Rows
from .saved import load_model, save_model

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
    "ChunkedRows",
    "HostRows",
    "Offloaded",
    "offloaded",
    "InputRows",
    "GCNConv",
    "SAGEConv",
    "GINConv",
    "GATConv",
    "GATv2Conv",
    "GCN2Conv",
    "APPNP",
    "GINEConv",
    "EdgeConv",
    "MessagePassing",
    "scatter",
    "softmax",
    "Rows",
    "load_model",
    "save_model",
    "DistributedModel",
    "edge_ids",
    "BatchNorm",
    "MLP",
    "pyg_widths",
    "GCN",
    "SAGE",
    "GIN",
    "GAT",
    "MODELS",
    "build_model",
    "graph_kind",
]
