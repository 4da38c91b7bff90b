"""Where a job computes: one Backend object, resolved once and passed down.

  cpu   numpy (and scipy.sparse) arrays, numba kernels, symmetric memory in MPI windows
  cuda  cupy (and cupyx.scipy.sparse) arrays, the CUDA kernels, NVSHMEM symmetric memory

A Backend knows its array module, host/device transfers, the world comm of the job, its
aggregation designs and its training kernels (dropout, SDDMM), which the torch ops of
mgg.torch call on views of their tensors. cupy is imported lazily: the cpu backend never
touches it.
"""

from __future__ import annotations

import functools
import os
import platform

import numpy as np
import scipy.sparse as sp

from .arrays import on_gpu, to_host
from .comm import get_comm
from .designs import Design, design_names, get_design
from .knobs import DEFAULTS, JOB_KNOBS, Knobs
from .process import refuse_bad_environment
from .tuner.model import cpu_device

NAMES = ("cpu", "cuda")


def assign(dst, src) -> None:
    """dst[...] = src, copying a host array up when dst lives on the GPU."""
    dst[...] = get_backend("cuda").to_device(src) if on_gpu(dst) and not on_gpu(src) else src


class Backend:
    """name: 'cpu' or 'cuda'. ``gpu`` says whether arrays live on a GPU."""

    def __init__(self, name: str):
        refuse_bad_environment()  # a job's threads as the user set them, or none
        if name not in NAMES:
            raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
        self.name = name
        self.gpu = name == "cuda"

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"

    @functools.cached_property
    def xp(self):
        """The array module: numpy or cupy."""
        if self.gpu:
            import cupy

            return cupy
        return np

    @functools.cached_property
    def nn(self):
        """The training kernels: dropout_dense, dropout_csr, edge_dropout, sddmm (same
        signatures on both backends)."""
        if self.gpu:
            from .kernels.cuda import nn_ops

            return nn_ops
        from .kernels import cpu_nn

        return cpu_nn

    def to_device(self, a):
        """``a`` as an array of this backend (cupy / cupyx CSR on cuda); no copy on cpu."""
        if not self.gpu:
            return to_host(a)
        import cupy

        if sp.issparse(a):
            import cupyx.scipy.sparse as csp

            return csp.csr_matrix(sp.csr_matrix(a))
        return cupy.asarray(a)

    def sync(self) -> None:
        """Wait for the device's queued work (a no-op on cpu)."""
        if self.gpu:
            import cupy

            cupy.cuda.Device().synchronize()

    def peak_device_bytes(self, comm=None) -> int | None:
        """This process's peak device memory in its pools: torch's caching allocator (its
        peak reserved), CuPy's pool (what it holds now, which is its peak: it frees nothing
        back) and the NVSHMEM heap of ``comm``, where it has one; the CUDA context is not
        counted. None on cpu."""
        if not self.gpu:
            return None
        import cupy
        import torch

        pools = torch.cuda.max_memory_reserved() + cupy.get_default_memory_pool().total_bytes()
        return int(pools + (getattr(comm, "heap", 0) if getattr(comm, "device_memory", 0) else 0))

    def comm(self, knobs: Knobs = DEFAULTS):
        """The world comm of this job. MPI comes up first on every backend, so that from
        here on a failing rank aborts the job, in the window ``knobs.window`` (None: auto);
        cuda then takes NVSHMEM for device memory when there are peers, or when the kernel
        reads through NVSHMEM gets (``knobs.remote`` 'get', even on one PE)."""
        world = get_comm("mpi", window=knobs.window)
        if self.gpu and (world.size > 1 or knobs.remote == "get"):
            return get_comm("nvshmem")
        return world

    def design(self, name: str):
        """The design class ``name`` of this backend (mgg.designs)."""
        return get_design(self.name, name)

    def takes(self, *designs: str | type[Design]) -> tuple[str, ...]:
        """The knobs a job of these designs takes: the backend's (JOB_KNOBS) and any of
        the designs' (each by name or class), in mgg.knobs' order."""
        names = set(JOB_KNOBS[self.name])
        for d in designs:
            names.update((self.design(d) if isinstance(d, str) else d).knobs)
        return tuple(k for k in DEFAULTS.to_json() if k in names)

    def job(self, *designs: str) -> str:
        """How errors name a job of these designs: 'the pipelined design on cpu'."""
        names = list(designs) or ["no"]
        which = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return f"the {which} design{'s' if len(names) > 1 else ''} on {self.name}"

    def designs(self) -> list[str]:
        return design_names(self.name)

    def device(self):
        """The occupancy model's Device: this GPU's limits, or the CPU's cores."""
        if self.gpu:
            from .kernels.cuda import current_device

            return current_device()[1]
        import numba

        return cpu_device(numba.config.NUMBA_NUM_THREADS)


@functools.cache
def get_backend(name: str | Backend = "cpu") -> Backend:
    """The Backend called ``name`` (a Backend passes through)."""
    return name if isinstance(name, Backend) else Backend(name)


def describe() -> dict:
    """Versions, backends and devices of this machine (``mgg info``)."""
    import numba
    import scipy

    from . import __version__

    info = {
        "mgg": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "numba": numba.__version__,
        "cpus": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "backends": ["cpu"],
    }
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        from mpi4py import MPI

        info["mpi4py"] = mpi4py.__version__
        info["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
        info["backends"].append("mpi")
    except Exception as e:  # noqa: BLE001 - report, don't fail
        info["mpi"] = f"unavailable ({e})"
    try:
        import cupy
    except Exception:  # noqa: BLE001
        return {**info, "cupy": "not installed"}
    info["cupy"] = cupy.__version__
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        info["gpus"] = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(n)]
    except Exception as e:  # noqa: BLE001
        info["gpus"] = []
        info["cuda"] = f"no device ({e})"
    try:
        import nvshmem  # noqa: F401

        info["nvshmem4py"] = "installed"
    except Exception:  # noqa: BLE001
        info["nvshmem4py"] = "not installed"
    if info["gpus"]:
        info["backends"].append("cuda")
    return info
