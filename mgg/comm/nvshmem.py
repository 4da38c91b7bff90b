"""The NVSHMEM backend of mgg.comm: symmetric arrays in the NVSHMEM heap (GPU).

Host collectives (barrier, allreduce, broadcast) go through MPI, as in the MPI backend:
NVSHMEM's own collectives need the MPS daemon when several PEs share a GPU, and a
barrier here must order host-launched kernels anyway (device sync, then MPI barrier).
NVSHMEM provides the symmetric allocation, the peers' base pointers (nvshmem_ptr) for
the p2p kernel, and the device-side gets of the get kernel, whose modules must be
registered with NVSHMEM (register_module) after init and released before finalize.
"""

from __future__ import annotations

import os
import re

import numpy as np

from ..errors import ResourceError
from ..precision import storage
from .base import SymmetricArray
from .mpi import MPIComm

DEFAULT_HEAP = 1 << 30  # NVSHMEM's default NVSHMEM_SYMMETRIC_SIZE
HEAP_RESERVE = 64 << 20  # left for NVSHMEM's own allocations and alignment


class HeapTooSmallError(ResourceError):
    """The symmetric heap cannot hold what the plan needs."""


def heap_bytes(env=None) -> int:
    """NVSHMEM_SYMMETRIC_SIZE in bytes ('1G', '512M', '1073741824'; default 1 GiB)."""
    text = (env if env is not None else os.environ).get("NVSHMEM_SYMMETRIC_SIZE")
    if not text:
        return DEFAULT_HEAP
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]?)[bB]?\s*", text)
    if not m:
        raise ValueError(f"NVSHMEM_SYMMETRIC_SIZE={text!r} is not a size like 2G or 512M")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(m.group(1)) * mult


def heap_needed(rows: int, dims, itemsize: int = 4, copies: int = 2) -> int:
    """Bytes of symmetric heap for buffers of the given widths (``copies`` per width:
    DistGraph double-buffers), with NVSHMEM's reserve."""
    return sum(copies * rows * d * itemsize for d in dims) + HEAP_RESERVE


def check_heap(used: int, nbytes: int, heap: int, rows: int, dim: int) -> None:
    """Raise HeapTooSmallError, before NVSHMEM is asked, when an allocation cannot fit."""
    need = used + nbytes + HEAP_RESERVE
    if need > heap:
        raise HeapTooSmallError(
            f"the NVSHMEM symmetric heap is {heap / 2**20:.0f} MiB but this job needs at "
            f"least {need / 2**20:.0f} MiB ({rows:,} x {dim} floats on top of "
            f"{used / 2**20:.0f} MiB in use): set NVSHMEM_SYMMETRIC_SIZE={-(-need // 2**30)}G"
        )


def cuda_device(device_id: int):
    """cuda.core's Device for this GPU: from ``cuda.core`` (cuda-core >= 0.5, which
    nvshmem4py 0.4 needs), else from the deprecated ``cuda.core.experimental``."""
    try:
        from cuda.core import Device
    except ImportError:
        from cuda.core.experimental import Device
    return Device(device_id)


def peer_addresses(get_peer, own: int, rank: int, size: int) -> tuple[list[int], dict]:
    """Base address of every PE's buffer as this PE can load it, 0 where it cannot, and
    {pe: why} for those. get_peer(pe) wraps nvshmem_ptr (nvshmem4py's get_peer_array),
    which raises, or gives None or a null pointer, for a peer not reachable by loads."""
    ptrs, unreachable = [], {}
    for pe in range(size):
        if pe == rank:
            ptrs.append(int(own))
            continue
        try:
            peer = get_peer(pe)
            ptr = 0 if peer is None else int(peer.data.ptr)
            why = "nvshmem_ptr gave a null pointer"
        except Exception as e:  # noqa: BLE001 - nvshmem4py's errors have no common base
            ptr, why = 0, f"{type(e).__name__}: {e}"
        ptrs.append(ptr)
        if ptr == 0:
            unreachable[pe] = why
    return ptrs, unreachable


_MODULES: dict[int, object] = {}  # CUmodule handle -> its RawModule, registered with NVSHMEM


def register_module(module) -> None:
    """nvshmemx_cumodule_init for a CuPy RawModule that calls NVSHMEM on the device (once
    per NVSHMEM init; needs init first). A non-zero status raises: its kernels would
    fault."""
    ptr = int(module.module.ptr)
    if ptr in _MODULES:
        return
    import nvshmem.bindings

    status = nvshmem.bindings.cumodule_init(ptr)
    if status != 0:
        raise RuntimeError(
            f"nvshmemx_cumodule_init returned {status}: the get kernel cannot reach NVSHMEM "
            "(is NVSHMEM initialized on this PE, and the module built with -dc against "
            "libnvshmem_device?)"
        )
    _MODULES[ptr] = module


def release_modules() -> list[str]:
    """nvshmemx_cumodule_finalize for every registered module; what failed, if any."""
    import nvshmem.bindings

    failed = []
    for ptr in list(_MODULES):
        status = nvshmem.bindings.cumodule_finalize(ptr)
        if status != 0:
            failed.append(f"module {ptr:#x}: cumodule_finalize returned {status}")
        del _MODULES[ptr]
    return failed


class NVSHMEMComm(MPIComm):
    """MPI for the host, NVSHMEM for device memory. ``device``: the GPU of this rank
    (default: $MGG_DEVICE, set by mggrun, else the node rank modulo the GPU count)."""

    device_memory = True

    def __init__(self, comm=None, device: int | None = None, init_method: str | None = None):
        super().__init__(comm, window="rma")
        import cupy
        import nvshmem.core as nvshmem

        self.cupy, self.nvshmem = cupy, nvshmem
        if device is None:
            device = int(
                os.environ.get(
                    "MGG_DEVICE", self.node.Get_rank() % cupy.cuda.runtime.getDeviceCount()
                )
            )
        self.device_id = device
        cupy.cuda.Device(device).use()
        dev = cuda_device(device)
        dev.set_current()
        if self.single_node:  # the UID bootstrap's socket needs no network on one node
            os.environ.setdefault("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
        method = init_method or os.environ.get("MGG_NVSHMEM_INIT", "uid")
        if method == "uid":  # works with any MPI: the unique id travels over mpi4py
            uid = nvshmem.get_unique_id(empty=self.rank != 0)
            self.comm.Bcast(uid._data.view(np.int8), root=0)
            nvshmem.init(
                device=dev, uid=uid, rank=self.rank, nranks=self.size, initializer_method="uid"
            )
        else:  # "mpi" needs Open MPI's libmpi.so.40; "emulated_mpi" works with MPICH
            nvshmem.init(device=dev, mpi_comm=self.comm, initializer_method=method)
        self.heap = heap_bytes()
        self.used = 0
        self.arrays: list[NVSHMEMSymmetricArray] = []
        self.unreachable: dict[int, str] = {}  # peers nvshmem_ptr cannot map, and why

    def barrier(self) -> None:
        self.cupy.cuda.Device().synchronize()
        self.comm.Barrier()

    def symmetric(self, rows: int, dim: int, dtype=np.float32, window=None):
        """Collective: a [rows, dim] device array in the symmetric heap of every PE, of
        ``dtype``, or of uint16 for bfloat16 (its bits: cupy has no bf16)."""
        rows, dim = int(rows), int(dim)
        dtype = storage(dtype)
        nbytes = max(rows * dim * dtype.itemsize, 1)
        check_heap(self.used, nbytes, self.heap, rows, dim)
        sizes = self.comm.allgather((rows, dim))
        if len(set(sizes)) != 1:
            raise ValueError(
                f"symmetric arrays must have the same shape on every rank, got {sorted(set(sizes))}"
            )
        arr = self.nvshmem.array((rows, dim), dtype=dtype.name)
        self.used += nbytes
        sym = NVSHMEMSymmetricArray(self, arr)
        self.arrays.append(sym)
        return sym

    def peer_pointers(self, sym: NVSHMEMSymmetricArray):
        """uint64 [P] device array: each PE's base address of ``sym`` as this PE can load
        it (nvshmem_ptr), 0 where the peer is not reachable by loads (reasons kept in
        ``unreachable``)."""
        ptrs, self.unreachable = peer_addresses(
            lambda pe: self.nvshmem.get_peer_array(sym.array, pe),
            sym.array.data.ptr,
            self.rank,
            self.size,
        )
        return self.cupy.asarray(np.array(ptrs, np.uint64))

    def finalize(self) -> None:
        """Collective: free the symmetric arrays, release the registered modules, then
        finalize NVSHMEM (in this order: modules must not outlive the runtime)."""
        for sym in list(self.arrays):
            sym.free()
        self.barrier()
        failed = release_modules()
        self.nvshmem.finalize()
        if failed:
            raise RuntimeError("; ".join(failed))


class NVSHMEMSymmetricArray(SymmetricArray):
    def __init__(self, comm: NVSHMEMComm, array):
        self.comm, self.array = comm, array
        self.rows, self.dim = array.shape
        self.local = array
        self.mode = "nvshmem"

    def publish(self) -> None:
        self.comm.barrier()

    def free(self) -> None:
        if self.array is None:
            return
        self.comm.barrier()
        self.comm.nvshmem.free_array(self.array)
        self.comm.used -= max(self.array.nbytes, 1)
        self.comm.arrays.remove(self)
        self.array = self.local = None
