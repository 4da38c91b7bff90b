"""The tuner: MGG's analytical model and cross-iteration search over (ps, dist, wpb), and
the one driver that `mgg tune` and the Trainer run (its search space: mgg.knobs.space)."""

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
from .driver import Tuned, drive
from .model import cpu_device, estimate_cpu, rank_configs
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
    "drive",
    "Tuned",
    "search",
    "choose_window",
    "exhaustive",
    "model_guess",
    "model_table",
    "Protocol",
    "SearchResult",
]
