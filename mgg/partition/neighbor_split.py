"""Workload-aware neighbor split: cut every row into partitions of at most ``ps``."""

from __future__ import annotations

import numba
import numpy as np


def neighbor_split(indptr, ps: int) -> tuple[np.ndarray, np.ndarray]:
    """Neighbor partitions of a CSR (the LNP or RNP array of MGG §3.1).

    indptr  int64 [n+1]
    returns (part_ptr int64 [K+1], part_node int32 [K]): partition k covers entries
    part_ptr[k]..part_ptr[k+1] of row part_node[k]. Partitions tile the entries in order,
    so the partitions of one row are consecutive and empty rows have none.
    """
    if int(ps) != ps or ps < 1:
        raise ValueError(f"ps (neighbor partition size) must be a positive integer, got {ps}")
    indptr = np.asarray(indptr, np.int64)
    first = np.zeros(indptr.size, np.int64)  # each row's first partition
    np.cumsum((np.diff(indptr) + ps - 1) // ps, out=first[1:])
    part_ptr = np.empty(int(first[-1]) + 1, np.int64)
    part_node = np.empty(part_ptr.size - 1, np.int32)
    _fill(indptr, int(ps), first, part_ptr, part_node)
    return part_ptr, part_node


@numba.njit(cache=True, parallel=True)
def _fill(indptr, ps, first, part_ptr, part_node):
    for v in numba.prange(indptr.size - 1):
        k = first[v]
        for start in range(indptr[v], indptr[v + 1], ps):
            part_ptr[k] = start
            part_node[k] = v
            k += 1
    part_ptr[part_ptr.size - 1] = indptr[-1]
