"""The tuner: MGG's analytical model and cross-iteration search over (ps, dist, wpb)."""

from ..kernels.cuda.occupancy import (
    KNOWN_GPUS,
    Device,
    Estimate,
    Workload,
    estimate,
    known_gpu,
    live_gpu,
    smem_bytes,
)
from .model import cpu_device, default_space, estimate_cpu, rank_configs
from .search import (
    Protocol,
    SearchResult,
    choose_window,
    exhaustive,
    model_guess,
    model_table,
    search,
)

__all__ = [
    "Device",
    "Estimate",
    "Workload",
    "KNOWN_GPUS",
    "known_gpu",
    "live_gpu",
    "cpu_device",
    "smem_bytes",
    "estimate",
    "estimate_cpu",
    "rank_configs",
    "default_space",
    "search",
    "choose_window",
    "exhaustive",
    "model_guess",
    "model_table",
    "Protocol",
    "SearchResult",
]
