"""MGG's partitioner: pure numpy/numba, deterministic, the same on every rank."""

from .edge_split import RankEdges, column_slice, edge_split
from .neighbor_split import neighbor_split
from .node_split import node_split, owner_of
from .plan import PartitionPlan, build_plan, plan_stats

__all__ = [
    "node_split",
    "owner_of",
    "edge_split",
    "column_slice",
    "RankEdges",
    "neighbor_split",
    "PartitionPlan",
    "build_plan",
    "plan_stats",
]
