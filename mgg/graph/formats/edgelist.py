"""SNAP-style edge lists, text or gzip: one ``src dst [weight]`` line per edge.

Chunks of about ``_CHUNK_BYTES`` are parsed in parallel threads, in bulk with numpy; a chunk
that looks wrong gets a line-by-line pass that reports its first bad line.
"""

from __future__ import annotations

import io
import math
import os
import re
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...memory import available_bytes, csr_bytes, require
from ..core import IDS_HINT, Graph, GraphError
from ._common import (
    BOM,
    DIGITS_WS,
    FLOAT32_MAX,
    MAX_ID,
    WRITE_ROWS,
    err,
    open_binary,
    open_write,
    show,
)

__all__ = ["read_edgelist", "read_node_ids", "write_edgelist"]

_CHUNK_BYTES = 1 << 24
_EXACT_INT = 2**53
_NODES_HEADER = re.compile(rb"nodes\s*[:=]\s*(\d+)", re.IGNORECASE)
_ID_DIGITS = len(str(MAX_ID))


class _LineError(Exception):
    """A problem on line ``rel`` (0-based) of a chunk; the driver adds the chunk's offset."""

    def __init__(self, rel: int, problem: str):
        super().__init__(problem)
        self.rel, self.problem = rel, problem


class _Spec:
    """What a chunk parser needs to know; fixed once the first edge line has been seen."""

    def __init__(self, num_nodes, comments, delimiter, want_lines, columns=(2, 3)):
        self.num_nodes = num_nodes
        self.columns = columns
        self.comment_chars = [c.encode() for c in (comments or "")]
        self.delim = None
        if delimiter is None:
            self.delim = b","
        elif not delimiter.isspace():
            if len(delimiter.encode()) != 1:
                raise ValueError(f"delimiter must be one character, got {delimiter!r}")
            self.delim = delimiter.encode()
        self.delim_table = bytes.maketrans(self.delim, b" ") if self.delim else None
        self.want_lines = want_lines
        self.ncol = None
        self.ncol_line = 0
        self.header_nodes = None
        self.header_line = 0
        self.strict_header = False  # ids must lie below the header's node count
        self.lines = 0  # lines read so far (_edge_chunks)


class _Chunk:
    """Parsed edges of one chunk: src, dst int [L] (dst None for one-column files), weights
    float32 [L] or None, the line of each edge (0-based in the chunk until the driver adds
    the offset; only when asked for), and the chunk's line count."""

    __slots__ = ("src", "dst", "w", "lines", "nlines", "hi")

    def __init__(self, ids, w, lines, nlines, hi):
        self.hi = hi
        dtype = np.int32 if hi <= np.iinfo(np.int32).max else np.int64
        self.src = ids[:, 0].astype(dtype)
        self.dst = ids[:, 1].astype(dtype) if ids.shape[1] > 1 else None
        self.w, self.lines, self.nlines = w, lines, nlines


def _num_workers() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(8, os.cpu_count() or 1))


def _read_chunks(f, path):
    """Yield blocks of whole lines (each ending in a newline) of about _CHUNK_BYTES."""
    offset = 0
    first = True
    while True:
        try:
            block = f.read(_CHUNK_BYTES)
            if block and not block.endswith(b"\n"):
                block += f.readline()
        except (EOFError, OSError, zlib.error) as e:
            raise err(
                path,
                f"byte offset {offset} (decompressed)",
                f"corrupt or truncated gzip stream ({e})",
            ) from e
        if not block:
            return
        offset += len(block)
        if first and block.startswith(BOM):
            block = block[len(BOM) :]
        first = False
        yield block if block.endswith(b"\n") else block + b"\n"


def _peek(spec: _Spec, chunk: bytes, line0: int, path) -> bool:
    """Find the first edge line of ``chunk``: set spec.ncol (and spec.header_nodes from a
    ``Nodes: N`` comment before it). False when the chunk holds no edge line."""
    p, i = 0, 0
    while p < len(chunk):
        e = chunk.find(b"\n", p)
        line = chunk[p:e].strip()
        if line[:1] and line[:1] in spec.comment_chars:
            m = _NODES_HEADER.search(line)
            if m and spec.header_nodes is None:
                _header(spec, m.group(1), line0 + i, path)
        elif line:
            if spec.delim is not None:
                line = line.translate(spec.delim_table)
            n = len(line.split())
            if n not in spec.columns:
                want = (
                    "1 column (a node id)"
                    if spec.columns == (1,)
                    else "2 or 3 columns ('src dst' or 'src dst weight')"
                )
                raise err(path, f"line {line0 + i}", f"expected {want}, found {n}")
            spec.ncol, spec.ncol_line = n, line0 + i
            return True
        p, i = e + 1, i + 1
    return False


def _header(spec: _Spec, digits: bytes, lineno: int, path) -> None:
    """Take a ``Nodes: N`` comment: N must be a sane count whose indptr fits in memory."""
    if len(digits) > _ID_DIGITS or int(digits) >= MAX_ID:
        raise err(path, f"line {lineno}", f"the header declares {show(digits)} nodes: too many")
    n = int(digits)
    require(
        csr_bytes(n, 0, build=False),
        f"line {lineno}: the header declares {n:,} nodes, whose CSR (indptr int64 [N+1])",
        path,
        "check the header's node count",
    )
    spec.header_nodes, spec.header_line = n, lineno


def _limit(spec: _Spec):
    """(the bound ids must stay below, or None; how the message names it)."""
    if spec.num_nodes is not None:
        return spec.num_nodes, f"num_nodes = {spec.num_nodes}"
    if spec.strict_header and spec.header_nodes is not None:
        n = spec.header_nodes
        return n, f"{n}, the node count of the 'Nodes: {n}' header on line {spec.header_line}"
    return None, ""


def _parse_chunk(spec: _Spec, chunk: bytes) -> _Chunk:
    """Parse whole lines; raises _LineError at the first bad line."""
    nlines = chunk.count(b"\n")
    chunk = _blank_comments(chunk, spec.comment_chars)
    raw = chunk
    if spec.delim is not None and spec.delim in chunk:
        chunk = chunk.translate(spec.delim_table)
        parsed = _parse_fast(spec, chunk, nlines)
        if parsed is not None:
            rows = len(parsed[0])
            if raw.count(spec.delim) != (spec.ncol - 1) * rows:
                parsed = None
    else:
        parsed = _parse_fast(spec, chunk, nlines)
    hi = int(parsed[0].max()) if parsed is not None and parsed[0].size else -1
    limit = _limit(spec)[0]
    if parsed is None or hi >= MAX_ID or (limit is not None and hi >= limit):
        parsed = _parse_slow(spec, raw)
        hi = int(parsed[0].max()) if parsed[0].size else -1
    return _Chunk(*parsed, nlines, hi)


def _blank_comments(chunk: bytes, comment_chars) -> bytes:
    """Replace comment lines by spaces (line breaks stay, so line numbers do not move)."""
    for c in comment_chars:
        p = chunk.find(c)
        buf = None
        while p >= 0:
            start = chunk.rfind(b"\n", 0, p) + 1
            end = chunk.find(b"\n", p)
            end = len(chunk) if end < 0 else end
            if not chunk[start:p].strip():
                if buf is None:
                    buf = bytearray(chunk)
                buf[start:end] = b" " * (end - start)
            p = chunk.find(c, end)
        if buf is not None:
            chunk = bytes(buf)
    return chunk


def _parse_fast(spec: _Spec, chunk: bytes, nlines: int):
    """Bulk parse; None when the chunk needs the line-by-line pass."""
    k = spec.ncol
    if chunk.translate(None, DIGITS_WS):
        if k == 3 and not spec.want_lines:
            return _parse_weighted(spec, chunk)
        return None
    arr = np.fromstring(chunk.replace(b"\n", b" -1 "), dtype=np.int64, sep=" ")
    if arr.size == nlines * (k + 1) and (arr[k :: k + 1] < 0).all():
        vals = arr.reshape(-1, k + 1)
        rel = np.arange(nlines) if spec.want_lines else None
    else:
        neg = arr < 0
        ends = np.flatnonzero(neg)
        if ends.size != nlines:
            return None
        counts = np.diff(ends, prepend=-1) - 1
        data_lines = np.flatnonzero(counts)
        bad = np.flatnonzero(counts[data_lines] != k)
        if bad.size:
            i = int(data_lines[bad[0]])
            raise _LineError(i, _ncol_problem(spec, int(counts[i])))
        vals = arr[~neg].reshape(-1, k)
        rel = data_lines if spec.want_lines else None
    w = None
    if k == 3:
        if vals.shape[0] and vals[:, 2].max() > _EXACT_INT:
            return None
        w = vals[:, 2].astype(np.float32)
    return vals[:, :2], w, rel


def _parse_weighted(spec: _Spec, chunk: bytes):
    """Bulk parse of ``src dst weight`` lines with non-integer weights."""
    if chunk.isspace():
        return np.empty((0, 2), np.int64), np.empty(0, np.float32), None
    dt = np.dtype([("s", np.int64), ("d", np.int64), ("w", np.float64)])
    try:
        rec = np.loadtxt(io.BytesIO(chunk), dtype=dt, comments=None, ndmin=1, encoding="latin1")
    except ValueError:
        return None
    ids = np.stack([rec["s"], rec["d"]], axis=1)
    w = rec["w"]
    if ids.size and ids.min() < 0:
        return None
    if w.size and not (np.isfinite(w).all() and np.abs(w).max() <= FLOAT32_MAX):
        return None
    return ids, w.astype(np.float32), None


def _parse_slow(spec: _Spec, chunk: bytes):
    """Line by line: raises _LineError at the first bad line, else returns the edges."""
    ids, ws, rel = [], [], []
    delim, k = spec.delim, spec.ncol
    for i, line in enumerate(chunk.split(b"\n")[:-1]):
        if delim is not None and delim in line:
            fields = line.split(delim)
            if any(not f.strip() for f in fields):
                raise _LineError(i, f"empty field between {delim.decode()!r} separators")
            toks = b" ".join(fields).split()
        else:
            toks = line.split()
        if not toks:
            continue
        for tok in toks:
            if tok[:1] in spec.comment_chars:
                raise _LineError(
                    i,
                    f"comment {show(tok[:1])} after data: comments must be on lines of their own",
                )
        if len(toks) != k:
            raise _LineError(i, _ncol_problem(spec, len(toks)))
        ids.append(tuple(_node_id(spec, toks[c], i, c + 1) for c in range(min(k, 2))))
        if k == 3:
            ws.append(_weight(toks[2], i))
        rel.append(i)
    ids = np.array(ids, dtype=np.int64).reshape(-1, min(k, 2))
    w = np.array(ws, dtype=np.float32) if k == 3 else None
    return ids, w, (np.array(rel, np.int64) if spec.want_lines else None)


def _ncol_problem(spec: _Spec, n: int) -> str:
    return f"expected {spec.ncol} columns as on line {spec.ncol_line}, found {n}"


def _node_id(spec: _Spec, tok: bytes, rel: int, col: int) -> int:
    if not (tok.isdigit() or (tok[:1] == b"+" and tok[1:].isdigit())):
        if tok[:1] == b"-" and tok[1:].isdigit():
            raise _LineError(rel, f"negative node id {show(tok)} in column {col}")
        raise _LineError(rel, f"node id {show(tok)} in column {col} is not a non-negative integer")
    if len(tok.lstrip(b"+0")) > _ID_DIGITS:
        digits = len(tok.lstrip(b"+0"))
        raise _LineError(
            rel, f"node id {show(tok)} ({digits:,} digits) in column {col} is too large"
        )
    val = int(tok)
    if val >= MAX_ID:
        raise _LineError(rel, f"node id {show(tok)} in column {col} is too large")
    limit, what = _limit(spec)
    if limit is not None and val >= limit:
        raise _LineError(rel, f"node id {val} in column {col} is >= {what}")
    return val


def _weight(tok: bytes, rel: int) -> float:
    try:
        val = float(tok)
    except ValueError:
        raise _LineError(rel, f"weight {show(tok)} in column 3 is not a number") from None
    if not math.isfinite(val) or abs(val) > FLOAT32_MAX:
        raise _LineError(rel, f"weight {show(tok)} in column 3 is not a finite float32")
    return val


def _parse_edgelist(
    path, num_nodes, comments, delimiter, want_lines=False, columns=(2, 3), strict_header=False
):
    """(spec, list of _Chunk with absolute ``lines``, number of lines in the file).

    ``strict_header``: ids must lie below a ``Nodes: N`` header's N. The largest id so far
    is checked against memory chunk by chunk (its indptr needs 8 bytes per node)."""
    spec = _Spec(num_nodes, comments, delimiter, want_lines, columns)
    spec.strict_header = strict_header
    done = list(_edge_chunks(spec, path))
    return spec, done, spec.lines


def _edge_chunks(spec: _Spec, path):
    """Yield the parsed _Chunks of ``path`` in order (``lines`` absolute), parsed ahead in
    threads; ``spec.lines``: the lines read so far."""
    pending = deque()
    spec.lines = 0
    top = [-1, available_bytes() if spec.num_nodes is None else None]

    def collect():
        job, chunk = pending.popleft()
        line0 = spec.lines + 1
        try:
            part = job.result() if isinstance(job, Future) else job
        except _LineError as e:
            raise err(path, f"line {line0 + e.rel}", e.problem) from None
        if part.hi > top[0] and top[1] is not None:
            top[0] = part.hi
            if csr_bytes(part.hi + 1, 0, build=False) > top[1]:
                _too_many_nodes(spec, chunk, part.hi, line0, path)
        if part.lines is not None:
            part.lines = part.lines + line0
        spec.lines += part.nlines
        return part

    workers = _num_workers()
    with open_binary(path) as f, ThreadPoolExecutor(workers) as pool:
        try:
            for chunk in _read_chunks(f, path):
                if spec.ncol is None:
                    while pending:
                        yield collect()
                    if not _peek(spec, chunk, spec.lines + 1, path):
                        spec.lines += chunk.count(b"\n")
                        continue
                pending.append((pool.submit(_parse_chunk, spec, chunk), chunk))
                if len(pending) > workers:
                    yield collect()
            while pending:
                yield collect()
        finally:
            for job, _ in pending:
                job.cancel()


def _too_many_nodes(spec: _Spec, chunk: bytes, hi: int, line0: int, path):
    """ResourceError naming the line of id ``hi``, whose indptr cannot fit."""
    slow = _Spec(None, "", None, True, spec.columns)
    slow.comment_chars, slow.delim, slow.delim_table = (
        spec.comment_chars,
        spec.delim,
        spec.delim_table,
    )
    slow.ncol = spec.ncol
    ids, _, rel = _parse_slow(slow, _blank_comments(chunk, spec.comment_chars))
    line = line0 + int(rel[np.flatnonzero((ids == hi).any(axis=1))[0]])
    require(
        csr_bytes(hi + 1, 0, build=False),
        f"line {line}: node id {hi:,} makes {hi + 1:,} nodes, whose CSR (indptr int64 [N+1])",
        path,
        IDS_HINT,
    )


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
    spec, parts, nlines = _parse_edgelist(path, num_nodes, comments, delimiter, strict_header=True)
    if spec.ncol is None and num_nodes is None and spec.header_nodes is None:
        raise err(
            path,
            f"line {max(nlines, 1)}",
            "no edges: the file is empty or holds only comments and blank lines",
        )
    src = _concat([p.src for p in parts], np.int32)
    dst = _concat([p.dst for p in parts], np.int32)
    weights = _concat([p.w for p in parts], np.float32) if spec.ncol == 3 else None
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


def read_node_ids(path, num_nodes: int, *, comments="#%") -> np.ndarray:
    """int64 [L]: a file of one node id per line (plain or gzip; an OGB split file), each
    checked to lie in [0, num_nodes); parsed in chunks as :func:`read_edgelist`."""
    path = os.fspath(path)
    _, parts, _ = _parse_edgelist(path, int(num_nodes), comments, None, columns=(1,))
    return _concat([p.src for p in parts], np.int32).astype(np.int64)


def _concat(arrays, dtype):
    arrays = [a for a in arrays if a is not None]
    if not arrays:
        return np.empty(0, dtype)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _symmetrize_weighted(g: Graph, path, comments, delimiter) -> Graph:
    """Union of g and its transpose keeping weights; an edge listed twice must agree (the
    error names both lines)."""
    h, clash = g.symmetrize_weighted()
    if clash is None:
        return h
    u, v, w1, w2 = clash
    _, parts, _ = _parse_edgelist(path, None, comments, delimiter, want_lines=True)
    ps, pd = (
        _concat([p.src for p in parts], np.int64),
        _concat([p.dst for p in parts], np.int64),
    )
    lines = _concat([p.lines for p in parts], np.int64)
    ws = _concat([p.w for p in parts], np.float32)
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
