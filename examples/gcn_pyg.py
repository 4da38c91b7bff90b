"""GCN on Cora with PyG: the script a PyG user starts from (gcn_mgg.py is its mgg twin).

python examples/gcn_pyg.py [DATASET.npz] [--epochs 200]
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

ap = argparse.ArgumentParser()
ap.add_argument("dataset", nargs="?", default="../shared/data/cora.npz")
ap.add_argument("--epochs", type=int, default=200)
args = ap.parse_args()

z = np.load(args.dataset)  # a CSR of in-edges, features, labels and the public split
dst = np.repeat(np.arange(z["indptr"].size - 1), np.diff(z["indptr"]))
edge_index = torch.from_numpy(np.stack([z["indices"], dst]).astype(np.int64))
x = torch.from_numpy(z["x"])
x = x / x.sum(1, keepdim=True).clamp(min=1)  # row-normalized features
y, train, test = (torch.from_numpy(z[k]) for k in ("y", "train_mask", "test_mask"))


class GCN(torch.nn.Module):
    def __init__(self, f, h, c):
        super().__init__()
        self.conv1 = GCNConv(f, h)
        self.conv2 = GCNConv(h, c)

    def forward(self, x, edge_index):
        x = F.dropout(x, 0.5, self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, 0.5, self.training)
        return self.conv2(x, edge_index)


torch.manual_seed(0)
model = GCN(x.shape[1], 16, int(y.max()) + 1)
opt = torch.optim.Adam(
    [
        dict(params=model.conv1.parameters(), weight_decay=5e-4),
        dict(params=model.conv2.parameters(), weight_decay=0.0),
    ],
    lr=0.01,
)
for epoch in range(args.epochs):
    model.train()
    opt.zero_grad()
    out = model(x, edge_index)
    loss = F.cross_entropy(out[train], y[train])
    loss.backward()
    opt.step()

model.eval()
pred = model(x, edge_index).argmax(1)
correct, total = int((pred == y)[test].sum()), int(test.sum())
print(f"loss {loss.item():.4f}  test accuracy {correct / total:.3f}")
