"""Graph data model, file formats, importers from Python objects, generators and named
stand-ins."""

from .core import Graph, GraphError, index_dtype
from .dataset import Dataset
from .importers import from_arrays, from_edge_index, from_pyg, from_scipy

__all__ = [
    "Graph",
    "GraphError",
    "Dataset",
    "index_dtype",
    "from_arrays",
    "from_edge_index",
    "from_pyg",
    "from_scipy",
]
