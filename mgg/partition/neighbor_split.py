"""Workload-aware neighbor split: cut every row into partitions of at most ``ps``."""

from __future__ import annotations

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
    deg = np.diff(indptr)
    nparts = (deg + ps - 1) // ps
    k = int(nparts.sum())
    part_node = np.repeat(np.arange(deg.size, dtype=np.int32), nparts)
    first = np.cumsum(nparts) - nparts
    part_ptr = np.empty(k + 1, np.int64)
    part_ptr[:k] = indptr[:-1][part_node] + (np.arange(k) - first[part_node]) * ps
    part_ptr[k] = indptr[-1]
    return part_ptr, part_node
