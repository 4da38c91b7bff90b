"""GCN on Cora in PyG's idiom (its examples/gcn.py's model and settings), on mgg.

    launch/mggrun -np 4 python examples/pyg/gcn.py [--epochs 200]

The PyG twin of this script differs in the three import lines marked `# PyG:`
(bench/pyg_ports.py runs both and counts the lines).
"""

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F

import mgg.pyg.transforms as T  # PyG: import torch_geometric.transforms as T
from mgg.pyg.datasets import Planetoid  # PyG: from torch_geometric.datasets import Planetoid
from mgg.pyg.nn import GCNConv  # PyG: from torch_geometric.nn import GCNConv

parser = argparse.ArgumentParser()
parser.add_argument("--hidden_channels", type=int, default=16)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--epochs", type=int, default=200)
args = parser.parse_args()

path = osp.join(osp.dirname(osp.realpath(__file__)), "..", "..", "..", "shared", "data")
dataset = Planetoid(path, "Cora", transform=T.NormalizeFeatures())
data = dataset[0]


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels, cached=True)
        self.conv2 = GCNConv(hidden_channels, out_channels, cached=True)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


torch.manual_seed(0)
model = GCN(dataset.num_features, args.hidden_channels, dataset.num_classes)
optimizer = torch.optim.Adam(
    [
        dict(params=model.conv1.parameters(), weight_decay=5e-4),
        dict(params=model.conv2.parameters(), weight_decay=0),
    ],
    lr=args.lr,
)  # weight decay on the first layer only


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def test():
    model.eval()
    pred = model(data.x, data.edge_index).argmax(dim=-1)
    accs = []
    for mask in [data.train_mask, data.val_mask, data.test_mask]:
        accs.append(int((pred[mask] == data.y[mask]).sum()) / int(mask.sum()))
    return accs


best_val_acc = test_acc = 0
times = []
for epoch in range(1, args.epochs + 1):
    start = time.perf_counter()
    loss = train()
    times.append(time.perf_counter() - start)
    train_acc, val_acc, tmp_test_acc = test()
    if val_acc > best_val_acc:
        best_val_acc, test_acc = val_acc, tmp_test_acc
    print(
        f"Epoch: {epoch:03d}, Loss: {loss:.8f}, Train: {train_acc:.4f}, "
        f"Val: {val_acc:.4f}, Test: {test_acc:.4f}"
    )
print(f"Median time per epoch: {torch.tensor(times[10:] or times).median():.6f}s")
