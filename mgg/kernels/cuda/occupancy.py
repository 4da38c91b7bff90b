"""The occupancy model of the CUDA kernel (MGG §4): what a launch configuration (ps,
dist, wpb) costs in shared memory, warps and blocks, whether the device can run it, and
a first latency estimate to rank configurations without running them.

On the GPU, ``dist`` is the interleaving distance: partitions of each kind per warp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WARP = 32
INT_BYTES = FLOAT_BYTES = 4


@dataclass(frozen=True)
class Device:
    """The limits a launch configuration must respect."""

    name: str
    sms: int
    smem_per_block: int  # bytes, with the opt-in maximum
    smem_per_sm: int
    max_threads_per_block: int = 1024
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    kind: str = "gpu"


# Datasheet values (CUDA occupancy tables): opt-in shared memory per block / per SM.
KNOWN_GPUS = {
    "A100": Device("NVIDIA A100", 108, 227 * 1024 - 1024, 164 * 1024),
    "H100": Device("NVIDIA H100", 132, 227 * 1024, 228 * 1024),
    "H200": Device("NVIDIA H200", 132, 227 * 1024, 228 * 1024),
}


def known_gpu(name: str) -> Device:
    """A Device from the table by (a part of) its marketing name, e.g. 'NVIDIA H100 80GB'."""
    for key, dev in KNOWN_GPUS.items():
        if key.lower() in name.lower():
            return dev
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(KNOWN_GPUS)}")


def live_gpu(device_id: int = 0) -> Device:
    """Query the current GPU through cupy (needs cupy and a GPU)."""
    import cupy

    with cupy.cuda.Device(device_id) as dev:
        attr = dev.attributes
        name = cupy.cuda.runtime.getDeviceProperties(device_id)["name"].decode()
        return Device(
            name,
            attr["MultiProcessorCount"],
            attr["MaxSharedMemoryPerBlockOptin"],
            attr["MaxSharedMemoryPerMultiprocessor"],
            attr["MaxThreadsPerBlock"],
            attr["MaxThreadsPerMultiProcessor"] // WARP,
            attr.get("MaxBlocksPerMultiprocessor", 32),
        )


@dataclass(frozen=True)
class Workload:
    """What the model needs to know of one rank's aggregation."""

    local_edges: int
    remote_edges: int
    halo_rows: int
    dim: int
    nodes: int

    @classmethod
    def of(cls, plan, dim: int) -> Workload:
        return cls(
            plan.num_local_edges, plan.num_remote_edges, plan.num_halo, dim, plan.num_local_nodes
        )

    def partitions(self, ps: int) -> tuple[int, int]:
        """(#LNP, #RNP) for partition size ps (ignoring row boundaries: a lower bound)."""
        return math.ceil(self.local_edges / ps), math.ceil(self.remote_edges / ps)


def smem_bytes(ps: int, wpb: int, dim: int, mode: str = "get") -> int:
    """Dynamic shared memory one block of the CUDA kernel allocates.

    'get': per warp, ps neighbor ids and a double-buffered staging area of ps fetched rows
    (Listing 2's host sizing: ps*wpb*4 + 2*ps*wpb*D*4). 'p2p': peers are read through
    pointers; ids travel by warp shuffles and partial sums stay in registers: none.
    """
    if mode == "p2p":
        return 0
    return ps * wpb * INT_BYTES + 2 * ps * wpb * dim * FLOAT_BYTES


@dataclass(frozen=True)
class Estimate:
    feasible: bool
    reason: str
    wpw: int = 0
    smem: int = 0
    warps: int = 0
    blocks: int = 0
    blocks_per_sm: float = 0.0
    resident_warps_per_sm: int = 0
    latency: float = math.inf  # model units, only to rank configurations


def estimate(
    ps: int, dist: int, wpb: int, work: Workload, dev: Device, mode: str = "get"
) -> Estimate:
    """The paper's quantities for one GPU configuration, its feasibility, and a latency
    estimate: waves of resident blocks times the work per warp, slowed down when too few
    warps are resident to hide memory latency.

    WPW = 2·ps·D·dist;  numWarps = max(#LNP, #RNP) / dist;  numBlocks = numWarps / wpb;
    blocksPerSM = numBlocks / numSMs.
    """
    if min(ps, dist, wpb) < 1:
        return Estimate(False, "ps, dist and wpb must be >= 1")
    threads = wpb * WARP
    if threads > dev.max_threads_per_block:
        return Estimate(False, f"{threads} threads per block > {dev.max_threads_per_block}")
    smem = smem_bytes(ps, wpb, work.dim, mode)
    if smem > dev.smem_per_block:
        return Estimate(
            False, f"{smem} B shared memory per block > {dev.smem_per_block}", smem=smem
        )
    wpw = 2 * ps * work.dim * dist
    lnp, rnp = work.partitions(ps)
    warps = max(1, math.ceil(max(lnp, rnp) / dist))
    blocks = math.ceil(warps / wpb)
    resident = min(
        dev.max_blocks_per_sm,
        dev.max_warps_per_sm // wpb,
        dev.smem_per_sm // smem if smem else dev.max_blocks_per_sm,
    )
    if resident < 1:
        return Estimate(False, "not one block fits on an SM", wpw, smem, warps, blocks)
    resident_warps = resident * wpb
    waves = math.ceil(blocks / (dev.sms * resident))
    # a warp's work, slowed when fewer than half the warp slots are there to hide latency
    hide = min(1.0, resident_warps / (dev.max_warps_per_sm / 2))
    # remote rows cost more than local ones; dist > 1 lets one warp overlap them
    remote_share = rnp / max(1, lnp + rnp)
    overlap = 1.0 - 0.5 * remote_share * (1 - 1 / dist)
    latency = waves * wpw * (1 + 2 * remote_share) * overlap / hide + blocks * 1e-3
    return Estimate(True, "", wpw, smem, warps, blocks, blocks / dev.sms, resident_warps, latency)
