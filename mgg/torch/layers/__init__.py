"""Layers with PyG's signatures over the distributed graph, one family a module: gcn
(GCNConv, GCN2Conv, APPNP), sage (SAGEConv), gin (GINConv, GINEConv), gat (GATConv,
GATv2Conv), edge (EdgeConv), norm (BatchNorm, MLP); base: what they share.

A layer's ``forward(x, g)`` takes this rank's rows x [n, in] (a tensor, or InputRows for
input features: SparseRows, ChunkedRows) and the job's DistGraph g, and returns [n, out].
Autograd does the rest: each aggregation's backward runs over the transposed plan.
Parameter names follow PyG, so ``layer.load_state_dict(pyg_layer.state_dict())`` works.

Writing a new layer: subclass MessagePassing (PyG's contract: mgg.torch.message), or
torch.nn.Module with ``forward(x, g)`` (first ``check_graph(g, name)``, as every layer
here, so a wrong ``g`` is named; ``rows_io`` on forward keeps Rows Rows); move rows with
``linear`` (dense or sparse input), aggregate them with ``aggregate(x, g, op)`` (op 'sum',
'mean', 'gcn') or with per-edge weights ``aggregate(x, g, weights=w)`` (w [E] or [E, H]
over ``edge_index(g)``), reach neighbors' per-node values with ``halo``, reduce across
ranks with ``all_reduce``; set ``kinds`` to the graph kinds the layer runs on
('gcn_norm', 'self_loops', 'no_self_loops', 'as_is'; ``edges(g)`` derives the first
when g is another); give it a module of its own here, with a docstring of its formula,
``Args:`` and ``Shapes:``; register a model using it in mgg.torch.models.MODELS for the
CLI.
"""

from .base import pyg_widths
from .edge import EdgeConv
from .gat import GATConv, GATv2Conv
from .gcn import APPNP, GCN2Conv, GCNConv
from .gin import GINConv, GINEConv
from .norm import MLP, BatchNorm
from .sage import SAGEConv

__all__ = [
    "GCNConv",
    "SAGEConv",
    "GINConv",
    "GATConv",
    "GATv2Conv",
    "GCN2Conv",
    "APPNP",
    "GINEConv",
    "EdgeConv",
    "BatchNorm",
    "MLP",
    "pyg_widths",
]
