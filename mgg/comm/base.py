"""The comm interface every backend implements (MPI on CPUs, NVSHMEM on GPUs): all that
the designs, the nn layers and the trainer use."""

from __future__ import annotations

import contextlib

import numpy as np

from ..errors import one_line
from ..knobs import WINDOWS  # noqa: F401 - the job's windows, mgg.comm.WINDOWS to the designs


class Comm:
    """rank, size, collectives on small host arrays, and symmetric allocation.

    ``window``: the default SymmetricArray mode ('shm', 'rma', 'msg'; ``window_asked``:
    the user's choice, not auto's), ``windows`` those this job can use, ``window_choices``
    those a tuner measures against each other here; ``device_memory``: whether
    symmetric arrays live on the GPU (NVSHMEM), where ``peer_pointers`` gives every PE's
    address of an array and ``unreachable`` the peers that loads cannot reach, and why.
    """

    rank: int = 0
    size: int = 1
    window: str = "rma"
    window_asked: bool = False
    windows: tuple[str, ...] = ("rma",)
    device_memory: bool = False
    unreachable: dict[int, str] = {}
    window_choices: tuple[str, ...] = ()  # the windows a tuner measures against each other

    def barrier(self) -> None:
        raise NotImplementedError

    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        """Element-wise 'sum', 'max' or 'min' over ranks of a host array."""
        raise NotImplementedError

    def bcast(self, obj, root: int = 0):
        raise NotImplementedError

    def allgather(self, obj) -> list:
        raise NotImplementedError

    def gather(self, obj, root: int = 0) -> list | None:
        """Every rank's obj, in rank order, on ``root`` (None elsewhere)."""
        raise NotImplementedError

    def alltoall(self, objs: list) -> list:
        """objs[i] goes to rank i; returns what each rank sent here."""
        raise NotImplementedError

    def alltoallv(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> None:
        """Rows of send [sum(send_counts), D] go to each peer; recv likewise (row counts)."""
        raise NotImplementedError

    def symmetric(self, rows: int, dim: int, dtype=np.float32, window=None) -> SymmetricArray:
        """Collective: a [rows, dim] array on every rank, readable by every peer."""
        raise NotImplementedError

    def peer_pointers(self, sym: SymmetricArray):
        """uint64 [P] device array: every PE's address of ``sym`` (device memory only)."""
        raise NotImplementedError

    def abort(self, code: int = 1) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def alone(self):
        """Work this rank does while its peers wait for it in a collective: a collective
        watchdog (MPIComm's) lets them wait as long as it takes."""
        yield


class SymmetricArray:
    """A [rows, dim] array allocated collectively with the same shape on every rank.

    ``local`` is this rank's [rows, dim] array; peers read it with one-sided gets
    (``selection`` + ``rget``) or, in the 'shm' mode, with loads from ``node_view``.
    """

    rows: int
    dim: int
    mode: str
    local: np.ndarray

    def publish(self) -> None:
        """Collective: local writes become visible to every peer."""
        raise NotImplementedError

    def selection(self, pe: int, rows, slots=None):
        """A reusable transfer: rows ``rows`` of ``pe`` into ``slots`` of a receiving
        buffer (consecutive when None). Free it with ``.free()``."""
        raise NotImplementedError

    def rget(self, sel, out: np.ndarray):
        """Start fetching a selection into out [*, dim]; returns a request to Wait() on,
        or None when the rows are already there."""
        raise NotImplementedError

    @property
    def node_view(self) -> np.ndarray:
        """[node_size * rows, dim]: every rank's rows on this node ('shm' mode)."""
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError


def on_root(comm, fn, catch: tuple = (), error=RuntimeError, message=one_line, share=True):
    """Collective over ``comm`` (None: one process): ``fn()`` run on rank 0 (its peers
    waiting, as long as it takes: Comm.alone), its value returned there and, with
    ``share``, on every rank (else None elsewhere); an exception of a type in ``catch``
    there raised on every rank as ``error(message(e))``, so no peer waits on a rank that
    failed."""
    value, problem = None, None
    if comm is None or comm.rank == 0:
        try:
            with contextlib.nullcontext() if comm is None else comm.alone():
                value = fn()
        except catch as e:
            problem = message(e)
    if comm is not None and comm.size > 1:
        shared, problem = comm.bcast((value if share else None, problem), root=0)
        value = shared if share or comm.rank != 0 else value
    if problem:
        raise error(problem)
    return value
