"""Node orders (``--order``): a permutation of node ids computed before Algorithm 1, so
that the contiguous ranges it cuts hold neighbourhoods and fewer rows cross ranks.

  natural  the graph's own numbering
  degree   hubs first: in + out degree, descending (ties by id)
  rcm      reverse Cuthill-McKee of the symmetrized structure (scipy.sparse.csgraph)
  metis    METIS k-way into P parts (pymetis, the ``metis`` extra), vertex weights what
           the job's split balances (edges: in-degree + 1, as Algorithm 1 does; nodes:
           1; mixed: both shares); numbered part by part (the graph's order within a
           part), so the split's ranges are METIS's parts up to its 3% imbalance; one
           part (P = 1) is the natural order

A permutation ``perm`` int64 [N] maps new ids to original ones: new node i is original
node ``perm[i]`` (scipy's convention, ``A[perm][:, perm]``); ``Order.rank`` is its
inverse. Everything a user gets back is indexed by original id (``Order.ids``).

An order file (``--save-order F.npy``, read by ``--order-file``) is a plain .npy of the
permutation, int64 [N], that ``np.load`` reads (its header is checked before a byte of
the array is read: an .npz, a text file, an empty or truncated file is named as such);
after the array's bytes, which numpy does not read, it records the order's name and the
fingerprint of the graph it was computed for (``graph_fingerprint``), so that it is
refused for another graph. A .npy written by anything else is taken as a bare
permutation, checked for its length and that it is one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..atomic import atomic_write, check_folder
from ..errors import InputError
from ..graph.core import Graph, inverse
from ..graph.formats._common import npy_header
from ..knobs import DEFAULTS, ORDERS

TRAILER = b"\n#mgg-order "  # then one line of JSON: name, num_nodes, graph fingerprint
METIS_INSTALL = "pip install 'mgg[metis]' (or pip install pymetis)"


class OrderError(InputError):
    """An order file that is not a permutation of this graph's nodes, or an order that
    cannot be computed here."""


@dataclass(frozen=True, eq=False)
class Order:
    """A node order of an N-node graph: ``perm`` int64 [N] (new id -> original id; None:
    natural), its name (ORDERS; read from a file: the name it records, else 'file'),
    the seconds it took to compute, and the file it was read from."""

    name: str = "natural"
    perm: np.ndarray | None = None
    seconds: float = 0.0
    source: str | None = None

    @property
    def natural(self) -> bool:
        return self.perm is None

    def ids(self, lb: int, ub: int) -> np.ndarray | None:
        """int64 [ub - lb]: the original ids of new nodes lb..ub-1; None in natural order
        (they are lb..ub-1: what Dataset.rows, read_node_rows and random_features take)."""
        return None if self.perm is None else self.perm[lb:ub]

    @cached_property
    def rank(self) -> np.ndarray:
        """int64 [N]: the new id of each original node (the inverse permutation)."""
        return inverse(self.perm)

    def apply(self, graph: Graph) -> Graph:
        """``graph`` with its nodes renumbered in this order."""
        return graph if self.perm is None else graph.permute(self.perm, rank=self.rank)

    def to_original(self, rows: np.ndarray) -> np.ndarray:
        """rows [N, ...] indexed by new id -> the same rows indexed by original id."""
        return rows if self.perm is None else rows[self.rank]


def compute(
    graph: Graph, name: str, parts: int = 1, seed: int = 0, split: str = DEFAULTS.split
) -> Order:
    """The order ``name`` (ORDERS) of ``graph``; ``parts``: METIS's part count (the
    job's ranks P); ``seed``: METIS's; ``split``: what METIS's parts balance (the knob:
    the job's node split)."""
    if name not in ORDERS:
        raise OrderError(f"unknown order {name!r}; choose one of {', '.join(ORDERS)}")
    t0 = time.perf_counter()
    if name == "natural":
        perm = None
    elif name == "degree":
        perm = degree_order(graph.in_degrees() + graph.out_degrees())
    elif name == "rcm":
        perm = _rcm(graph)
    else:
        perm = _metis(graph, parts, seed, split)
    return Order(name, perm, time.perf_counter() - t0)


def degree_order(degrees: np.ndarray) -> np.ndarray:
    """int64 [N]: node ids by ``degrees`` [N], highest first, ties by id."""
    return np.argsort(-np.asarray(degrees, np.int64), kind="stable").astype(np.int64)


def _structure(graph: Graph):
    """The symmetric 0/1 structure of ``graph`` without self loops (scipy CSR of bools,
    sorted rows): what RCM and METIS order."""
    import scipy.sparse as sp

    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges, bool), graph.indices, graph.indptr), shape=(n, n))
    s = (a + a.T).tocsr() if not graph.symmetric else a  # bools: duplicates cannot overflow
    s.sum_duplicates()
    rows = np.repeat(np.arange(n, dtype=s.indices.dtype), np.diff(s.indptr))
    keep = s.indices != rows
    if not keep.all():  # drop the loops (scipy's setdiag would rebuild the matrix)
        kept = np.zeros(keep.size + 1, np.int64)
        np.cumsum(keep, out=kept[1:])
        s = sp.csr_matrix((s.data[keep], s.indices[keep], kept[s.indptr]), shape=(n, n))
    return s


def _rcm(graph: Graph) -> np.ndarray:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    if graph.num_nodes == 0:
        return np.zeros(0, np.int64)
    return reverse_cuthill_mckee(_structure(graph), symmetric_mode=True).astype(np.int64)


def metis_weights(graph: Graph, split: str = DEFAULTS.split) -> np.ndarray:
    """int64 [N]: each node's weight in what the split balances (mgg.partition.node_split):
    its edges in GCN's graph (in-degree + 1), 1 for nodes, or for mixed its share of the
    edges plus its share of the nodes (in hundredths of a node's)."""
    deg = graph.in_degrees() + 1
    if split == "nodes":
        return np.ones(graph.num_nodes, np.int64)
    if split == "mixed":
        return np.rint(100 * (deg * (graph.num_nodes / deg.sum()) + 1)).astype(np.int64)
    return deg


def _metis(graph: Graph, parts: int, seed: int, split: str) -> np.ndarray | None:
    try:
        import pymetis
    except ImportError:
        raise OrderError(f"--order metis needs pymetis: {METIS_INSTALL}") from None
    n = graph.num_nodes
    if parts <= 1 or n <= parts:  # one part: the natural order
        return None
    s = _structure(graph)
    it = pymetis.zero_copy_dtype()
    adjacency = pymetis.CSRAdjacency(s.indptr.astype(it), s.indices.astype(it))
    part = pymetis.part_graph(
        parts,
        adjacency,
        vweights=metis_weights(graph, split).astype(it),
        options=pymetis.Options(seed=seed),
    ).vertex_part
    return np.argsort(np.asarray(part), kind="stable").astype(np.int64)


# ---- checking, saving and reading ---------------------------------------------------------
def graph_fingerprint(num_nodes: int, num_edges: int, in_degrees, out_degrees) -> str:
    """An identity of a graph that any reader computes in O(N) without the whole graph
    (the distributed partitioner from its degree counts): its sizes and the blake2b of
    its in- and out-degree sequences; the same for a graph in any file format."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.array([num_nodes, num_edges], np.int64).tobytes())
    for d in (in_degrees, out_degrees):
        h.update(np.ascontiguousarray(d, np.int64).tobytes())
    return h.hexdigest()


def fingerprint_of(graph: Graph) -> str:
    return graph_fingerprint(
        graph.num_nodes, graph.num_edges, graph.in_degrees(), graph.out_degrees()
    )


def check_perm(perm: np.ndarray, num_nodes: int, source: str) -> np.ndarray:
    """``perm`` as int64 [N] when it is a permutation of 0..N-1, else OrderError naming
    ``source``."""
    perm = np.asarray(perm)
    if perm.ndim != 1 or not (perm.size == 0 or np.issubdtype(perm.dtype, np.integer)):
        raise OrderError(f"{source}: expected a 1-D integer array, got {perm.dtype} {perm.shape}")
    if perm.size != num_nodes:
        raise OrderError(
            f"{source}: {perm.size:,} entries, but the graph has {num_nodes:,} nodes: an "
            "order of another graph"
        )
    perm = perm.astype(np.int64, copy=False)
    if num_nodes and (perm.min() < 0 or perm.max() >= num_nodes):
        bad = int(np.flatnonzero((perm < 0) | (perm >= num_nodes))[0])
        raise OrderError(f"{source}: entry {bad} is {perm[bad]}, outside [0, {num_nodes})")
    seen = np.bincount(perm, minlength=num_nodes)
    if num_nodes and seen.max() > 1:
        node = int(np.argmax(seen > 1))
        raise OrderError(
            f"{source}: node {node} appears {seen[node]} times (and {int((seen == 0).sum()):,} "
            "nodes not at all): not a permutation"
        )
    return perm


def check_target(path) -> None:
    """OrderError unless ``path`` may take an order file (a .npy in a folder that exists),
    before the order is computed."""
    path = os.fspath(path)
    if not path.endswith(".npy"):
        raise OrderError(f"{path}: an order file is a .npy (--save-order F.npy)")
    check_folder(path)


def save(path, order: Order, fingerprint: str) -> None:
    """Write ``order`` to ``path`` (.npy) atomically, with its name and the ``fingerprint``
    of its graph after the array."""
    path = os.fspath(path)
    check_target(path)
    if order.perm is None:
        raise OrderError(f"{path}: the natural order needs no file")
    facts = {"order": order.name, "num_nodes": int(order.perm.size), "graph": fingerprint}
    with atomic_write(path) as tmp, open(tmp, "wb") as f:
        np.save(f, order.perm.astype(np.int64, copy=False), allow_pickle=False)
        f.write(TRAILER + json.dumps(facts).encode() + b"\n")


def read(path, num_nodes: int, fingerprint: str | None = None) -> Order:
    """The order in ``path`` for a graph of ``num_nodes`` nodes (and ``fingerprint``,
    where the file records one): OrderError naming the file otherwise (anything but a
    .npy of a 1-D integer array: an .npz, a text file, a folder, an empty or truncated
    file)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            dtype, count = _npy_array(f, path)
            offset = f.tell()
            f.seek(offset + count * dtype.itemsize)
            tail = f.read(4096)
            facts = _check_record(path, tail, fingerprint)  # another graph's: named so
            if count != num_nodes:
                raise OrderError(
                    f"{path}: {count:,} entries, but the graph has {num_nodes:,} nodes: an "
                    "order of another graph"
                )
            f.seek(offset)
            perm = np.fromfile(f, dtype=dtype, count=count)
    except OrderError:
        raise
    except FileNotFoundError:
        raise OrderError(f"{path}: no such order file") from None
    except IsADirectoryError:
        raise OrderError(f"{path}: a folder, not a .npy order file ({SAVE_ORDER})") from None
    except (OSError, ValueError, EOFError) as e:
        raise OrderError(f"{path}: not a .npy order file ({e})") from None
    t0 = time.perf_counter()
    perm = check_perm(perm, num_nodes, path)
    return Order(str(facts.get("order") or "file"), perm, time.perf_counter() - t0, path)


SAVE_ORDER = "mgg partition --order X --save-order F.npy writes one"


def _check_record(path: str, tail: bytes, fingerprint: str | None) -> dict:
    """The order's record after the array (empty for a bare .npy): OrderError naming
    ``path`` when it is damaged or names another graph than ``fingerprint``'s."""
    facts = {}
    if tail.startswith(TRAILER):
        try:
            facts = json.loads(tail[len(TRAILER) :].split(b"\n")[0])
        except ValueError:
            raise OrderError(f"{path}: damaged (its order record is not JSON)") from None
    if not isinstance(facts, dict):
        raise OrderError(f"{path}: damaged (its order record is not a JSON object)")
    recorded = facts.get("graph")
    if fingerprint is not None and recorded is not None and recorded != fingerprint:
        raise OrderError(
            f"{path}: computed for another graph (fingerprint {str(recorded)[:12]}, this "
            f"graph's {fingerprint[:12]}): compute the order of this graph (--order, "
            "--save-order)"
        )
    return facts


def _npy_array(f, path: str):
    """The dtype and entry count of the .npy array ``f`` opens, ``f`` left at its first
    byte: OrderError naming ``path`` for anything else (checked before a byte of the
    array is read)."""
    head = f.read(6)
    f.seek(0)
    if head != b"\x93NUMPY":
        what = "empty" if not head else "an .npz archive" if head.startswith(b"PK") else ""
        raise OrderError(
            f"{path}: {what + ', ' if what else ''}not a .npy order file ({SAVE_ORDER})"
        )
    try:
        shape, _, dtype = npy_header(f)
    except (ValueError, EOFError) as e:
        raise OrderError(f"{path}: not a .npy order file (a damaged header: {e})") from None
    if len(shape) != 1 or not (np.issubdtype(dtype, np.integer) or shape == (0,)):
        raise OrderError(f"{path}: expected a 1-D integer array, got {dtype} {shape}")
    offset, size = f.tell(), os.fstat(f.fileno()).st_size
    if size < offset + shape[0] * dtype.itemsize:
        raise OrderError(
            f"{path}: truncated ({size:,} bytes; its header promises {shape[0]:,} entries, "
            f"{offset + shape[0] * dtype.itemsize:,} bytes)"
        )
    return dtype, shape[0]


def check_one(name: str, path) -> None:
    """OrderError when both an order (other than natural) and an order file are given."""
    if path is not None and name != "natural":
        raise OrderError(f"--order {name} and --order-file {path}: give one of them")


def for_job(
    graph: Graph,
    name: str,
    comm=None,
    *,
    parts=None,
    path=None,
    seed: int = 0,
    split: str = DEFAULTS.split,
) -> Order:
    """The order of a job of ``comm``'s ranks (None: one process): ``name``'s, computed for
    ``parts`` (default the job's ranks) METIS parts balancing what ``split`` does, or the
    one read from ``path``; rank 0 computes it (METIS and RCM need the whole graph; one
    computation, not P) and every rank gets it. Collective."""
    size = parts or (1 if comm is None else comm.size)
    check_one(name, path)
    if path is None and name == "natural":
        return Order()
    order = error = None
    if comm is None or comm.rank == 0:
        try:
            # peers wait in bcast for as long as METIS takes
            with contextlib.nullcontext() if comm is None else comm.alone():
                if path is not None:
                    order = read(path, graph.num_nodes, fingerprint_of(graph))
                else:
                    order = compute(graph, name, size, seed, split)
        except OrderError as e:
            error = e
    if comm is not None:
        order, error = comm.bcast((order, error))
    if error is not None:
        raise error
    return order


__all__ = [
    "ORDERS",
    "Order",
    "OrderError",
    "check_one",
    "check_perm",
    "check_target",
    "compute",
    "degree_order",
    "fingerprint_of",
    "for_job",
    "graph_fingerprint",
    "inverse",
    "metis_weights",
    "read",
    "save",
]
