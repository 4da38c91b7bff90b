"""Readers and writers of graph files, in one registry: :data:`FORMATS`.

Formats: SNAP-style edge lists (text or gzip), METIS ``.graph``, the ``.npz`` dataset layout
of ``shared/data`` (see its MANIFEST.md), the MGG artifact's binary CSR
(``<prefix>_beg_pos.bin`` + ``<prefix>_csr.bin``, raw little-endian int64), and (read only)
OGB node-property-prediction directories. Each is one module that declares its
:class:`~.base.Format` (suffixes, reader, writer, slice readers, what it holds), and one
line of :data:`FORMATS`; :func:`read_graph`, :func:`write_graph` and the distributed
partitioner's slices (:mod:`.slices`) dispatch through it.

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
from . import edgelist, metis, mgg_bin, npz, ogb
from ._common import stem
from .base import NODE_DATA, WEIGHTS, Format
from .edgelist import read_edgelist, write_edgelist
from .metis import read_metis, write_metis
from .mgg_bin import read_mgg_bin, write_mgg_bin
from .npz import read_npz, write_npz
from .ogb import is_ogb_dir, read_ogb

__all__ = [
    "FORMATS",
    "Format",
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
    "format_of",
    "read_graph",
    "read_dataset",
    "write_graph",
    "dropped_on_write",
    "format_name",
    "write_format",
]

# A path is read as the first format that recognises it, else as DEFAULT; write_graph's
# refusal lists the writable ones in this order.
FORMATS = (
    ogb.FORMAT,
    npz.FORMAT,
    edgelist.FORMAT,
    metis.FORMAT,
    mgg_bin.FORMAT,
)
DEFAULT = edgelist.FORMAT  # any file no other format recognises


def _written() -> str:
    """The writable formats, in words: '.npz (everything), ..., or *_beg_pos.bin (...)'."""
    writable = [f for f in FORMATS if f.write is not None]
    words = [f.written for f in writable]
    gz = [f for f in writable if f.gzip]
    if gz:
        count = {1: "that one", 2: "those two"}.get(len(gz), f"those {len(gz)}")
        at = writable.index(gz[-1]) + 1
        words.insert(at, f"{count} gzipped with .gz added (x{gz[0].suffixes[0]}.gz)")
    return ", ".join(words[:-1]) + ", or " + words[-1]


WRITTEN = _written()


def format_of(path) -> Format:
    """The format :func:`read_graph` reads ``path`` as."""
    path = os.fspath(path)
    for fmt in FORMATS:
        if fmt is not DEFAULT and fmt.recognises(path):
            return fmt
    return DEFAULT


def _writer(path) -> Format:
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory; write to a file: {WRITTEN}")
    for fmt in FORMATS:
        if fmt.write is not None and fmt.named(path):
            return fmt
    name = os.path.basename(path).lower()
    text = name.removesuffix(".gz")
    suffix = os.path.splitext(text)[1] + name[len(text) :]  # '.npy', '.npz.gz', '.gz'
    what = f"{suffix!r} files" if suffix else "files without a suffix"
    raise InputError(f"{path}: mgg writes no {what}; it writes {WRITTEN}")


def write_format(path) -> str:
    """The key of the format :func:`write_graph` writes to ``path``, by its suffix;
    InputError naming the suffix and the formats mgg writes when it writes none there (or
    path is a folder)."""
    return _writer(path).key


def format_name(path) -> str:
    """The format :func:`read_graph` and :func:`write_graph` pick for ``path``, in words."""
    return format_of(path).name


def read_graph(path, **kw) -> Graph:
    """Read a graph in the format that recognises ``path`` (:func:`format_of`): ``.npz``,
    ``.graph``/``.metis``, ``_beg_pos.bin``/``_csr.bin`` (or a prefix of those), an OGB
    directory, anything else as an edge list (``kw`` goes to the reader:
    :func:`read_edgelist`'s, :func:`read_ogb`'s).
    """
    path = os.fspath(path)
    data = format_of(path).read(path, **kw)
    return data.graph if isinstance(data, Dataset) else data


def read_dataset(path, **kw) -> Dataset:
    """A Dataset from any format: the full npz or OGB contents, else only the graph (name =
    stem)."""
    path = os.fspath(path)
    data = format_of(path).read(path, **kw)
    return data if isinstance(data, Dataset) else Dataset(stem(path), data)


def write_graph(graph: Graph | Dataset, path) -> None:
    """Write by suffix (:func:`write_format`; another suffix is refused, InputError); a
    Dataset keeps its node data in npz.

    Atomic: the file (both files of the MGG binary) is written under a temporary name in
    the same folder and renamed into place, so a failed write leaves the old file or none.
    """
    fmt = _writer(path)
    path = os.fspath(path)
    if NODE_DATA in fmt.holds:
        data = graph if isinstance(graph, Dataset) else Dataset(stem(path), graph)
    else:
        data = graph.graph if isinstance(graph, Dataset) else graph
    files = fmt.paths(path)
    with atomic_write(*files) as tmps:
        fmt.write(data, *(tmps if len(files) > 1 else (tmps,)))


def dropped_on_write(graph: Graph | Dataset, path) -> list[str]:
    """What :func:`write_graph` of ``graph`` to ``path`` cannot keep (e.g. ``["features",
    "labels"]``); empty when the format holds everything."""
    fmt = _writer(path)
    g = graph.graph if isinstance(graph, Dataset) else graph
    lost = []
    if NODE_DATA not in fmt.holds and isinstance(graph, Dataset):
        for what, value in (
            ("features", graph.x),
            ("labels", graph.y),
            ("split masks", graph.train_mask),
        ):
            if value is not None:
                lost.append(what)
    if WEIGHTS not in fmt.holds and g.weights is not None:
        lost.append("edge weights")
    return lost
