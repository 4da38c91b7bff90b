"""PyG twins of mgg's registered models (mgg.torch.MODELS) with their defaults: the peer
that bench/train_vs_pyg.py and bench/gpu/e2e_vs_pyg.py time mgg against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def pyg_model(name: str, f: int, c: int) -> nn.Module:
    """GCN 2 x 16 (cached), SAGE 2 x 16 (mean), GIN 2 x 64 (MLPs with batch norm,
    input dropout 0.9), GAT 8 heads x 8 hidden (dropout 0.6), as mgg's defaults."""
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    def mlp(a, b):
        return nn.Sequential(nn.Linear(a, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, b))

    convs, act, p_in, p = {
        "gcn": ([GCNConv(f, 16, cached=True), GCNConv(16, c, cached=True)], F.relu, 0.5, 0.5),
        "sage": ([SAGEConv(f, 16), SAGEConv(16, c)], F.relu, 0.5, 0.5),
        "gin": (
            [GINConv(mlp(f, 64), train_eps=True), GINConv(mlp(64, c), train_eps=True)],
            F.relu,
            0.9,
            0.5,
        ),
        "gat": (
            [
                GATConv(f, 8, heads=8, dropout=0.6),
                GATConv(64, c, heads=1, concat=False, dropout=0.6),
            ],
            F.elu,
            0.6,
            0.6,
        ),
    }[name]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList(convs)

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(F.dropout(x, p if i else p_in, self.training), edge_index)
                if i < len(self.convs) - 1:
                    x = act(x)
            return x

    return Net()


def pyg_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """Adam with mgg's defaults: lr 0.01 (GAT 0.005), weight decay 5e-4 (GCN: first layer)."""
    if name == "gcn":
        first = list(model.convs[0].parameters())
        rest = [q for conv in model.convs[1:] for q in conv.parameters()]
        groups = [{"params": first, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0}]
    else:
        groups = [{"params": list(model.parameters()), "weight_decay": 5e-4}]
    return torch.optim.Adam(groups, lr=0.005 if name == "gat" else 0.01)
