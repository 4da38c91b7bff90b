"""mgg.comm: rank, size, barrier, allreduce, symmetric arrays and one-sided gets."""

from __future__ import annotations

from .base import Comm, SymmetricArray

__all__ = ["Comm", "SymmetricArray", "finalize", "get_comm"]

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


def finalize() -> None:
    """Collective: finalize the device comms of this process (NVSHMEM: arrays, registered
    modules, the runtime), so that a job ends cleanly. MPI is finalized by mpi4py at exit."""
    for key in [k for k in _world if k[0] == "nvshmem"]:
        _world.pop(key).finalize()
