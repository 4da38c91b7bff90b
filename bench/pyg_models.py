"""PyG twins of mgg's registered models (mgg.torch.MODELS) with their defaults: the peer
that bench/train_vs_pyg.py and bench/gpu/e2e_vs_pyg.py time mgg against, on each of the
graph forms PyG's layers take (``PATHS``), so the benchmarks can time PyG at its best."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# The graph forms each model runs on. 'edge_index': [2, E] (src, dst), as PyG's examples
# pass it: gather, message tensor [E, D], scatter. 'csr': the transposed adjacency adj_t
# (row v lists v's in-neighbours) as a torch sparse CSR tensor: PyG's GCN, SAGE and GIN
# then aggregate with one sparse-dense product (cuSPARSE on the GPU) and no message
# tensor; GCN caches its normalized adj_t. 'loops': GAT on an edge_index whose self loops
# were added once, before training (GATConv(add_self_loops=False)), instead of every call.
PATHS = {
    "gcn": ("edge_index", "csr"),
    "sage": ("edge_index", "csr"),
    "gin": ("edge_index", "csr"),
    "gat": ("edge_index", "loops"),
}


def pyg_graph(graph, path: str, device="cpu"):
    """The graph argument of PyG's layers in form ``path`` (PATHS) for an mgg Graph (an
    in-edge CSR: indptr [N + 1], indices [E] the sources), on ``device``."""
    n = graph.num_nodes
    if path == "csr":
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's beta-state warning for sparse CSR
            return torch.sparse_csr_tensor(
                torch.from_numpy(graph.indptr.astype(np.int64)),
                torch.from_numpy(graph.indices.astype(np.int64)),
                torch.ones(graph.num_edges),
                size=(n, n),
            ).to(device)
    src, dst = graph.edges()
    if path == "loops":
        keep = src != dst
        loops = np.arange(n, dtype=src.dtype)
        src, dst = np.concatenate([src[keep], loops]), np.concatenate([dst[keep], loops])
        order = np.argsort(dst, kind="stable")  # grouped by destination, as edge_index is
        src, dst = src[order], dst[order]
    elif path != "edge_index":
        raise ValueError(f"unknown PyG graph form {path!r}: one of edge_index, csr, loops")
    return torch.from_numpy(np.stack([src, dst]).astype(np.int64)).to(device)


def pyg_inputs(ds):
    """(x, y, train) of an mgg Dataset for PyG: x float32 [N, F], dense where it has fewer
    than 2e8 entries (else a sparse CSR tensor), y int64 [N], train int64 [T] the
    training rows as an index tensor (a boolean mask costs a nonzero every step)."""
    import scipy.sparse as sp

    x = ds.x
    if sp.issparse(x) and x.shape[0] * x.shape[1] < 2e8:
        x = x.toarray()
    if sp.issparse(x):
        x = torch.sparse_csr_tensor(
            torch.from_numpy(x.indptr.astype(np.int64)),
            torch.from_numpy(x.indices.astype(np.int64)),
            torch.from_numpy(x.data.astype(np.float32)),
            size=x.shape,
        )
    else:
        x = torch.from_numpy(np.asarray(x, np.float32))
    train = torch.from_numpy(np.flatnonzero(ds.train_mask))
    return x, torch.from_numpy(np.asarray(ds.y, np.int64)), train


def pyg_model(name: str, f: int, c: int, path: str = "edge_index") -> nn.Module:
    """GCN 2 x 16 (cached), SAGE 2 x 16 (mean), GIN 2 x 64 (MLPs with batch norm,
    input dropout 0.9), GAT 8 heads x 8 hidden (dropout 0.6), as mgg's defaults; on graph
    form ``path`` (GAT on 'loops' adds no self loops of its own)."""
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    if path not in PATHS[name]:
        raise ValueError(f"PyG's {name} runs on {', '.join(PATHS[name])}, not {path!r}")
    loops = path != "loops"

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
                GATConv(f, 8, heads=8, dropout=0.6, add_self_loops=loops),
                GATConv(64, c, heads=1, concat=False, dropout=0.6, add_self_loops=loops),
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


def pyg_optimizer(
    name: str, model: nn.Module, *, fused: bool = False, capturable: bool = False
) -> torch.optim.Optimizer:
    """Adam with mgg's defaults: lr 0.01 (GAT 0.005), weight decay 5e-4 (GCN: first layer).
    ``fused``: torch's fused Adam kernel (one launch for every parameter; torch >= 2.0 on
    CUDA, >= 2.4 on CPU), as an expert sets it up on a GPU; ``capturable``: its state on
    the device, so that its step can be captured in a CUDA graph. Each is passed to torch
    only when set: an explicit ``fused=False`` would also turn torch's default foreach
    kernels off."""
    if name == "gcn":
        first = list(model.convs[0].parameters())
        rest = [q for conv in model.convs[1:] for q in conv.parameters()]
        groups = [{"params": first, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0}]
    else:
        groups = [{"params": list(model.parameters()), "weight_decay": 5e-4}]
    kw = {k: True for k, on in (("fused", fused), ("capturable", capturable)) if on}
    return torch.optim.Adam(groups, lr=0.005 if name == "gat" else 0.01, **kw)


def pyg_steps(ds, name: str):
    """For each graph form of model ``name`` (PATHS), PyG set up on the dataset ``ds`` as
    an expert would (pyg_inputs; weights seeded): (form, step, forward_loss), step() one
    training step, forward_loss() its loss with the graph kept."""
    x, y, train = pyg_inputs(ds)
    for form in PATHS[name]:
        adj = pyg_graph(ds.graph, form)
        torch.manual_seed(0)
        model = pyg_model(name, x.shape[1], ds.num_classes, form)
        opt = pyg_optimizer(name, model)

        def forward_loss(model=model, adj=adj):
            model.train()
            return F.cross_entropy(model(x, adj)[train], y[train])

        def step(opt=opt, forward_loss=forward_loss):
            opt.zero_grad()
            forward_loss().backward()
            opt.step()

        yield form, step, forward_loss
