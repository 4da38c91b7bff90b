"""Readers and writers of graph files.

Formats: SNAP-style edge lists (text or gzip), METIS ``.graph``, the ``.npz`` dataset layout
of ``shared/data`` (see its MANIFEST.md), and the MGG artifact's binary CSR
(``<prefix>_beg_pos.bin`` + ``<prefix>_csr.bin``, raw little-endian int64).

Every reader rejects malformed input with :class:`GraphError` whose message starts with the
file name, then where (``line 12``, ``element 5 (byte offset 40)``, ``key 'x'``), then what
is wrong. Text is parsed in bulk with numpy; when a chunk looks wrong, a line-by-line pass
over that chunk finds the first bad line and reports it.
"""

from __future__ import annotations

import os

from ..core import Graph
from ..dataset import Dataset
from ._common import BEG_SUFFIX, CSR_SUFFIX, stem
from .edgelist import read_edgelist, write_edgelist
from .metis import read_metis, write_metis
from .mgg_bin import read_mgg_bin, write_mgg_bin
from .npz import read_npz, write_npz

__all__ = [
    "read_edgelist",
    "write_edgelist",
    "read_metis",
    "write_metis",
    "read_npz",
    "write_npz",
    "read_mgg_bin",
    "write_mgg_bin",
    "read_graph",
    "read_dataset",
    "write_graph",
]


def _format(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((BEG_SUFFIX, CSR_SUFFIX)):
        return "mgg"
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith((".graph", ".metis")):
        return "metis"
    if not os.path.exists(path) and os.path.exists(path + BEG_SUFFIX):
        return "mgg"
    return "edgelist"


def read_graph(path, **kw) -> Graph:
    """Read a graph, choosing the reader by suffix: ``.npz``, ``.graph``/``.metis``,
    ``_beg_pos.bin``/``_csr.bin`` (or a prefix of those), anything else as an edge list
    (``kw`` goes to :func:`read_edgelist`).
    """
    path = os.fspath(path)
    fmt = _format(path)
    if fmt == "npz":
        return read_npz(path, **kw).graph
    if fmt == "metis":
        return read_metis(path, **kw)
    if fmt == "mgg":
        return read_mgg_bin(path, **kw)
    return read_edgelist(path, **kw)


def read_dataset(path, **kw) -> Dataset:
    """A Dataset from any format: the full npz contents, else only the graph (name = stem)."""
    path = os.fspath(path)
    if _format(path) == "npz":
        return read_npz(path, **kw)
    return Dataset(stem(path), read_graph(path, **kw))


def write_graph(graph: Graph | Dataset, path) -> None:
    """Write by suffix, as :func:`read_graph` reads; a Dataset keeps its node data in npz."""
    path = os.fspath(path)
    fmt = _format(path)
    if fmt == "npz":
        ds = graph if isinstance(graph, Dataset) else Dataset(stem(path), graph)
        write_npz(ds, path)
        return
    g = graph.graph if isinstance(graph, Dataset) else graph
    if fmt == "metis":
        write_metis(g, path)
    elif fmt == "mgg":
        write_mgg_bin(g, path)
    else:
        write_edgelist(g, path)
