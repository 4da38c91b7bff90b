"""What a file format declares to the registry (:class:`Format`, listed in
``formats.FORMATS``) and what its slice reader gives the distributed partitioner
(:class:`EdgeSlice`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["EdgeSlice", "Format"]

WEIGHTS = "weights"
NODE_DATA = "node data"  # features, labels, split masks


@dataclass(frozen=True)
class Format:
    """One file format.

    key: its short name (what ``write_format`` answers); name: in words; read(path, **kw):
    a Graph, or a Dataset where the format holds node data; suffixes: the lower-case
    endings that name it, to read and to write, with ``.gz`` after them too when ``gzip``;
    detect(path): whether what lies at ``path`` is one whatever its name (checked after
    the suffixes); write(data, *files): ``data`` a Dataset where ``holds`` node data, else
    a Graph, into ``files(path)`` (the path itself by default); written: how write_graph's
    refusal lists it; holds: what it keeps besides the graph (WEIGHTS, NODE_DATA);
    edge_slice(path, rank, size): rank's EdgeSlice for the distributed partitioner,
    sliced: how its refusal lists it; node_rows(path, lb, ub, seed, ids): a NodeRows
    (without it, a rank reads no node data).
    """

    key: str
    name: str
    read: Callable[..., Any]
    suffixes: tuple[str, ...] = ()
    gzip: bool = False
    detect: Callable[[str], bool] | None = None
    write: Callable[..., None] | None = None
    files: Callable[[str], tuple[str, ...]] | None = None
    written: str = ""
    holds: frozenset[str] = frozenset({WEIGHTS})
    edge_slice: Callable[[str, int, int], EdgeSlice] | None = None
    sliced: str = ""
    node_rows: Callable[..., Any] | None = None

    def named(self, path: str) -> bool:
        """Whether ``path``'s name ends in one of the suffixes."""
        name = os.path.basename(path).lower()
        text = name.removesuffix(".gz")
        return any(text.endswith(s) and (text == name or self.gzip) for s in self.suffixes)

    def recognises(self, path: str) -> bool:
        return self.named(path) or (self.detect is not None and self.detect(path))

    def paths(self, path: str) -> tuple[str, ...]:
        """The files of the graph at ``path``."""
        return self.files(path) if self.files is not None else (path,)


class EdgeSlice(NamedTuple):
    """One rank's contiguous slice of a graph's edges u -> v, in the file's order.

    src, dst int64 [e]; weights float32 [e] or None; num_nodes N when the file says it (a
    CSR), else None (then max id + 1 over all ranks, at least ``min_nodes``);
    symmetric: the file declares the graph undirected (checked by the partitioner);
    source: the file named in errors; offset: where the slice's first edge is;
    header_nodes: an edge list's ``# Nodes: N`` seen before the slice's first edge (it
    counts only before the file's first edge).
    """

    src: np.ndarray
    dst: np.ndarray
    weights: np.ndarray | None
    num_nodes: int | None
    min_nodes: int
    symmetric: bool
    source: str
    offset: str = ""
    header_nodes: int | None = None
