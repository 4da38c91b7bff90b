"""Readers and writers of graph files.

Formats: SNAP-style edge lists (text or gzip), METIS ``.graph``, the ``.npz`` dataset layout
of ``shared/data`` (see its MANIFEST.md), the MGG artifact's binary CSR
(``<prefix>_beg_pos.bin`` + ``<prefix>_csr.bin``, raw little-endian int64), and (read only)
OGB node-property-prediction directories.

Every reader rejects malformed input with :class:`GraphError` whose message starts with the
file name, then where (``line 12``, ``element 5 (byte offset 40)``, ``key 'x'``), then what
is wrong. Text is parsed in bulk with numpy; when a chunk looks wrong, a line-by-line pass
over that chunk finds the first bad line and reports it.
"""

from __future__ import annotations

import os

from ...atomic import atomic_write
from ...errors import InputError
from ..core import Graph
from ..dataset import Dataset
from ._common import BEG_SUFFIX, CSR_SUFFIX, stem
from .edgelist import read_edgelist, write_edgelist
from .metis import read_metis, write_metis
from .mgg_bin import _mgg_paths, _write_files, read_mgg_bin, write_mgg_bin
from .npz import read_npz, write_npz
from .ogb import is_ogb_dir, read_ogb

__all__ = [
    "read_edgelist",
    "write_edgelist",
    "read_metis",
    "write_metis",
    "read_npz",
    "write_npz",
    "read_mgg_bin",
    "write_mgg_bin",
    "read_ogb",
    "is_ogb_dir",
    "read_graph",
    "read_dataset",
    "write_graph",
    "dropped_on_write",
    "format_name",
    "write_format",
]

FORMAT_NAMES = {
    "npz": "npz",
    "mgg": "MGG binary CSR",
    "metis": "METIS",
    "edgelist": "edge list",
    "ogb": "OGB directory",
}


def _format(path: str) -> str:
    if is_ogb_dir(path):
        return "ogb"
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


# what write_graph writes, by suffix (a text format may end in .gz too: gzipped)
WRITES = {
    ".npz": "npz",
    ".txt": "edgelist",
    ".csv": "edgelist",
    ".tsv": "edgelist",
    ".el": "edgelist",
    ".edges": "edgelist",
    ".graph": "metis",
    ".metis": "metis",
    BEG_SUFFIX: "mgg",
    CSR_SUFFIX: "mgg",
}
WRITTEN = (
    ".npz (everything), .txt/.csv/.tsv/.el/.edges (edge list), .graph/.metis (METIS), "
    "those two gzipped with .gz added (x.txt.gz), or *_beg_pos.bin (MGG binary CSR)"
)


def write_format(path) -> str:
    """The format :func:`write_graph` writes to ``path``, by its suffix; InputError naming
    the suffix and the formats mgg writes when it writes none there (or path is a folder)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory; write to a file: {WRITTEN}")
    name = os.path.basename(path).lower()
    text = name.removesuffix(".gz")
    for suffix, fmt in WRITES.items():
        if text.endswith(suffix) and (text == name or fmt in ("edgelist", "metis")):
            return fmt
    suffix = os.path.splitext(text)[1] + name[len(text) :]  # '.npy', '.npz.gz', '.gz'
    what = f"{suffix!r} files" if suffix else "files without a suffix"
    raise InputError(f"{path}: mgg writes no {what}; it writes {WRITTEN}")


def format_name(path) -> str:
    """The format :func:`read_graph` and :func:`write_graph` pick for ``path``, in words."""
    return FORMAT_NAMES[_format(os.fspath(path))]


def read_graph(path, **kw) -> Graph:
    """Read a graph, choosing the reader by suffix: ``.npz``, ``.graph``/``.metis``,
    ``_beg_pos.bin``/``_csr.bin`` (or a prefix of those), an OGB directory, anything else as
    an edge list (``kw`` goes to :func:`read_edgelist`).
    """
    path = os.fspath(path)
    fmt = _format(path)
    if fmt == "ogb":
        return read_ogb(path, **kw).graph
    if fmt == "npz":
        return read_npz(path, **kw).graph
    if fmt == "metis":
        return read_metis(path, **kw)
    if fmt == "mgg":
        return read_mgg_bin(path, **kw)
    return read_edgelist(path, **kw)


def read_dataset(path, **kw) -> Dataset:
    """A Dataset from any format: the full npz or OGB contents, else only the graph (name =
    stem)."""
    path = os.fspath(path)
    if _format(path) == "ogb":
        return read_ogb(path, **kw)
    if _format(path) == "npz":
        return read_npz(path, **kw)
    return Dataset(stem(path), read_graph(path, **kw))


def write_graph(graph: Graph | Dataset, path) -> None:
    """Write by suffix (:data:`WRITES`; another suffix is refused, InputError); a Dataset
    keeps its node data in npz.

    Atomic: the file (both files of the MGG binary) is written under a temporary name in
    the same folder and renamed into place, so a failed write leaves the old file or none.
    """
    fmt = write_format(path)
    path = os.fspath(path)
    if fmt == "npz":
        ds = graph if isinstance(graph, Dataset) else Dataset(stem(path), graph)
        with atomic_write(path) as tmp:
            write_npz(ds, tmp)
        return
    g = graph.graph if isinstance(graph, Dataset) else graph
    if fmt == "mgg":
        beg, csr = _mgg_paths(path)
        with atomic_write(beg, csr) as tmps:
            _write_files(g, *tmps)
        return
    with atomic_write(path) as tmp:
        if fmt == "metis":
            write_metis(g, tmp)
        else:
            write_edgelist(g, tmp)


def dropped_on_write(graph: Graph | Dataset, path) -> list[str]:
    """What :func:`write_graph` of ``graph`` to ``path`` cannot keep (e.g. ``["features",
    "labels"]``); empty when the format holds everything."""
    fmt = write_format(path)
    g = graph.graph if isinstance(graph, Dataset) else graph
    lost = []
    if fmt != "npz" and isinstance(graph, Dataset):
        for what, value in (
            ("features", graph.x),
            ("labels", graph.y),
            ("split masks", graph.train_mask),
        ):
            if value is not None:
                lost.append(what)
    if fmt == "mgg" and g.weights is not None:
        lost.append("edge weights")
    return lost
