"""The designs MGG is measured against, next to MGG's own pipelined design.

Every design has the same interface (mgg.kernels.distributed.DistributedAggregation) and
produces the same output.
"""

from ..kernels.distributed import DistributedAggregation, Pipelined
from .bulk_halo import BulkHalo
from .direct import Direct

DESIGNS: dict[str, type[DistributedAggregation]] = {
    d.name: d for d in (Pipelined, BulkHalo, Direct)
}

__all__ = ["DESIGNS", "Pipelined", "BulkHalo", "Direct"]
