"""``torch_geometric.transforms`` that shape what mgg loads: each sets how the dataset is
prepared before it is partitioned (they apply when a dataset is loaded, not to a loaded
one)."""

from __future__ import annotations


class BaseTransform:
    """What a transform changes in the load's options (``load``'s keywords)."""

    def options(self, opts: dict) -> dict:
        raise NotImplementedError

    def __call__(self, data):
        raise TypeError(
            f"{type(self).__name__}: mgg applies transforms when it loads a dataset "
            "(Planetoid(..., transform=T) or mgg.pyg.load(..., transform=T)), not to a "
            "loaded one"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NormalizeFeatures(BaseTransform):
    """Each feature row scaled to sum 1."""

    def options(self, opts):
        return {**opts, "row_normalize": True}


class GCNNorm(BaseTransform):
    """The graph as GCN's D^-1/2 (A+I) D^-1/2 (PyG's gcn_norm), for layers with
    ``normalize=False``."""

    def __init__(self, add_self_loops: bool = True):
        if not add_self_loops:
            raise ValueError("GCNNorm(add_self_loops=False): mgg's 'gcn_norm' graph has loops")

    def options(self, opts):
        return {**opts, "kind": "gcn_norm"}


class AddSelfLoops(BaseTransform):
    """One self loop per node (weight 1)."""

    def options(self, opts):
        return {**opts, "kind": "self_loops"}


class RemoveSelfLoops(BaseTransform):
    def options(self, opts):
        return {**opts, "kind": "no_self_loops"}


class ToSparseTensor(BaseTransform):
    """The graph as ``data.adj_t`` (the job's DistGraph, as ``data.edge_index`` is)."""

    def __init__(self, attr: str = "edge_weight", remove_edge_index: bool = True):
        self.remove_edge_index = remove_edge_index

    def options(self, opts):
        return {**opts, "adj_t": True, "remove_edge_index": self.remove_edge_index}


class Compose(BaseTransform):
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def options(self, opts):
        for t in self.transforms:
            if not isinstance(t, BaseTransform):
                raise TypeError(f"Compose: {t!r} is not one of mgg.pyg.transforms")
            opts = t.options(opts)
        return opts

    def __repr__(self) -> str:
        return f"Compose({self.transforms})"


__all__ = [
    "BaseTransform",
    "Compose",
    "NormalizeFeatures",
    "GCNNorm",
    "AddSelfLoops",
    "RemoveSelfLoops",
    "ToSparseTensor",
]
