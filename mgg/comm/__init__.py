"""mgg.comm: rank, size, barrier, allreduce, symmetric arrays and one-sided gets."""

from __future__ import annotations

from .base import Comm, SymmetricArray

__all__ = ["Comm", "SymmetricArray", "get_comm"]

_world = {}


def get_comm(backend: str = "mpi", **kw) -> Comm:
    """The world communicator of this process (created once per backend and options)."""
    key = (backend, tuple(sorted(kw.items())))
    if key not in _world:
        if backend == "mpi":
            from .mpi import MPIComm

            _world[key] = MPIComm(**kw)
        elif backend == "nvshmem":
            from .nvshmem import NVSHMEMComm

            _world[key] = NVSHMEMComm(**kw)
        else:
            raise ValueError(f"unknown comm backend {backend!r}; choose 'mpi' or 'nvshmem'")
    return _world[key]
