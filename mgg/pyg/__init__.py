"""PyG's import paths over mgg: a PyG script runs on P ranks with ``torch_geometric``
changed to ``mgg.pyg`` in its imports (and its data path), launched by ``mggrun``.

``mgg.pyg.datasets.Planetoid`` (and ``load`` for any dataset mgg reads) give this rank's
share of the graph: ``data.x``, ``data.y`` and the masks are this rank's rows as
``mgg.torch.Rows`` (losses, metrics and ``sum`` over them count every rank), and
``data.edge_index`` is this rank's edges as PyG's edge_index (mgg.torch.edges.EdgeIndex,
whose ops take the whole graph's meaning), ``data.adj_t`` and ``data.g`` the job's
DistGraph; every layer takes either. ``mgg.pyg.nn`` has the layers (mgg's fused ones and
PyG's own classes) and MessagePassing, ``mgg.pyg.utils`` PyG's utils,
``mgg.pyg.transforms`` the transforms that shape what is loaded. docs/pyg.md has the
migration side by side.
"""

from .data import Data, load

__all__ = ["Data", "load"]
