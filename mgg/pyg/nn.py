"""``torch_geometric.nn``'s names in mgg: the layers over the distributed graph (mgg's
MLP, whose signature is not PyG's, stays in mgg.torch)."""

from ..torch import (
    APPNP,
    BatchNorm,
    EdgeConv,
    GATConv,
    GATv2Conv,
    GCN2Conv,
    GCNConv,
    GINConv,
    GINEConv,
    MessagePassing,
    SAGEConv,
)

__all__ = [
    "APPNP",
    "BatchNorm",
    "EdgeConv",
    "GATConv",
    "GATv2Conv",
    "GCN2Conv",
    "GCNConv",
    "GINConv",
    "GINEConv",
    "MessagePassing",
    "SAGEConv",
]
