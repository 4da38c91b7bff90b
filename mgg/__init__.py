"""mgg: full-graph GNN training and inference across many devices with fine-grained
communication-computation pipelining (MGG, OSDI'23)."""

from . import process

process.apply()

__version__ = "0.1.0"
