"""Text lines of node ids (``src dst [weight]`` edges, or one id a line), parsed in
chunks of about ``CHUNK_BYTES`` in parallel threads, in bulk with numpy; a chunk that looks
wrong gets a line-by-line pass that reports its first bad line. The edge list reader, the
OGB readers and the distributed partitioner's slices share it.
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
from ..core import IDS_HINT
from ._common import BOM, DIGITS_WS, FLOAT32_MAX, MAX_ID, err, open_binary, show

__all__ = [
    "CHUNK_BYTES",
    "Chunk",
    "LineError",
    "LineSpec",
    "concat",
    "edge_chunks",
    "num_workers",
    "parse_chunk",
    "parse_lines",
    "peek",
    "read_chunks",
    "read_node_ids",
]

CHUNK_BYTES = 1 << 24
_EXACT_INT = 2**53
_NODES_HEADER = re.compile(rb"nodes\s*[:=]\s*(\d+)", re.IGNORECASE)
_ID_DIGITS = len(str(MAX_ID))


class LineError(Exception):
    """A problem on line ``rel`` (0-based) of a chunk; the driver adds the chunk's offset."""

    def __init__(self, rel: int, problem: str):
        super().__init__(problem)
        self.rel, self.problem = rel, problem


class LineSpec:
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
        self.lines = 0  # lines read so far (edge_chunks)


class Chunk:
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


def num_workers() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(8, os.cpu_count() or 1))


def read_chunks(f, path):
    """Yield blocks of whole lines (each ending in a newline) of about CHUNK_BYTES."""
    offset = 0
    first = True
    while True:
        try:
            block = f.read(CHUNK_BYTES)
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


def peek(spec: LineSpec, chunk: bytes, line0: int, path) -> bool:
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


def _header(spec: LineSpec, digits: bytes, lineno: int, path) -> None:
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


def _limit(spec: LineSpec):
    """(the bound ids must stay below, or None; how the message names it)."""
    if spec.num_nodes is not None:
        return spec.num_nodes, f"num_nodes = {spec.num_nodes}"
    if spec.strict_header and spec.header_nodes is not None:
        n = spec.header_nodes
        return n, f"{n}, the node count of the 'Nodes: {n}' header on line {spec.header_line}"
    return None, ""


def parse_chunk(spec: LineSpec, chunk: bytes) -> Chunk:
    """Parse whole lines; raises LineError at the first bad line."""
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
    return Chunk(*parsed, nlines, hi)


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


def _parse_fast(spec: LineSpec, chunk: bytes, nlines: int):
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
            raise LineError(i, _ncol_problem(spec, int(counts[i])))
        vals = arr[~neg].reshape(-1, k)
        rel = data_lines if spec.want_lines else None
    w = None
    if k == 3:
        if vals.shape[0] and vals[:, 2].max() > _EXACT_INT:
            return None
        w = vals[:, 2].astype(np.float32)
    return vals[:, :2], w, rel


def _parse_weighted(spec: LineSpec, chunk: bytes):
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


def _parse_slow(spec: LineSpec, chunk: bytes):
    """Line by line: raises LineError at the first bad line, else returns the edges."""
    ids, ws, rel = [], [], []
    delim, k = spec.delim, spec.ncol
    for i, line in enumerate(chunk.split(b"\n")[:-1]):
        if delim is not None and delim in line:
            fields = line.split(delim)
            if any(not f.strip() for f in fields):
                raise LineError(i, f"empty field between {delim.decode()!r} separators")
            toks = b" ".join(fields).split()
        else:
            toks = line.split()
        if not toks:
            continue
        for tok in toks:
            if tok[:1] in spec.comment_chars:
                raise LineError(
                    i,
                    f"comment {show(tok[:1])} after data: comments must be on lines of their own",
                )
        if len(toks) != k:
            raise LineError(i, _ncol_problem(spec, len(toks)))
        ids.append(tuple(_node_id(spec, toks[c], i, c + 1) for c in range(min(k, 2))))
        if k == 3:
            ws.append(_weight(toks[2], i))
        rel.append(i)
    ids = np.array(ids, dtype=np.int64).reshape(-1, min(k, 2))
    w = np.array(ws, dtype=np.float32) if k == 3 else None
    return ids, w, (np.array(rel, np.int64) if spec.want_lines else None)


def _ncol_problem(spec: LineSpec, n: int) -> str:
    return f"expected {spec.ncol} columns as on line {spec.ncol_line}, found {n}"


def _node_id(spec: LineSpec, tok: bytes, rel: int, col: int) -> int:
    if not (tok.isdigit() or (tok[:1] == b"+" and tok[1:].isdigit())):
        if tok[:1] == b"-" and tok[1:].isdigit():
            raise LineError(rel, f"negative node id {show(tok)} in column {col}")
        raise LineError(rel, f"node id {show(tok)} in column {col} is not a non-negative integer")
    if len(tok.lstrip(b"+0")) > _ID_DIGITS:
        digits = len(tok.lstrip(b"+0"))
        raise LineError(
            rel, f"node id {show(tok)} ({digits:,} digits) in column {col} is too large"
        )
    val = int(tok)
    if val >= MAX_ID:
        raise LineError(rel, f"node id {show(tok)} in column {col} is too large")
    limit, what = _limit(spec)
    if limit is not None and val >= limit:
        raise LineError(rel, f"node id {val} in column {col} is >= {what}")
    return val


def _weight(tok: bytes, rel: int) -> float:
    try:
        val = float(tok)
    except ValueError:
        raise LineError(rel, f"weight {show(tok)} in column 3 is not a number") from None
    if not math.isfinite(val) or abs(val) > FLOAT32_MAX:
        raise LineError(rel, f"weight {show(tok)} in column 3 is not a finite float32")
    return val


def parse_lines(
    path, num_nodes, comments, delimiter, want_lines=False, columns=(2, 3), strict_header=False
):
    """(spec, list of Chunk with absolute ``lines``, number of lines in the file).

    ``strict_header``: ids must lie below a ``Nodes: N`` header's N. The largest id so far
    is checked against memory chunk by chunk (its indptr needs 8 bytes per node)."""
    spec = LineSpec(num_nodes, comments, delimiter, want_lines, columns)
    spec.strict_header = strict_header
    done = list(edge_chunks(spec, path))
    return spec, done, spec.lines


def edge_chunks(spec: LineSpec, path):
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
        except LineError as e:
            raise err(path, f"line {line0 + e.rel}", e.problem) from None
        if part.hi > top[0] and top[1] is not None:
            top[0] = part.hi
            if csr_bytes(part.hi + 1, 0, build=False) > top[1]:
                _too_many_nodes(spec, chunk, part.hi, line0, path)
        if part.lines is not None:
            part.lines = part.lines + line0
        spec.lines += part.nlines
        return part

    workers = num_workers()
    with open_binary(path) as f, ThreadPoolExecutor(workers) as pool:
        try:
            for chunk in read_chunks(f, path):
                if spec.ncol is None:
                    while pending:
                        yield collect()
                    if not peek(spec, chunk, spec.lines + 1, path):
                        spec.lines += chunk.count(b"\n")
                        continue
                pending.append((pool.submit(parse_chunk, spec, chunk), chunk))
                if len(pending) > workers:
                    yield collect()
            while pending:
                yield collect()
        finally:
            for job, _ in pending:
                job.cancel()


def _too_many_nodes(spec: LineSpec, chunk: bytes, hi: int, line0: int, path):
    """ResourceError naming the line of id ``hi``, whose indptr cannot fit."""
    slow = LineSpec(None, "", None, True, spec.columns)
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


def read_node_ids(path, num_nodes: int, *, comments="#%") -> np.ndarray:
    """int64 [L]: a file of one node id per line (plain or gzip; an OGB split file), each
    checked to lie in [0, num_nodes); parsed in chunks as an edge list is."""
    path = os.fspath(path)
    _, parts, _ = parse_lines(path, int(num_nodes), comments, None, columns=(1,))
    return concat([p.src for p in parts], np.int32).astype(np.int64)


def concat(arrays, dtype):
    """The arrays that are not None as one (of ``dtype`` when there are none)."""
    arrays = [a for a in arrays if a is not None]
    if not arrays:
        return np.empty(0, dtype)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
