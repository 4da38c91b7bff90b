"""MixHop on Cora: PyG's examples/mixhop.py, on mgg.

    launch/mggrun -np 4 python examples/pyg/mixhop.py [--epochs 100]

The PyG twin of this script differs in the two import lines marked `# PyG:`
(bench/pyg_ports.py runs both and counts the lines). As in examples/pyg/gcn.py, both
read ../shared/data/cora.npz, take --epochs, print each epoch's loss (to 8 places), and
time the training step; the model and settings are PyG's.
"""

import argparse
import os.path as osp
import time

import torch
import torch.nn.functional as F

from mgg.pyg.datasets import Planetoid  # PyG: from torch_geometric.datasets import Planetoid
from mgg.pyg.nn import BatchNorm, Linear, MixHopConv  # noqa: E501, I001  # PyG: from torch_geometric.nn import BatchNorm, Linear, MixHopConv

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
args = parser.parse_args()

if torch.cuda.is_available():
    device = torch.device("cuda")
elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
    device = torch.device("mps")
else:
    device = torch.device("cpu")

path = osp.join(osp.dirname(osp.realpath(__file__)), "..", "..", "..", "shared", "data")
dataset = Planetoid(path, name="Cora")
data = dataset[0]


class MixHop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = MixHopConv(dataset.num_features, 60, powers=[0, 1, 2])
        self.norm1 = BatchNorm(3 * 60)

        self.conv2 = MixHopConv(3 * 60, 60, powers=[0, 1, 2])
        self.norm2 = BatchNorm(3 * 60)

        self.conv3 = MixHopConv(3 * 60, 60, powers=[0, 1, 2])
        self.norm3 = BatchNorm(3 * 60)

        self.lin = Linear(3 * 60, dataset.num_classes)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.7, training=self.training)

        x = self.conv1(x, edge_index)
        x = self.norm1(x)
        x = F.dropout(x, p=0.9, training=self.training)

        x = self.conv2(x, edge_index)
        x = self.norm2(x)
        x = F.dropout(x, p=0.9, training=self.training)

        x = self.conv3(x, edge_index)
        x = self.norm3(x)
        x = F.dropout(x, p=0.9, training=self.training)

        return self.lin(x)


model, data = MixHop().to(device), data.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.005)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=40, gamma=0.01)


def train():
    model.train()
    optimizer.zero_grad()
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    loss.backward()
    optimizer.step()
    scheduler.step()
    return float(loss)


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
        best_val_acc = val_acc
        test_acc = tmp_test_acc
    print(
        f"Epoch: {epoch:03d}, Loss: {loss:.8f}, Train: {train_acc:.4f}, "
        f"Val: {best_val_acc:.4f}, Test: {test_acc:.4f}"
    )
print(f"Median time per epoch: {torch.tensor(times[10:] or times).median():.6f}s")
