"""SNAP-style edge lists, text or gzip: one ``src dst [weight]`` line per edge (parsed by
:mod:`.textlines`); the distributed partitioner reads a plain one in byte ranges.
"""

from __future__ import annotations

import os
import re

import numpy as np

from ...memory import csr_bytes, require
from ..core import IDS_HINT, Graph, GraphError
from ._common import BOM, MAX_ID, WRITE_ROWS, err, open_write
from .base import EdgeSlice, Format
from .textlines import CHUNK_BYTES, LineError, LineSpec, concat, parse_chunk, parse_lines, peek

__all__ = ["FORMAT", "edge_slice", "read_edgelist", "write_edgelist"]


def read_edgelist(path, *, num_nodes=None, directed=True, comments="#%", delimiter=None) -> Graph:
    """Read a SNAP-style edge list (plain or gzip): one edge ``src dst [weight]`` per line.

    A line ``u v`` is the edge u->v (row v of the in-edge CSR holds u). Columns are separated
    by whitespace, or commas when ``delimiter`` is None (else by ``delimiter``); lines whose
    first non-blank character is in ``comments`` are skipped, as are blank lines.
    ``num_nodes`` defaults to max id + 1, or a header comment's ``Nodes: N`` (before the
    first edge; an id >= N is then an error). Sizes are checked against memory before the
    CSR is allocated (ResourceError naming the line of an id too large).
    ``directed=False`` adds the reverse of every edge and merges duplicates
    (``Graph.symmetrize``; weighted edges keep their weight) and marks the graph symmetric.
    Returns a Graph with E = number of edge lines (directed) and float32 weights [E] when
    the lines have a third column. Chunks are parsed in parallel threads.
    """
    path = os.fspath(path)
    if num_nodes is not None:
        num_nodes = int(num_nodes)
        if num_nodes < 0:
            raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    spec, parts, nlines = parse_lines(path, num_nodes, comments, delimiter, strict_header=True)
    if spec.ncol is None and num_nodes is None and spec.header_nodes is None:
        raise err(
            path,
            f"line {max(nlines, 1)}",
            "no edges: the file is empty or holds only comments and blank lines",
        )
    src = concat([p.src for p in parts], np.int32)
    dst = concat([p.dst for p in parts], np.int32)
    weights = concat([p.w for p in parts], np.float32) if spec.ncol == 3 else None
    del parts
    if num_nodes is None:
        num_nodes = max(
            int(src.max()) + 1 if src.size else 0,
            int(dst.max()) + 1 if dst.size else 0,
            spec.header_nodes or 0,
        )
    require(
        csr_bytes(num_nodes, src.size * (1 if directed else 2), weights is not None),
        f"the graph of {num_nodes:,} nodes and {src.size:,} edges (its CSR and the build)",
        path,
        IDS_HINT,
    )
    try:
        g = Graph.from_edges(src, dst, num_nodes, weights)
        del src, dst
        if not directed:
            g = (
                g.symmetrize()
                if weights is None
                else _symmetrize_weighted(g, path, comments, delimiter)
            )
    except GraphError as e:
        if str(e).startswith(f"{path}:"):
            raise
        raise GraphError(f"{path}: {e}") from e
    return g


def _symmetrize_weighted(g: Graph, path, comments, delimiter) -> Graph:
    """Union of g and its transpose keeping weights; an edge listed twice must agree (the
    error names both lines)."""
    h, clash = g.symmetrize_weighted()
    if clash is None:
        return h
    u, v, w1, w2 = clash
    _, parts, _ = parse_lines(path, None, comments, delimiter, want_lines=True)
    ps, pd = (
        concat([p.src for p in parts], np.int64),
        concat([p.dst for p in parts], np.int64),
    )
    lines = concat([p.lines for p in parts], np.int64)
    ws = concat([p.w for p in parts], np.float32)
    pair = ((ps == u) & (pd == v)) | ((ps == v) & (pd == u))
    (la, wa), (lb, wb) = sorted(
        (int(lines[pair & (ws == np.float32(x))][0]), float(x)) for x in (w1, w2)
    )
    raise err(
        path,
        f"line {lb}",
        f"undirected edge {u} {v} has weight {wb:g} here but {wa:g} on line {la}",
    )


def write_edgelist(graph: Graph, path) -> None:
    """Write ``src dst [weight]`` lines in CSR order, after a ``# Nodes: N Edges: E`` header.

    A ``.gz`` suffix writes gzip. Weights are written with 9 significant digits, so float32
    values read back exactly.
    """
    path = os.fspath(path)
    src, dst = graph.edges()
    w = graph.weights
    line = "%d %d\n" if w is None else "%d %d %.9g\n"
    with open_write(path) as f:
        f.write(f"# Nodes: {graph.num_nodes} Edges: {graph.num_edges}\n".encode())
        f.write(b"# src dst" + (b" weight" if w is not None else b"") + b"\n")
        for a in range(0, graph.num_edges, WRITE_ROWS):
            b = min(a + WRITE_ROWS, graph.num_edges)
            if w is None:
                flat = np.stack([src[a:b], dst[a:b]], axis=1).ravel().tolist()
            else:
                cols = np.empty((b - a, 3), dtype=object)
                cols[:, 0], cols[:, 1] = src[a:b].tolist(), dst[a:b].tolist()
                cols[:, 2] = w[a:b].tolist()
                flat = cols.ravel().tolist()
            f.write(((line * (b - a)) % tuple(flat)).encode())


# ---- the distributed partitioner's slices: byte ranges -----------------------------------
def _line_start(f, pos: int) -> int:
    """The first line start at or after byte ``pos``."""
    if pos == 0:
        return 0
    f.seek(pos - 1)
    while True:
        block = f.read(1 << 16)
        if not block:
            return f.tell()
        i = block.find(b"\n")
        if i >= 0:
            return pos - 1 + i + 1
        pos += len(block)


def edge_slice(path, rank, size) -> EdgeSlice:
    """Rank ``rank``'s share of a plain edge list: the lines that start in its byte range
    (a gzip one is refused: it has no random access)."""
    with open(path, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise err(
                path,
                "byte offset 0",
                "a gzip edge list has no random access, so ranks cannot read byte ranges "
                "of it: decompress it first (gunzip -k), or partition it in one process",
            )
    total = os.path.getsize(path)
    spec = LineSpec(None, "#%", None, False)
    src, dst, ws = [], [], []
    first_edge = None
    with open(path, "rb") as f:
        a = _line_start(f, rank * total // size)
        b = _line_start(f, (rank + 1) * total // size)
        f.seek(a)
        pos = a
        while pos < b:
            block = f.read(min(CHUNK_BYTES, b - pos))
            if not block:
                break
            if pos + len(block) < b and not block.endswith(b"\n"):
                block += f.readline()
            start = pos
            pos += len(block)
            if start == 0 and block.startswith(BOM):
                block = b" " * len(BOM) + block[len(BOM) :]
            if not block.endswith(b"\n"):
                block += b"\n"
            try:
                if spec.ncol is None:
                    if not peek(spec, block, 0, path):
                        continue
                    first_edge = start
                part = parse_chunk(spec, block)
            except LineError as e:
                line = _line_number(path, start, e.rel)
                first = _line_number(path, first_edge, spec.ncol_line)
                problem = re.sub(r"as on line \d+", f"as on line {first}", e.problem)
                raise err(path, f"line {line}", problem) from None
            except GraphError as e:  # peek's column count, with a chunk-relative line
                line = _line_number(path, start, _rel_line(str(e)))
                raise err(path, f"line {line}", str(e).split(": ", 2)[-1]) from None
            src.append(part.src.astype(np.int64))
            dst.append(part.dst.astype(np.int64))
            if part.w is not None:
                ws.append(part.w)
    s = np.concatenate(src) if src else np.empty(0, np.int64)
    d = np.concatenate(dst) if dst else np.empty(0, np.int64)
    hi = max(int(s.max(initial=-1)), int(d.max(initial=-1))) + 1
    if hi > MAX_ID:
        raise err(path, f"byte offset {first_edge}", "node ids are too large")
    require(
        24 * hi,
        f"node id {hi - 1:,} makes {hi:,} nodes, whose per-node counts",
        path,
        "node ids index the CSR's rows: number the nodes 0..N-1",
    )
    w = np.concatenate(ws) if spec.ncol == 3 else None
    where = f"line at byte offset {first_edge}" if first_edge is not None else ""
    return EdgeSlice(s, d, w, None, hi, False, path, where, spec.header_nodes)


def _rel_line(message: str) -> int:
    try:
        return int(message.split("line ", 1)[1].split(":", 1)[0])
    except (IndexError, ValueError):
        return 0


def _line_number(path, start: int, rel: int) -> int:
    """1-based line number of line ``rel`` (0-based) of the block at byte ``start``."""
    count = 0
    with open(path, "rb") as f:
        left = start
        while left > 0:
            block = f.read(min(left, 1 << 24))
            if not block:
                break
            count += block.count(b"\n")
            left -= len(block)
    return count + rel + 1


FORMAT = Format(
    "edgelist",
    "edge list",
    read_edgelist,
    (".txt", ".csv", ".tsv", ".el", ".edges"),
    gzip=True,
    write=write_edgelist,
    written=".txt/.csv/.tsv/.el/.edges (edge list)",
    edge_slice=edge_slice,
    sliced="edge lists",
)
