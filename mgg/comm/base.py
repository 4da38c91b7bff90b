"""The comm interface every backend implements (MPI on CPUs, NVSHMEM on GPUs)."""

from __future__ import annotations

import numpy as np


class Comm:
    """rank, size, collectives on small host arrays, and symmetric allocation."""

    rank: int = 0
    size: int = 1

    def barrier(self) -> None:
        raise NotImplementedError

    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        raise NotImplementedError

    def bcast(self, obj, root: int = 0):
        raise NotImplementedError

    def allgather(self, obj) -> list:
        raise NotImplementedError

    def alltoall(self, objs: list) -> list:
        """objs[i] goes to rank i; returns what each rank sent here."""
        raise NotImplementedError

    def symmetric(self, rows: int, dim: int, dtype=np.float32) -> SymmetricArray:
        raise NotImplementedError

    def abort(self, code: int = 1) -> None:
        raise NotImplementedError


class SymmetricArray:
    """A [rows, dim] array allocated collectively with the same shape on every rank.

    ``local`` is this rank's [rows, dim] array; peers read it with one-sided gets.
    """

    rows: int
    dim: int
    local: np.ndarray

    def publish(self) -> None:
        """Collective: local writes become visible to every peer."""
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError
