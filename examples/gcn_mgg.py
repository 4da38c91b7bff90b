"""GCN on Cora with mgg: gcn_pyg.py, trained full-graph across ranks.

launch/mggrun -np 4 python examples/gcn_mgg.py [DATASET.npz] [--epochs 200]
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from mgg.comm import get_comm
from mgg.graph.formats import read_npz
from mgg.torch import GCNConv, dropout, sync_gradients
from mgg.train import prepare

ap = argparse.ArgumentParser()
ap.add_argument("dataset", nargs="?", default="../shared/data/cora.npz")
ap.add_argument("--epochs", type=int, default=200)
args = ap.parse_args()

comm = get_comm()  # this rank's graph: its nodes' rows, their in-edges (GCN-normalized)
g, data = prepare(read_npz(args.dataset), comm, "gcn_norm", row_normalize=True)
x, y, train, test = data.x, data.y, data.train_mask, data.test_mask
num_train = comm.allreduce(np.array([float(train.sum())]))[0]  # over every rank


class GCN(torch.nn.Module):
    def __init__(self, f, h, c):
        super().__init__()
        self.conv1 = GCNConv(f, h)
        self.conv2 = GCNConv(h, c)

    def forward(self, x, g):
        x = dropout(x, g, 0.5, self.training)
        x = F.relu(self.conv1(x, g))
        x = dropout(x, g, 0.5, self.training)
        return self.conv2(x, g)


torch.manual_seed(0)
model = GCN(data.num_features, 16, data.num_classes)
opt = torch.optim.Adam(
    [
        dict(params=model.conv1.parameters(), weight_decay=5e-4),
        dict(params=model.conv2.parameters(), weight_decay=0.0),
    ],
    lr=0.01,
)
for epoch in range(args.epochs):
    model.train()
    g.begin_step(epoch)  # keys this step's dropout masks (the same on every rank count)
    opt.zero_grad()
    out = model(x, g)
    loss = F.cross_entropy(out[train], y[train], reduction="sum") / num_train
    loss.backward()
    sync_gradients(model.parameters(), comm)
    opt.step()

model.eval()
pred = model(x, g).argmax(1)
loss, correct, total = comm.allreduce(
    np.array([loss.item(), float((pred == y)[test].sum()), float(test.sum())])
)
if comm.rank == 0:
    print(f"loss {loss:.4f}  test accuracy {correct / total:.3f}")
