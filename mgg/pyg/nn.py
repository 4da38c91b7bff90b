"""``torch_geometric.nn``'s names in mgg: the layers over the distributed graph."""

from ..torch import (
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
    MessagePassing,
    SAGEConv,
)

__all__ = [
    "APPNP",
    "MLP",
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
