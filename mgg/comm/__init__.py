"""mgg.comm: rank, size, collectives, symmetric arrays and one-sided gets, over MPI
(CPU) or NVSHMEM (GPU) transports."""

from __future__ import annotations

from .base import WINDOWS, Comm, SymmetricArray, on_root

__all__ = [
    "WINDOWS",
    "Comm",
    "SymmetricArray",
    "abort_job",
    "finalize",
    "get_comm",
    "job_rank",
    "on_root",
]

_world = {}


def get_comm(transport: str = "mpi", **kw) -> Comm:
    """The world communicator of this process over ``transport`` ('mpi' or 'nvshmem'),
    created once per transport and options."""
    if transport == "mpi":
        kw.setdefault("window", None)
    key = (transport, tuple(sorted(kw.items())))
    if key not in _world:
        if transport == "mpi":
            from .mpi import MPIComm

            _world[key] = MPIComm(**kw)
        elif transport == "nvshmem":
            from .nvshmem import NVSHMEMComm

            _world[key] = NVSHMEMComm(**kw)
        else:
            raise ValueError(f"unknown transport {transport!r}; choose 'mpi' or 'nvshmem'")
    return _world[key]


def _mpi_world():
    """MPI_COMM_WORLD when MPI is up but no comm was made (one failed to come up)."""
    import sys

    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    return MPI.COMM_WORLD


def job_rank() -> int:
    """This process's rank in its multi-rank job (0 when alone or before MPI is up)."""
    rank = next((c.rank for c in _world.values() if c.size > 1), None)
    if rank is None:
        world = _mpi_world()
        rank = world.Get_rank() if world is not None else 0
    return rank


def abort_job(code: int) -> None:
    """In a multi-rank job, take every rank down (a failing rank would otherwise leave
    its peers waiting in a collective). Does nothing in a job of one rank."""
    comms = [c for c in _world.values() if c.size > 1]
    for comm in comms:
        comm.abort(code)
    world = None if comms else _mpi_world()
    if world is not None and world.Get_size() > 1:
        from .mpi import abort

        abort(world, code)


def finalize() -> None:
    """Collective: finalize the device comms of this process (NVSHMEM: arrays, registered
    modules, the runtime), so that a job ends cleanly. MPI is finalized by mpi4py at exit."""
    for key in [k for k in _world if k[0] == "nvshmem"]:
        _world.pop(key).finalize()
