"""``torch_geometric.nn``'s names in mgg: mgg's fused layers (convs.FUSED, mgg.torch's
kernels), PyG's own conv classes over the distributed graph (convs.RUNS, through
convs.distributed), and ``MessagePassing``, PyG's base class distributed, for a user's
own layer. A layer in convs.REFUSED raises at import, with its reason."""

from __future__ import annotations

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
    SAGEConv,
)
from .convs import REFUSED, RUNS, distributed, refused

_PASSED = ("Linear", "JumpingKnowledge")  # PyG's, unchanged: row-wise over this rank's rows


def __getattr__(name: str):
    import torch_geometric.nn as tgnn

    if name == "MessagePassing" or name in RUNS:
        cls = distributed(getattr(tgnn, name))
    elif name in _PASSED:
        cls = getattr(tgnn, name)
    elif name in REFUSED:
        raise refused(name)
    else:
        raise AttributeError(
            f"mgg.pyg.nn has no {name!r}: it has {', '.join(__all__)} (docs/pyg.md)"
        )
    globals()[name] = cls
    return cls


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
    "SAGEConv",
    "MessagePassing",  # noqa: F822 (made on first use: __getattr__)
    *RUNS,
    *_PASSED,
]
