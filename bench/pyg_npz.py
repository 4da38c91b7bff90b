"""PyG's Planetoid offline: the same cora.npz that mgg.pyg reads, as a torch_geometric
Data (PyG's own Planetoid downloads the raw Planetoid files, and this machine has no
internet). Used by the PyG twins of examples/pyg (bench/pyg_ports.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class Planetoid:
    """``Planetoid(root, name, transform)`` as PyG's: dataset[0] a Data with x, edge_index
    (src, dst), y and the public split; num_features, num_classes."""

    def __init__(self, root, name: str, transform=None):
        from torch_geometric.data import Data

        file = f"{name.lower()}.npz"
        path = next(p for p in (Path(root) / file, Path(root).parent / file) if p.is_file())
        z = np.load(path, allow_pickle=False)
        indptr, src = z["indptr"], z["indices"].astype(np.int64)
        dst = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
        data = Data(
            x=torch.from_numpy(z["x"]) if "x" in z else None,  # pubmed.npz has none
            num_nodes=indptr.size - 1,
            edge_index=torch.from_numpy(np.stack([src, dst])),
            y=torch.from_numpy(z["y"]),
            **{m: torch.from_numpy(z[m]) for m in ("train_mask", "val_mask", "test_mask")},
        )
        self.data = data if transform is None else transform(data)
        self.num_features = int(z["x"].shape[1]) if "x" in z else 0
        self.num_classes = int(z["y"].max()) + 1

    def __getitem__(self, i):
        return self.data

    def __len__(self):
        return 1
