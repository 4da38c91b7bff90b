"""ARMA on Cora: PyG's examples/arma.py, on mgg.

    launch/mggrun -np 4 python examples/pyg/arma.py [--epochs 400]

The PyG twin of this script differs in the three import lines marked `# PyG:`
(bench/pyg_ports.py runs both and counts the lines). As in examples/pyg/gcn.py, both
read ../shared/data/cora.npz, take --epochs, print each epoch's loss, and time the
training step; the model and settings are PyG's.
"""

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F

import mgg.pyg.transforms as T  # PyG: import torch_geometric.transforms as T
from mgg.pyg.datasets import Planetoid  # PyG: from torch_geometric.datasets import Planetoid
from mgg.pyg.nn import ARMAConv  # PyG: from torch_geometric.nn import ARMAConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=400)
args = parser.parse_args()

dataset = "Cora"
path = osp.join(osp.dirname(osp.realpath(__file__)), "..", "..", "..", "shared", "data")
dataset = Planetoid(path, dataset, transform=T.NormalizeFeatures())
data = dataset[0]


class Net(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()

        self.conv1 = ARMAConv(
            in_channels,
            hidden_channels,
            num_stacks=3,
            num_layers=2,
            shared_weights=True,
            dropout=0.25,
        )

        self.conv2 = ARMAConv(
            hidden_channels,
            out_channels,
            num_stacks=3,
            num_layers=2,
            shared_weights=True,
            dropout=0.25,
            act=lambda x: x,
        )

    def forward(self, x, edge_index):
        x = F.dropout(x, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, training=self.training)
        x = self.conv2(x, edge_index)
        return F.log_softmax(x, dim=1)


if torch.cuda.is_available():
    device = torch.device("cuda")
elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
    device = torch.device("mps")
else:
    device = torch.device("cpu")

model, data = Net(dataset.num_features, 16, dataset.num_classes).to(device), data.to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = F.nll_loss(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def test():
    model.eval()
    out, accs = model(data.x, data.edge_index), []
    for _, mask in data("train_mask", "val_mask", "test_mask"):
        pred = out[mask].argmax(1)
        acc = pred.eq(data.y[mask]).sum().item() / mask.sum().item()
        accs.append(acc)
    return accs


best_val_acc = test_acc = 0
times = []
for epoch in range(1, args.epochs + 1):
    start = time.perf_counter()
    loss = train()
    times.append(time.perf_counter() - start)
    train_acc, val_acc, tmp_test_acc = test()
    if val_acc > best_val_acc:
        best_val_acc = val_acc
        test_acc = tmp_test_acc
    print(
        f"Epoch: {epoch:03d}, Loss: {loss:.8f}, Train: {train_acc:.4f}, "
        f"Val: {best_val_acc:.4f}, Test: {test_acc:.4f}"
    )
print(f"Median time per epoch: {torch.tensor(times[10:] or times).median():.6f}s")
