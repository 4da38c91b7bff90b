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

import gzip
import io
import json
import math
import os
import re
import warnings
import zipfile
import zlib
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .core import Graph, GraphError
from .dataset import Dataset

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

_CHUNK_BYTES = 1 << 24
_WRITE_ROWS = 1 << 20
_MAX_ID = 10**18
_EXACT_INT = 2**53
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_DIGITS_WS = b"0123456789 \t\r\n"
_BOM = b"\xef\xbb\xbf"
_NODES_HEADER = re.compile(rb"nodes\s*[:=]\s*(\d+)", re.IGNORECASE)
_BEG_SUFFIX = "_beg_pos.bin"
_CSR_SUFFIX = "_csr.bin"


def _err(path, where: str, problem: str) -> GraphError:
    return GraphError(f"{path}: {where}: {problem}")


def _show(token: bytes) -> str:
    text = token[:40].decode("utf-8", "replace")
    return repr(text + ("..." if len(token) > 40 else ""))


def _open_binary(path: str):
    """A binary reader of ``path``, transparently gunzipped when it starts with gzip magic."""
    f = open(path, "rb")
    if f.read(2) == b"\x1f\x8b":
        f.close()
        return gzip.open(path, "rb")
    f.seek(0)
    return f


def _open_write(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "wb", compresslevel=6)
    return open(path, "wb")


def _read_all(path: str) -> bytes:
    with _open_binary(path) as f:
        try:
            return f.read()
        except (EOFError, OSError, zlib.error) as e:
            raise _err(path, "byte offset 0", f"corrupt or truncated gzip stream ({e})") from e


# ---- edge lists -------------------------------------------------------------------------
class _LineError(Exception):
    """A problem on line ``rel`` (0-based) of a chunk; the driver adds the chunk's offset."""

    def __init__(self, rel: int, problem: str):
        super().__init__(problem)
        self.rel, self.problem = rel, problem


class _Spec:
    """What a chunk parser needs to know; fixed once the first edge line has been seen."""

    def __init__(self, num_nodes, comments, delimiter, want_lines):
        self.num_nodes = num_nodes
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


class _Chunk:
    """Parsed edges of one chunk: src, dst int [L], weights float32 [L] or None, the line of
    each edge (0-based in the chunk until the driver adds the offset; only when asked for),
    and the chunk's line count."""

    __slots__ = ("src", "dst", "w", "lines", "nlines")

    def __init__(self, ids, w, lines, nlines, hi):
        dtype = np.int32 if hi <= np.iinfo(np.int32).max else np.int64
        self.src = ids[:, 0].astype(dtype)
        self.dst = ids[:, 1].astype(dtype)
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
            raise _err(
                path,
                f"byte offset {offset} (decompressed)",
                f"corrupt or truncated gzip stream ({e})",
            ) from e
        if not block:
            return
        offset += len(block)
        if first and block.startswith(_BOM):
            block = block[len(_BOM) :]
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
                spec.header_nodes = int(m.group(1))
        elif line:
            if spec.delim is not None:
                line = line.translate(spec.delim_table)
            n = len(line.split())
            if n not in (2, 3):
                raise _err(
                    path,
                    f"line {line0 + i}",
                    f"expected 2 or 3 columns ('src dst' or 'src dst weight'), found {n}",
                )
            spec.ncol, spec.ncol_line = n, line0 + i
            return True
        p, i = e + 1, i + 1
    return False


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
    if parsed is None or hi >= _MAX_ID or (spec.num_nodes is not None and hi >= spec.num_nodes):
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
    if chunk.translate(None, _DIGITS_WS):
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
    if w.size and not (np.isfinite(w).all() and np.abs(w).max() <= _FLOAT32_MAX):
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
                    f"comment {_show(tok[:1])} after data: comments must be on lines of their own",
                )
        if len(toks) != k:
            raise _LineError(i, _ncol_problem(spec, len(toks)))
        ids.append((_node_id(spec, toks[0], i, 1), _node_id(spec, toks[1], i, 2)))
        if k == 3:
            ws.append(_weight(toks[2], i))
        rel.append(i)
    ids = np.array(ids, dtype=np.int64).reshape(-1, 2)
    w = np.array(ws, dtype=np.float32) if k == 3 else None
    return ids, w, (np.array(rel, np.int64) if spec.want_lines else None)


def _ncol_problem(spec: _Spec, n: int) -> str:
    return f"expected {spec.ncol} columns as on line {spec.ncol_line}, found {n}"


def _node_id(spec: _Spec, tok: bytes, rel: int, col: int) -> int:
    if not (tok.isdigit() or (tok[:1] == b"+" and tok[1:].isdigit())):
        if tok[:1] == b"-" and tok[1:].isdigit():
            raise _LineError(rel, f"negative node id {_show(tok)} in column {col}")
        raise _LineError(rel, f"node id {_show(tok)} in column {col} is not a non-negative integer")
    val = int(tok)
    if val >= _MAX_ID:
        raise _LineError(rel, f"node id {_show(tok)} in column {col} is too large")
    if spec.num_nodes is not None and val >= spec.num_nodes:
        raise _LineError(rel, f"node id {val} in column {col} is >= num_nodes = {spec.num_nodes}")
    return val


def _weight(tok: bytes, rel: int) -> float:
    try:
        val = float(tok)
    except ValueError:
        raise _LineError(rel, f"weight {_show(tok)} in column 3 is not a number") from None
    if not math.isfinite(val) or abs(val) > _FLOAT32_MAX:
        raise _LineError(rel, f"weight {_show(tok)} in column 3 is not a finite float32")
    return val


def _parse_edgelist(path, num_nodes, comments, delimiter, want_lines=False):
    """(spec, list of _Chunk with absolute ``lines``, number of lines in the file)."""
    spec = _Spec(num_nodes, comments, delimiter, want_lines)
    done, pending = [], deque()
    line0 = 1

    def collect():
        nonlocal line0
        job = pending.popleft()
        try:
            part = job.result() if isinstance(job, Future) else job
        except _LineError as e:
            raise _err(path, f"line {line0 + e.rel}", e.problem) from None
        if part.lines is not None:
            part.lines = part.lines + line0
        line0 += part.nlines
        done.append(part)

    workers = _num_workers()
    with _open_binary(path) as f, ThreadPoolExecutor(workers) as pool:
        try:
            for chunk in _read_chunks(f, path):
                if spec.ncol is None:
                    while pending:
                        collect()
                    if not _peek(spec, chunk, line0, path):
                        line0 += chunk.count(b"\n")
                        continue
                pending.append(pool.submit(_parse_chunk, spec, chunk))
                if len(pending) > workers:
                    collect()
            while pending:
                collect()
        finally:
            for job in pending:
                job.cancel()
    return spec, done, line0 - 1


def read_edgelist(path, *, num_nodes=None, directed=True, comments="#%", delimiter=None) -> Graph:
    """Read a SNAP-style edge list (plain or gzip): one edge ``src dst [weight]`` per line.

    A line ``u v`` is the edge u->v (row v of the in-edge CSR holds u). Columns are separated
    by whitespace, or commas when ``delimiter`` is None (else by ``delimiter``); lines whose
    first non-blank character is in ``comments`` are skipped, as are blank lines.
    ``num_nodes`` defaults to max id + 1, or more when a header comment says ``Nodes: N``.
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
    spec, parts, nlines = _parse_edgelist(path, num_nodes, comments, delimiter)
    if spec.ncol is None and num_nodes is None and spec.header_nodes is None:
        raise _err(
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


def _concat(arrays, dtype):
    arrays = [a for a in arrays if a is not None]
    if not arrays:
        return np.empty(0, dtype)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _symmetrize_weighted(g: Graph, path, comments, delimiter) -> Graph:
    """Union of g and its transpose keeping weights; an edge listed twice must agree."""
    src, dst = g.edges()
    n = g.num_nodes
    both = Graph.from_edges(
        np.concatenate([src, dst]),
        np.concatenate([dst, src]),
        n,
        np.concatenate([g.weights, g.weights]),
    ).sort_rows()
    s, d = both.edges()
    w = both.weights
    dup = np.zeros(both.num_edges, bool)
    dup[1:] = (s[1:] == s[:-1]) & (d[1:] == d[:-1])
    clash = np.flatnonzero(dup[1:] & (w[1:] != w[:-1])) + 1
    if clash.size:
        e = int(clash[0])
        u, v = int(s[e]), int(d[e])
        _, parts, _ = _parse_edgelist(path, None, comments, delimiter, want_lines=True)
        ps, pd = (
            _concat([p.src for p in parts], np.int64),
            _concat([p.dst for p in parts], np.int64),
        )
        lines = _concat([p.lines for p in parts], np.int64)
        ws = _concat([p.w for p in parts], np.float32)
        pair = ((ps == u) & (pd == v)) | ((ps == v) & (pd == u))
        (la, wa), (lb, wb) = sorted(
            (int(lines[pair & (ws == x)][0]), float(x)) for x in (w[e - 1], w[e])
        )
        raise _err(
            path,
            f"line {lb}",
            f"undirected edge {u} {v} has weight {wb:g} here but {wa:g} on line {la}",
        )
    keep = ~dup
    counts = np.bincount(d[keep], minlength=n)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Graph(indptr, s[keep], w[keep], n, symmetric=True, check=False)


def write_edgelist(graph: Graph, path) -> None:
    """Write ``src dst [weight]`` lines in CSR order, after a ``# Nodes: N Edges: E`` header.

    A ``.gz`` suffix writes gzip. Weights are written with 9 significant digits, so float32
    values read back exactly.
    """
    path = os.fspath(path)
    src, dst = graph.edges()
    w = graph.weights
    line = "%d %d\n" if w is None else "%d %d %.9g\n"
    with _open_write(path) as f:
        f.write(f"# Nodes: {graph.num_nodes} Edges: {graph.num_edges}\n".encode())
        f.write(b"# src dst" + (b" weight" if w is not None else b"") + b"\n")
        for a in range(0, graph.num_edges, _WRITE_ROWS):
            b = min(a + _WRITE_ROWS, graph.num_edges)
            if w is None:
                flat = np.stack([src[a:b], dst[a:b]], axis=1).ravel().tolist()
            else:
                cols = np.empty((b - a, 3), dtype=object)
                cols[:, 0], cols[:, 1] = src[a:b].tolist(), dst[a:b].tolist()
                cols[:, 2] = w[a:b].tolist()
                flat = cols.ravel().tolist()
            f.write(((line * (b - a)) % tuple(flat)).encode())


# ---- METIS --------------------------------------------------------------------------------
def read_metis(path) -> Graph:
    """Read a METIS graph: header ``n m [fmt [ncon]]``, then line i lists vertex i's neighbours.

    Ids are 1-based. ``fmt`` digits mean (vertex sizes, vertex weights, edge weights); vertex
    sizes and weights are skipped, edge weights become float32 weights [E]. Each undirected
    edge appears in both endpoints' lines, so E = 2m; the result is checked to be symmetric,
    without self loops, and marked ``symmetric=True``.
    """
    path = os.fspath(path)
    data = _read_all(path)
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    linenos = range(1, len(lines) + 1)
    if b"%" in data:
        kept = [(i + 1, ln) for i, ln in enumerate(lines) if not ln.lstrip().startswith(b"%")]
        linenos = [k for k, _ in kept]
        lines = [ln for _, ln in kept]
    h = 0
    while h < len(lines) and not lines[h].strip():
        h += 1
    if h == len(lines):
        raise _err(
            path,
            f"line {max(len(linenos) and linenos[-1], 1)}",
            "empty file: expected a header 'n m [fmt [ncon]]'",
        )
    hline = linenos[h]
    n, m, vsize, ncon, ew = _metis_header(path, hline, lines[h])
    body_lines = lines[h + 1 :]
    body_nos = linenos[h + 1 :]
    if len(body_lines) < n:
        last = body_nos[-1] if len(body_nos) else hline
        raise _err(
            path,
            f"line {last}",
            f"the header (line {hline}) declares {n} vertices but the file has "
            f"{len(body_lines)} vertex lines",
        )
    for ln, no in zip(body_lines[n:], body_nos[n:], strict=True):
        if ln.strip():
            raise _err(
                path,
                f"line {no}",
                f"more than {n} vertex lines (the header on line {hline} declares {n})",
            )
    body_lines = body_lines[:n]
    body = b"\n".join(body_lines) + b"\n" if n else b""
    if body.translate(None, _DIGITS_WS):
        _metis_find_bad_token(path, body_lines, body_nos)
        body = body.translate(bytes.maketrans(b"\x0b\x0c", b"  "))
    arr = (
        np.fromstring(body.replace(b"\n", b" -1 "), dtype=np.int64, sep=" ")
        if n
        else np.empty(0, np.int64)
    )
    ends = np.flatnonzero(arr < 0)
    if ends.size != n:
        raise _err(path, f"line {hline}", f"could not split the body into {n} vertex lines")
    counts = np.diff(ends, prepend=-1) - 1
    vals = arr[arr >= 0]
    if vals.size and vals.max() >= _MAX_ID:
        _metis_find_bad_token(path, body_lines, body_nos)
    prefix = vsize + ncon
    step = 2 if ew else 1
    bad = np.flatnonzero((counts < prefix) | ((counts - prefix) % step != 0))
    if bad.size:
        i = int(bad[0])
        what = f"{prefix} vertex size/weight values then " if prefix else ""
        raise _err(
            path,
            f"line {body_nos[i]}",
            f"expected {what}{'(neighbour, weight) pairs' if ew else 'neighbour ids'}, "
            f"found {int(counts[i])} numbers",
        )
    degrees = (counts - prefix) // step
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(degrees, out=indptr[1:])
    total = int(indptr[-1])
    if total != 2 * m:
        raise _err(
            path,
            f"line {hline}",
            f"the header declares m = {m} edges, so 2m = {2 * m} adjacency entries, "
            f"but the vertex lines hold {total}",
        )
    if prefix == 0 and step == 1:
        nbrs, weights = vals, None
    else:
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        pos = np.arange(vals.size) - np.repeat(starts[:-1], counts) - prefix
        nbrs = vals[(pos >= 0) & (pos % step == 0)]
        weights = vals[(pos >= 0) & (pos % step == 1)].astype(np.float32) if ew else None
    out = np.flatnonzero((nbrs < 1) | (nbrs > n))
    if out.size:
        e = int(out[0])
        v = int(np.searchsorted(indptr, e, side="right")) - 1
        raise _err(
            path,
            f"line {body_nos[v]}",
            f"neighbour id {int(nbrs[e])} is outside [1, {n}] (METIS ids are 1-based)",
        )
    indices = nbrs - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), degrees)
    loops = np.flatnonzero(indices == rows)
    if loops.size:
        v = int(rows[loops[0]])
        raise _err(
            path, f"line {body_nos[v]}", f"vertex {v + 1} lists itself; METIS forbids self loops"
        )
    try:
        g = Graph(indptr, indices, weights, n)
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from e
    asym = _find_asymmetry(g)
    if asym is not None:
        u, v = asym
        raise _err(
            path,
            f"line {body_nos[v]}",
            f"vertex {v + 1} lists {u + 1} but vertex {u + 1} (line {body_nos[u]}) does "
            f"not list {v + 1}{' with the same weight' if ew else ''}; METIS graphs "
            f"must be symmetric",
        )
    g.symmetric = True
    return g


def _metis_header(path, lineno, line):
    toks = line.split()
    where = f"line {lineno}"
    if not 2 <= len(toks) <= 4 or not all(t.isdigit() for t in toks):
        raise _err(
            path,
            where,
            f"expected a header 'n m [fmt [ncon]]' of non-negative "
            f"integers, found {_show(line.strip())}",
        )
    n, m = int(toks[0]), int(toks[1])
    fmt = toks[2].decode() if len(toks) > 2 else "0"
    if len(fmt) > 3 or set(fmt) - {"0", "1"}:
        raise _err(
            path,
            where,
            f"fmt {fmt!r} must be up to 3 digits of 0/1 "
            f"(vertex sizes, vertex weights, edge weights)",
        )
    fmt = fmt.zfill(3)
    vsize, vweights, ew = fmt[0] == "1", fmt[1] == "1", fmt[2] == "1"
    ncon = int(toks[3]) if len(toks) > 3 else int(vweights)
    if len(toks) > 3 and not vweights:
        raise _err(path, where, f"ncon = {ncon} is given but fmt {fmt!r} has no vertex weights")
    if vweights and ncon < 1:
        raise _err(path, where, f"ncon = {ncon} must be >= 1 when fmt has vertex weights")
    return n, m, int(vsize), ncon if vweights else 0, ew


def _metis_find_bad_token(path, lines, linenos):
    for ln, no in zip(lines, linenos, strict=True):
        for tok in ln.split():
            if not tok.isdigit():
                raise _err(path, f"line {no}", f"{_show(tok)} is not a non-negative integer")
            if len(tok) >= 19:
                raise _err(path, f"line {no}", f"{_show(tok)} is too large")


def _rows_sorted(g: Graph) -> bool:
    if g.num_edges < 2:
        return True
    desc = np.diff(g.indices.astype(np.int64)) < 0
    starts = g.indptr[1:-1]
    starts = starts[(starts > 0) & (starts < g.num_edges)]
    desc[starts - 1] = False
    return not desc.any()


def _canonical_rows(g: Graph) -> Graph:
    """g with each row ordered by (source, weight)."""
    rows = np.repeat(np.arange(g.num_nodes), g.in_degrees())
    order = np.lexsort((g.weights, g.indices, rows))
    return Graph(g.indptr, g.indices[order], g.weights[order], g.num_nodes, check=False)


def _find_asymmetry(g: Graph):
    """None when g equals its transpose (weights included), else (u, v): u->v lacks a twin."""
    s = g if _rows_sorted(g) else g.sort_rows()
    t = Graph(g.indptr, g.indices, g.weights, g.num_nodes, check=False).transpose()
    ds, dt = np.diff(s.indptr), np.diff(t.indptr)
    if not np.array_equal(ds, dt):
        v = int(np.flatnonzero(ds != dt)[0])
    else:
        if g.weights is not None and not (
            np.array_equal(s.indices, t.indices) and np.array_equal(s.weights, t.weights)
        ):
            s, t = _canonical_rows(s), _canonical_rows(t)
        differ = s.indices != t.indices
        if g.weights is not None:
            differ |= s.weights != t.weights
        if not differ.any():
            return None
        v = int(np.searchsorted(s.indptr, int(np.flatnonzero(differ)[0]), side="right")) - 1

    def row(h):
        a, b = h.indptr[v], h.indptr[v + 1]
        ws = h.weights[a:b].tolist() if h.weights is not None else [None] * int(b - a)
        return Counter(zip(h.indices[a:b].tolist(), ws, strict=True))

    rs, rt = row(s), row(t)
    extra = rs - rt
    if extra:
        return int(min(extra, key=lambda k: k[0])[0]), v
    return v, int(min(rt - rs, key=lambda k: k[0])[0])


def write_metis(graph: Graph, path) -> None:
    """Write METIS: header ``n m`` (``n m 1`` with integer edge weights), 1-based neighbours.

    The graph must be symmetric (checked, weights included) and free of self loops;
    weights, if any, must be positive integers.
    """
    path = os.fspath(path)
    src, dst = graph.edges()
    loops = np.flatnonzero(src == dst)
    if loops.size:
        v = int(dst[loops[0]])
        raise GraphError(
            f"{path}: cannot write METIS: node {v} has a self loop (edge "
            f"{int(loops[0])}); METIS forbids self loops, use remove_self_loops()"
        )
    asym = _find_asymmetry(graph)
    if asym is not None:
        u, v = asym
        raise GraphError(
            f"{path}: cannot write METIS: the graph is not symmetric: edge "
            f"{u}->{v} has no reverse edge {v}->{u}"
            f"{' of the same weight' if graph.weights is not None else ''}"
        )
    w = graph.weights
    if w is not None:
        bad = np.flatnonzero((w < 1) | (w != np.round(w)))
        if bad.size:
            e = int(bad[0])
            raise GraphError(
                f"{path}: cannot write METIS: weights[{e}] = {w[e]:g}; METIS edge "
                f"weights must be positive integers"
            )
    n, m = graph.num_nodes, graph.num_edges // 2
    ids = (graph.indices.astype(np.int64) + 1).astype(str)
    if w is not None:
        toks = np.empty(2 * ids.size, dtype=object)
        toks[0::2] = ids
        toks[1::2] = w.astype(np.int64).astype(str)
        per = 2
    else:
        toks, per = ids, 1
    toks = toks.tolist()
    ptr = (graph.indptr * per).tolist()
    with _open_write(path) as f:
        f.write(f"{n} {m}{' 1' if w is not None else ''}\n".encode())
        for a in range(0, n, _WRITE_ROWS):
            b = min(a + _WRITE_ROWS, n)
            text = "\n".join(" ".join(toks[ptr[v] : ptr[v + 1]]) for v in range(a, b))
            f.write((text + "\n").encode())


# ---- npz datasets ------------------------------------------------------------------------
_NODE_KEYS = ("y", "train_mask", "val_mask", "test_mask")
_SPARSE_X = ("x_indptr", "x_indices", "x_data", "x_shape")


def read_npz(path) -> Dataset:
    """Read the ``shared/data`` npz layout into a Dataset (sparse features stay sparse).

    Keys: ``indptr`` int [N+1], ``indices`` int [E], optional ``weights`` float [E], ``x``
    float [N, F] or ``x_indptr/x_indices/x_data/x_shape`` (CSR), ``y`` int [N], bool [N]
    masks, ``meta`` (0-d JSON string). ``meta["directed"] is False`` marks the graph
    symmetric (checked).
    """
    path = os.fspath(path)
    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise _err(path, "byte offset 0", f"not a readable .npz archive ({e})") from e
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise _err(path, "byte offset 0", "holds a single .npy array, not an .npz archive")
    with z:
        keys = set(z.files)
        arrays = {k: _npz_get(path, z, k) for k in sorted(keys)}
    for k in ("indptr", "indices"):
        if k not in arrays:
            raise _err(path, f"key {k!r}", f"missing (keys present: {sorted(keys)})")
    meta = _npz_meta(path, arrays.get("meta"))
    for k in ("indptr", "indices"):
        a = arrays[k]
        if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
            raise _err(path, f"key {k!r}", f"expected a 1-D integer array, got {a.dtype} {a.shape}")
    weights = arrays.get("weights")
    if weights is not None and (weights.dtype.kind not in "fiu" or weights.ndim != 1):
        raise _err(
            path,
            "key 'weights'",
            f"expected a 1-D float array, got {weights.dtype} {weights.shape}",
        )
    try:
        g = Graph(arrays["indptr"], arrays["indices"], weights)
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from e
    n = g.num_nodes
    if meta.get("directed") is False:
        asym = _find_asymmetry(g)
        if asym is not None:
            u, v = asym
            raise _err(
                path,
                "key 'indices'",
                f"meta says the graph is undirected but edge {u}->{v} has no reverse edge {v}->{u}",
            )
        g.symmetric = True
    x = _npz_features(path, arrays, n)
    for k in _NODE_KEYS:
        a = arrays.get(k)
        if a is not None and a.shape != (n,):
            raise _err(path, f"key {k!r}", f"shape {a.shape}, expected ({n},) (one per node)")
    if "y" in arrays and not np.issubdtype(arrays["y"].dtype, np.integer):
        raise _err(path, "key 'y'", f"labels must be integers, got {arrays['y'].dtype}")
    for k in _NODE_KEYS[1:]:
        if k in arrays and arrays[k].dtype != bool:
            raise _err(path, f"key {k!r}", f"masks must be bool, got {arrays[k].dtype}")
    name = meta.get("name") if isinstance(meta.get("name"), str) else _stem(path)
    num_classes = meta.get("num_classes")
    if not isinstance(num_classes, int) or isinstance(num_classes, bool):
        num_classes = None
    try:
        return Dataset(
            name, g, x, *(arrays.get(k) for k in _NODE_KEYS), num_classes=num_classes, meta=meta
        )
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from e


def _npz_get(path, z, key):
    try:
        return z[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise _err(path, f"key {key!r}", f"cannot be read ({e})") from e


def _npz_meta(path, a) -> dict:
    if a is None:
        return {}
    if a.ndim != 0 or a.dtype.kind not in "US":
        raise _err(path, "key 'meta'", f"expected a 0-d JSON string, got {a.dtype} {a.shape}")
    text = a.item()
    try:
        meta = json.loads(text.decode() if isinstance(text, bytes) else text)
    except (ValueError, UnicodeDecodeError) as e:
        raise _err(path, "key 'meta'", f"not valid JSON ({e})") from e
    if not isinstance(meta, dict):
        raise _err(path, "key 'meta'", f"expected a JSON object, got {type(meta).__name__}")
    return meta


def _npz_features(path, arrays, n):
    sparse_keys = [k for k in _SPARSE_X if k in arrays]
    if "x" in arrays:
        if sparse_keys:
            raise _err(path, "key 'x'", f"both dense 'x' and sparse {sparse_keys} are present")
        x = arrays["x"]
        if x.ndim != 2 or x.shape[0] != n or x.dtype.kind not in "fiub":
            raise _err(
                path, "key 'x'", f"expected numeric features [{n}, F], got {x.dtype} {x.shape}"
            )
        if x.dtype.kind == "f":
            bad = ~np.isfinite(x) if x.dtype.itemsize <= 4 else ~(np.abs(x) <= _FLOAT32_MAX)
            if bad.any():
                r, c = (int(i) for i in np.argwhere(bad)[0])
                raise _err(
                    path, "key 'x'", f"x[{r}, {c}] is {x[r, c]}; features must be finite float32"
                )
        return x
    if not sparse_keys:
        return None
    missing = [k for k in _SPARSE_X if k not in arrays]
    if missing:
        raise _err(
            path, f"key {missing[0]!r}", f"missing; sparse features need all of {list(_SPARSE_X)}"
        )
    ptr, ind, data, shape = (arrays[k] for k in _SPARSE_X)
    for k, a in zip(_SPARSE_X, (ptr, ind, data, shape), strict=True):
        kinds = "fiu" if k == "x_data" else "iu"
        if a.ndim != 1 or (a.dtype.kind not in kinds and a.size):
            raise _err(
                path,
                f"key {k!r}",
                f"expected a 1-D {'numeric' if k == 'x_data' else 'integer'} array, got "
                f"{a.dtype} {a.shape}",
            )
    if shape.size != 2 or shape.min() < 0:
        raise _err(path, "key 'x_shape'", f"expected [rows, cols] >= 0, got {shape.tolist()}")
    rows, cols = int(shape[0]), int(shape[1])
    if rows != n:
        raise _err(path, "key 'x_shape'", f"{rows} feature rows, expected {n} (one per node)")
    if ptr.size != rows + 1:
        raise _err(
            path, "key 'x_indptr'", f"{ptr.size} entries, expected x_shape[0]+1 = {rows + 1}"
        )
    if ptr[0] != 0:
        raise _err(path, "key 'x_indptr'", f"x_indptr[0] is {ptr[0]}, expected 0")
    dec = np.flatnonzero(np.diff(ptr) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise _err(
            path,
            "key 'x_indptr'",
            f"not monotone: x_indptr[{i}] = {ptr[i]} < x_indptr[{i - 1}] = {ptr[i - 1]}",
        )
    if ptr[-1] != ind.size:
        raise _err(
            path,
            "key 'x_indptr'",
            f"x_indptr[-1] is {ptr[-1]} but x_indices has {ind.size} entries",
        )
    if data.size != ind.size:
        raise _err(path, "key 'x_data'", f"{data.size} entries but x_indices has {ind.size}")
    out = np.flatnonzero((ind < 0) | (ind >= cols))
    if out.size:
        i = int(out[0])
        raise _err(path, "key 'x_indices'", f"x_indices[{i}] = {ind[i]} is outside [0, {cols})")
    bad = np.flatnonzero(~(np.abs(data) <= _FLOAT32_MAX))
    if bad.size:
        i = int(bad[0])
        r = int(np.searchsorted(ptr, i, side="right")) - 1
        raise _err(
            path,
            "key 'x_data'",
            f"x_data[{i}] (row {r}) is {data[i]}; features must be finite float32",
        )
    return sp.csr_matrix((data.astype(np.float32, copy=False), ind, ptr), shape=(rows, cols))


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"meta value of type {type(o).__name__} is not JSON serializable")


def write_npz(dataset: Dataset, path) -> None:
    """Write a Dataset in the ``shared/data`` layout (compressed; sparse x as x_* CSR keys).

    ``meta`` gets name, num_nodes, num_edges, num_classes and ``directed`` (False only when
    the graph is marked symmetric).
    """
    path = os.fspath(path)
    g = dataset.graph
    arrays = {"indptr": g.indptr.astype(np.int64, copy=False), "indices": g.indices}
    if g.weights is not None:
        arrays["weights"] = g.weights
    x = dataset.x
    if x is not None and sp.issparse(x):
        x = sp.csr_matrix(x)
        arrays.update(
            x_indptr=x.indptr.astype(np.int64),
            x_indices=x.indices.astype(np.int32),
            x_data=x.data.astype(np.float32),
            x_shape=np.array(x.shape, dtype=np.int64),
        )
    elif x is not None:
        arrays["x"] = np.asarray(x, dtype=np.float32)
    for k in _NODE_KEYS:
        a = getattr(dataset, k)
        if a is not None:
            arrays[k] = a
    meta = dict(dataset.meta)
    meta.update(name=dataset.name, num_nodes=g.num_nodes, num_edges=g.num_edges)
    if dataset.num_classes is not None:
        meta["num_classes"] = int(dataset.num_classes)
    if g.symmetric:
        meta["directed"] = False
    elif g.symmetric is False:
        meta["directed"] = True
    elif meta.get("directed") is False:
        del meta["directed"]
    arrays["meta"] = np.array(json.dumps(meta, default=_json_default))
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)


# ---- MGG binary CSR ----------------------------------------------------------------------
def _mgg_paths(prefix_or_path) -> tuple[str, str]:
    p = os.fspath(prefix_or_path)
    for suffix in (_BEG_SUFFIX, _CSR_SUFFIX):
        if p.endswith(suffix):
            p = p[: -len(suffix)]
            break
    return p + _BEG_SUFFIX, p + _CSR_SUFFIX


def _read_int64(path: str) -> np.ndarray:
    size = os.path.getsize(path)
    if size % 8:
        raise _err(
            path,
            f"byte offset {size - size % 8}",
            f"file size {size} bytes is not a multiple of 8 (int64 entries): "
            f"{size % 8} trailing bytes",
        )
    return np.fromfile(path, dtype="<i8")


def read_mgg_bin(prefix_or_path) -> Graph:
    """Read the MGG artifact's CSR: ``<prefix>_beg_pos.bin`` int64 [N+1] and
    ``<prefix>_csr.bin`` int64 [E] (raw little-endian). Accepts the prefix or either file.
    """
    beg_path, csr_path = _mgg_paths(prefix_or_path)
    beg = _read_int64(beg_path)
    csr = _read_int64(csr_path)
    if beg.size == 0:
        raise _err(beg_path, "byte offset 0", "empty file; beg_pos needs N+1 >= 1 entries")
    if beg[0] != 0:
        raise _err(beg_path, "element 0 (byte offset 0)", f"beg_pos[0] is {beg[0]}, expected 0")
    dec = np.flatnonzero(np.diff(beg) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise _err(
            beg_path,
            f"element {i} (byte offset {8 * i})",
            f"beg_pos is not monotone: beg_pos[{i}] = {beg[i]} < beg_pos[{i - 1}] = {beg[i - 1]}",
        )
    n = beg.size - 1
    if beg[-1] != csr.size:
        raise _err(
            beg_path,
            f"element {n} (byte offset {8 * n})",
            f"last entry beg_pos[{n}] = {beg[-1]} but {csr_path} holds {csr.size} entries",
        )
    out = np.flatnonzero((csr < 0) | (csr >= n))
    if out.size:
        i = int(out[0])
        raise _err(
            csr_path, f"element {i} (byte offset {8 * i})", f"node id {csr[i]} is outside [0, {n})"
        )
    try:
        return Graph(beg, csr, None, n)
    except GraphError as e:
        raise GraphError(f"{beg_path}: {e}") from e


def write_mgg_bin(graph: Graph, prefix) -> tuple[str, str]:
    """Write ``<prefix>_beg_pos.bin`` and ``<prefix>_csr.bin`` (int64); returns both paths.

    The format has no weights: a weighted graph is written without them (with a warning).
    """
    beg_path, csr_path = _mgg_paths(prefix)
    if graph.weights is not None:
        warnings.warn("the MGG binary CSR stores no edge weights; they are dropped", stacklevel=2)
    graph.indptr.astype("<i8").tofile(beg_path)
    graph.indices.astype("<i8").tofile(csr_path)
    return beg_path, csr_path


# ---- dispatch ----------------------------------------------------------------------------
def _format(path: str) -> str:
    name = os.path.basename(path).lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((_BEG_SUFFIX, _CSR_SUFFIX)):
        return "mgg"
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith((".graph", ".metis")):
        return "metis"
    if not os.path.exists(path) and os.path.exists(path + _BEG_SUFFIX):
        return "mgg"
    return "edgelist"


def _stem(path: str) -> str:
    name = os.path.basename(os.fspath(path))
    for suffix in (".gz", _BEG_SUFFIX, _CSR_SUFFIX):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return Path(name).stem if "." in name else name


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
    return Dataset(_stem(path), read_graph(path, **kw))


def write_graph(graph: Graph | Dataset, path) -> None:
    """Write by suffix, as :func:`read_graph` reads; a Dataset keeps its node data in npz."""
    path = os.fspath(path)
    fmt = _format(path)
    if fmt == "npz":
        ds = graph if isinstance(graph, Dataset) else Dataset(_stem(path), graph)
        write_npz(ds, path)
        return
    g = graph.graph if isinstance(graph, Dataset) else graph
    if fmt == "metis":
        write_metis(g, path)
    elif fmt == "mgg":
        write_mgg_bin(g, path)
    else:
        write_edgelist(g, path)
