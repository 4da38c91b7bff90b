"""GCN and GIN for full-graph node classification."""

from __future__ import annotations

import numpy as np

from .layers import Dropout, GCNConv, GINConv, Module, ReLU


class Sequential(Module):
    """Layers applied in order; backward runs them in reverse and stops early at the first
    layer whose input needs no gradient."""

    def __init__(self, layers: list[Module]):
        self.layers = list(layers)
        # the input features need no gradient: find the first layer with parameters
        for layer in self.layers:
            if layer.parameters():
                layer.input_grad = False
                break

    def forward(self, x, g):
        for layer in self.layers:
            x = layer.forward(x, g)
        return x

    def backward(self, dy):
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
            if dy is None:
                return None
        return dy

    def set_epoch(self, epoch: int) -> None:
        """Key the dropout masks of this epoch."""
        for layer in self.layers:
            if isinstance(layer, Dropout):
                layer.epoch = epoch


def layer_dims(in_dim: int, hidden: int, out_dim: int, num_layers: int) -> list[int]:
    """The widths between layers: in, hidden x (L-1), out."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    return [in_dim] + [hidden] * (num_layers - 1) + [out_dim]


class GCN(Sequential):
    """Kipf & Welling's GCN: [dropout -> GCNConv -> ReLU] x (L-1) -> dropout -> GCNConv.

    MGG §5 uses 2 layers with 16 hidden units. Weight decay applies to the first layer
    only, as in the original model.
    """

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        num_layers: int = 2,
        dropout: float = 0.5,
        seed: int = 0,
        dtype=np.float32,
    ):
        dims = layer_dims(in_dim, hidden, out_dim, num_layers)
        rng = np.random.default_rng(seed)
        layers: list[Module] = []
        for i in range(num_layers):
            layers.append(Dropout(dropout, seed=seed, stream=i))
            layers.append(GCNConv(dims[i], dims[i + 1], rng=rng, dtype=dtype, decay=i == 0))
            if i < num_layers - 1:
                layers.append(ReLU())
        super().__init__(layers)
        self.config = {
            "model": "gcn",
            "in_dim": in_dim,
            "hidden": hidden,
            "out_dim": out_dim,
            "num_layers": num_layers,
            "dropout": dropout,
            "seed": seed,
        }


class GIN(Sequential):
    """GIN (Xu et al.): L GINConv layers (MLP of two Linears each), ReLU and dropout
    between layers. MGG §5 uses 5 layers with 64 hidden units."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        out_dim: int,
        *,
        num_layers: int = 5,
        dropout: float = 0.5,
        train_eps: bool = False,
        seed: int = 0,
        dtype=np.float32,
    ):
        dims = layer_dims(in_dim, hidden, out_dim, num_layers)
        rng = np.random.default_rng(seed)
        layers: list[Module] = []
        for i in range(num_layers):
            if i > 0:
                layers.append(Dropout(dropout, seed=seed, stream=i))
            layers.append(
                GINConv(dims[i], dims[i + 1], hidden, train_eps=train_eps, rng=rng, dtype=dtype)
            )
            if i < num_layers - 1:
                layers.append(ReLU())
        super().__init__(layers)
        self.config = {
            "model": "gin",
            "in_dim": in_dim,
            "hidden": hidden,
            "out_dim": out_dim,
            "num_layers": num_layers,
            "dropout": dropout,
            "train_eps": train_eps,
            "seed": seed,
        }


MODELS = {"gcn": GCN, "gin": GIN}
