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
    cc: tuple[int, int] | None = None  # compute capability (major, minor); None: not known


# Datasheet values (CUDA occupancy tables): opt-in shared memory per block / per SM.
KNOWN_GPUS = {
    "A100": Device("NVIDIA A100", 108, 227 * 1024 - 1024, 164 * 1024, cc=(8, 0)),
    "H100": Device("NVIDIA H100", 132, 227 * 1024, 228 * 1024, cc=(9, 0)),
    "H200": Device("NVIDIA H200", 132, 227 * 1024, 228 * 1024, cc=(9, 0)),
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
            cc=(int(dev.compute_capability[:-1]), int(dev.compute_capability[-1])),  # '90': 9.0
        )


@dataclass(frozen=True)
class Workload:
    """What the model needs to know of one rank's aggregation."""

    local_edges: int
    remote_edges: int
    halo_rows: int
    dim: int
    nodes: int
    itemsize: int = FLOAT_BYTES  # bytes of a row's element: 4 (float32), 2 (bfloat16)

    @classmethod
    def of(cls, plan, dim: int, itemsize: int = FLOAT_BYTES) -> Workload:
        return cls(
            plan.num_local_edges,
            plan.num_remote_edges,
            plan.num_halo,
            dim,
            plan.num_local_nodes,
            itemsize,
        )

    def partitions(self, ps: int) -> tuple[int, int]:
        """(#LNP, #RNP) for partition size ps (ignoring row boundaries: a lower bound)."""
        return math.ceil(self.local_edges / ps), math.ceil(self.remote_edges / ps)


def smem_bytes(ps: int, wpb: int, dim: int, mode: str = "get", itemsize: int = FLOAT_BYTES) -> int:
    """Dynamic shared memory one block of the CUDA kernel allocates.

    'get': per warp, ps neighbor ids and a double-buffered staging area of ps fetched rows
    (Listing 2's host sizing: ps*wpb*4 + 2*ps*wpb*D*4, the ids rounded up to 16 bytes so
    that staged rows take 16-byte loads; bf16 rows: D*2 bytes each). 'p2p': peers are
    read through pointers; ids travel by warp shuffles and partial sums stay in
    registers: none.
    """
    if mode == "p2p":
        return 0
    return -(-ps * wpb // 4) * 4 * INT_BYTES + 2 * ps * wpb * dim * itemsize


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
    latency: float = math.inf  # seconds, roughly: only to rank configurations


# The latency model's constants. Costs are in "ops": one warp-wide load of an index or a
# row slice that hits L2 (the kernel's unit of work); OP_NS turns them into seconds.
OP_NS = 2.7e-9  # SM time per op at full occupancy (H100-class; fixes the scale only)
LOCAL_OPS, REMOTE_OPS = 2, 4  # per step: index + row; pe + row index + peer base + row
PART_OPS = 10  # per partition: ptr[k], ptr[k+1], node, excl, then the shuffle reduction
#                and the flush of the partial sum (an atomic to L2), serial for the warp
WARP_OPS = 4  # per warp: launch, prologue and retirement
HIDE = 0.4  # share of the memory latency a full SM (max_warps_per_sm) leaves unhidden
TAIL = 0.5  # the last warps to start end on average half a warp's duration after the rest


MAX_CHUNKS = 2  # vectors a lane sums of one row; wider rows take the generic kernel


VECS = {4: (4, 1), 2: (8, 2, 1)}  # a lane's vectors by element bytes: 16-byte loads first


def width_class(dim: int, heads: int = 1, itemsize: int = FLOAT_BYTES) -> tuple[int, int]:
    """(vec, W): the kernel variant for rows of D elements of ``itemsize`` bytes (4:
    float32, 2: bfloat16; heads: edge weights per edge).

    vec: elements a lane loads at once, the largest of VECS[itemsize] that divides D and
    each head's width D/heads: float32 4 (16-byte loads) or 1; bf16 8 (16-byte loads), 2
    (4-byte pairs) or 1. W: the class's width, D/vec vectors rounded up to a power of
    two, at most 32 * MAX_CHUNKS (times vec), or 0 past that: the generic kernel, for any
    D. E.g. float32 D = 16 -> (4, 16), 100 -> (4, 128), 33 -> (1, 64), 600 -> (4, 0);
    bf16 D = 128 -> (8, 128), 100 -> (2, 128), 600 -> (8, 0).
    """
    if dim < 1:
        raise ValueError(f"the feature width D must be >= 1, got {dim}")
    if heads < 1 or dim % heads:
        raise ValueError(f"{heads} heads: heads must divide the feature width D = {dim}")
    if itemsize not in VECS:
        raise ValueError(f"rows of {itemsize}-byte elements: the kernel takes 4 or 2")
    vec = next(v for v in VECS[itemsize] if dim % v == 0 and (dim // heads) % v == 0)
    slots = 1 << (-(-dim // vec) - 1).bit_length()
    return vec, slots * vec if slots <= WARP * MAX_CHUNKS else 0


def lanes_per_edge(dim: int, heads: int = 1, itemsize: int = FLOAT_BYTES) -> tuple[int, int, int]:
    """(edges a warp sums per step, passes over the row, vectors a lane loads per edge
    and pass) as the kernel lays lanes out (aggregate.cu): a class of S = W/vec <= 32
    vectors splits a warp into 32/S groups, one edge each; else the warp takes one edge
    and each lane S/32 vectors of it; the generic kernel makes passes of 32 * MAX_CHUNKS
    vectors."""
    vec, width = width_class(dim, heads, itemsize)
    slots = width // vec if width else WARP * MAX_CHUNKS
    lanes = min(slots, WARP)
    passes = 1 if width else math.ceil(dim / (slots * vec))
    return WARP // lanes, passes, slots // lanes


def estimate(
    ps: int, dist: int, wpb: int, work: Workload, dev: Device, mode: str = "get"
) -> Estimate:
    """The paper's quantities for one GPU configuration, its feasibility, and a latency
    estimate (seconds, for ranking configurations).

    WPW = 2·ps·D·dist;  numWarps = max(#LNP, #RNP) / dist;  numBlocks = numWarps / wpb;
    blocksPerSM = numBlocks / numSMs.

    Latency: the kernel is bound by its memory operations, shared by the warps resident on
    an SM. Work (in ops) = per warp WARP_OPS + per partition PART_OPS (its pointers, node,
    excl flag and the atomic flush, whatever ps) + per step of ceil(ps / edges per step)
    LOCAL_OPS or REMOTE_OPS (and a row load per further vector a lane sums of each row).
    Spread over the SMs and slowed by (1 + HIDE·max/active) / (1 + HIDE), active = the
    warps an SM holds (fewer hide less latency: 1-warp blocks stop at max_blocks_per_sm),
    plus TAIL of one warp's duration for the last wave.
    """
    if min(ps, dist, wpb) < 1:
        return Estimate(False, "ps, dist and wpb must be >= 1")
    threads = wpb * WARP
    if threads > dev.max_threads_per_block:
        return Estimate(False, f"{threads} threads per block > {dev.max_threads_per_block}")
    smem = smem_bytes(ps, wpb, work.dim, mode, work.itemsize)
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
    # warps an SM actually holds: all it can, or its share of a small grid
    active = max(1.0, min(resident_warps, warps / dev.sms))
    per_step, passes, chunks = lanes_per_edge(work.dim, itemsize=work.itemsize)
    steps = math.ceil(ps / per_step) * passes  # serial steps of one full partition
    rows = chunks - 1  # row loads per step beyond the one LOCAL_OPS / REMOTE_OPS count
    ops = warps * WARP_OPS + lnp * (PART_OPS + steps * (LOCAL_OPS + rows))
    ops += rnp * (PART_OPS + steps * (REMOTE_OPS + rows))
    slow = (1 + HIDE * dev.max_warps_per_sm / active) / (1 + HIDE)
    busy = ops * OP_NS * slow / dev.sms  # every SM busy
    warp_time = ops / warps * OP_NS * slow * active  # one warp, sharing its SM with active
    latency = busy + TAIL * warp_time
    return Estimate(True, "", wpw, smem, warps, blocks, blocks / dev.sms, resident_warps, latency)
