"""Graph data model, file formats, generators and named stand-ins."""

from .core import Graph, GraphError, index_dtype
from .dataset import Dataset

__all__ = ["Graph", "GraphError", "Dataset", "index_dtype"]
