"""Slices of a graph file for the distributed partitioner: rank r of P reads only its
share, O(N + E/P) memory, through its format's slice reader (``Format.edge_slice``,
``Format.node_rows``): byte ranges of a plain edge list, edge ranges of the MGG binary
CSR and of npz members.
"""

from __future__ import annotations

import os

import numpy as np

from ..core import GraphError
from ..dataset import NodeRows
from . import FORMATS, format_of
from ._common import stem
from .base import EdgeSlice

__all__ = ["EdgeSlice", "NodeRows", "read_edge_slice", "read_node_rows", "source_checksum"]


def read_edge_slice(path, rank: int, size: int) -> EdgeSlice:
    """Rank ``rank``'s share of the edges of ``path`` (edge list, MGG binary or npz)."""
    path = os.fspath(path)
    fmt = format_of(path)
    if fmt.edge_slice is None:
        sliced = [f.sliced for f in sorted(FORMATS, key=lambda f: f.key) if f.edge_slice]
        which = " and ".join(filter(None, (", ".join(sliced[:-1]), sliced[-1])))
        raise GraphError(
            f"{path}: --distributed reads {which}; convert this file first (mgg convert)"
        )
    return fmt.edge_slice(path, rank, size)


def read_node_rows(path, lb: int, ub: int, seed: int = 0, ids=None) -> NodeRows:
    """Rows lb..ub-1 of the node data of a file whose format holds some (npz; other
    formats give none), or, under a node order, the rows of the original nodes ``ids``
    (int [ub - lb])."""
    path = os.fspath(path)
    if ids is not None:
        ids = np.asarray(ids, np.int64)
    fmt = format_of(path)
    if fmt.node_rows is None:
        return NodeRows(None, None, None, None, stem(path), "", ids)
    return fmt.node_rows(path, lb, ub, seed, ids)


def source_checksum(path) -> dict:
    """A cheap identity of a source file (or of the files of a folder): sizes and blake2b
    of each file's first and last MiB."""
    import hashlib

    path = os.fspath(path)
    if os.path.isdir(path):  # an OGB directory: every file in it
        files = sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    else:
        files = list(format_of(path).paths(path))
    h = hashlib.blake2b(digest_size=16)
    total = 0
    for p in files:
        s = os.path.getsize(p)
        total += s
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if s > 1 << 20:
                f.seek(max(s - (1 << 20), 1 << 20))
                h.update(f.read())
        h.update(f"{os.path.relpath(p, path)}:{s}".encode())
    return {"path": os.path.abspath(path), "bytes": total, "blake2b_head_tail": h.hexdigest()}
