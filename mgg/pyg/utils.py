"""``torch_geometric.utils`` in mgg: PyG's own functions, which take the whole graph's
meaning on data.edge_index (mgg.torch.edges.EdgeIndex): ``degree``, ``add_self_loops``,
``remove_self_loops``, ``softmax``, ``scatter``, ``dropout_edge`` and the like run; one
that needs an op mgg does not make global (``to_undirected``, ``coalesce``,
``negative_sampling``, ...) raises InputError naming it."""

from __future__ import annotations


def __getattr__(name: str):
    import torch_geometric.utils as utils

    try:
        return getattr(utils, name)
    except AttributeError:
        raise AttributeError(
            f"mgg.pyg.utils has no {name!r} (torch_geometric.utils has none)"
        ) from None
