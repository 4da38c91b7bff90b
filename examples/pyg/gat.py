"""GAT on Cora in PyG's idiom (its examples/gat.py's model and settings), on mgg.

    launch/mggrun -np 4 python examples/pyg/gat.py [--epochs 200]

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
from mgg.pyg.nn import GATConv  # PyG: from torch_geometric.nn import GATConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=200)
args = parser.parse_args()

path = osp.join(osp.dirname(osp.realpath(__file__)), "..", "..", "..", "shared", "data")
dataset = Planetoid(path, "Cora", transform=T.NormalizeFeatures())
data = dataset[0]


class Net(torch.nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv1 = GATConv(in_channels, 8, heads=8, dropout=0.6)
        self.conv2 = GATConv(8 * 8, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        x = self.conv2(x, edge_index)
        return F.log_softmax(x, dim=-1)


torch.manual_seed(0)
model = Net(dataset.num_features, dataset.num_classes)
optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = F.nll_loss(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def test():
    model.eval()
    out, accs = model(data.x, data.edge_index), []
    for _, mask in data("train_mask", "val_mask", "test_mask"):
        accs.append(float((out[mask].argmax(-1) == data.y[mask]).sum() / mask.sum()))
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
