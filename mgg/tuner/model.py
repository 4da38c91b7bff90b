"""The tuner's model: the CUDA kernel's occupancy model (mgg.kernels.cuda.occupancy),
its CPU counterpart, and the ranking of a search space by estimated latency.

GPU knobs: ps (neighbor partition size), dist (interleaving distance: partitions of each
kind per warp), wpb (warps per block). CPU knobs: ps, dist (fetch batches in flight) and
threads (the CPU's counterpart of wpb: workers per rank).
"""

from __future__ import annotations

import itertools
import math
import os

from ..kernels.cuda.occupancy import WARP, Device, Estimate, Workload, estimate


def cpu_device(cores: int | None = None) -> Device:
    cores = cores or len(os.sched_getaffinity(0))
    return Device("cpu", cores, 0, 0, max_threads_per_block=cores * WARP, kind="cpu")


def estimate_cpu(ps: int, dist: int, threads: int, work: Workload, dev: Device) -> Estimate:
    """The CPU counterpart: edges of D floats spread over ``threads`` workers, plus a cost
    per partition and per fetch batch; more threads than cores is infeasible."""
    if min(ps, dist, threads) < 1:
        return Estimate(False, "ps, dist and threads must be >= 1")
    if threads > dev.sms:
        return Estimate(False, f"{threads} threads > {dev.sms} cores")
    lnp, rnp = work.partitions(ps)
    edge_cost = (work.local_edges + 2 * work.remote_edges) * work.dim
    part_cost = (lnp + rnp) * 4 * work.dim
    batch_cost = 2e4 * math.ceil(rnp / 8192) / dist
    latency = (edge_cost + part_cost) / threads + batch_cost
    return Estimate(True, "", 2 * ps * work.dim * dist, 0, lnp + rnp, 0, 0.0, threads, latency)


def rank_configs(space, work: Workload, dev: Device, mode: str = "get"):
    """Every configuration of the space, feasible ones first by estimated latency.

    space: {'ps': [...], 'dist': [...], 'wpb' (GPU) or 'threads' (CPU): [...]}, as
    mgg.knobs.space gives it
    returns [(config dict, Estimate)]
    """
    out = []
    for values in itertools.product(*space.values()):
        cfg = dict(zip(space, values, strict=True))
        est = (
            estimate_cpu(cfg["ps"], cfg["dist"], cfg["threads"], work, dev)
            if dev.kind == "cpu"
            else estimate(cfg["ps"], cfg["dist"], cfg["wpb"], work, dev, mode)
        )
        out.append((cfg, est))
    out.sort(key=lambda ce: (not ce[1].feasible, ce[1].latency))
    return out
