"""GCNII on Cora in PyG's idiom (its examples/gcn2_cora.py's model and settings: 64
layers of 64 channels), on mgg.

    launch/mggrun -np 4 python examples/pyg/gcn2_cora.py [--epochs 1000]

The PyG twin of this script differs in the three import lines marked `# PyG:`
(bench/pyg_ports.py runs both and counts the lines).
"""

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F
from torch.nn import Linear

import mgg.pyg.transforms as T  # PyG: import torch_geometric.transforms as T
from mgg.pyg.datasets import Planetoid  # PyG: from torch_geometric.datasets import Planetoid
from mgg.pyg.nn import GCN2Conv  # PyG: from torch_geometric.nn import GCN2Conv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1000)
parser.add_argument("--layers", type=int, default=64)
args = parser.parse_args()

path = osp.join(osp.dirname(osp.realpath(__file__)), "..", "..", "..", "shared", "data")
transform = T.Compose([T.NormalizeFeatures(), T.GCNNorm(), T.ToSparseTensor()])
dataset = Planetoid(path, "Cora", transform=transform)
data = dataset[0]


class Net(torch.nn.Module):
    def __init__(self, hidden_channels, num_layers, alpha, theta, dropout=0.0):
        super().__init__()
        self.lins = torch.nn.ModuleList()
        self.lins.append(Linear(dataset.num_features, hidden_channels))
        self.lins.append(Linear(hidden_channels, dataset.num_classes))
        self.convs = torch.nn.ModuleList()
        for layer in range(num_layers):
            self.convs.append(
                GCN2Conv(hidden_channels, alpha, theta, layer + 1, True, normalize=False)
            )
        self.dropout = dropout

    def forward(self, x, adj_t):
        x = F.dropout(x, self.dropout, training=self.training)
        x = x_0 = self.lins[0](x).relu()
        for conv in self.convs:
            x = F.dropout(x, self.dropout, training=self.training)
            x = conv(x, x_0, adj_t).relu()
        x = F.dropout(x, self.dropout, training=self.training)
        return self.lins[1](x).log_softmax(dim=-1)


torch.manual_seed(0)
model = Net(hidden_channels=64, num_layers=args.layers, alpha=0.1, theta=0.5, dropout=0.6)
optimizer = torch.optim.Adam(
    [
        dict(params=model.convs.parameters(), weight_decay=0.01),
        dict(params=model.lins.parameters(), weight_decay=5e-4),
    ],
    lr=0.01,
)


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.adj_t)
    loss = F.nll_loss(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def test():
    model.eval()
    pred, accs = model(data.x, data.adj_t).argmax(dim=-1), []
    for _, mask in data("train_mask", "val_mask", "test_mask"):
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
        f"Epoch: {epoch:04d}, Loss: {loss:.8f}, Train: {train_acc:.4f}, "
        f"Val: {val_acc:.4f}, Test: {test_acc:.4f}"
    )
print(f"Median time per epoch: {torch.tensor(times[10:] or times).median():.6f}s")
