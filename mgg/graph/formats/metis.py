"""METIS ``.graph`` files: a header ``n m [fmt [ncon]]``, then one line of 1-based
neighbours per vertex."""

from __future__ import annotations

import os
import zlib

import numpy as np

from ...memory import csr_bytes, require
from ..core import Graph, GraphError
from ._common import (
    BOM,
    DIGITS_WS,
    MAX_ID,
    WRITE_ROWS,
    err,
    find_asymmetry,
    open_binary,
    open_write,
    show,
)
from .base import Format

__all__ = ["FORMAT", "read_metis", "write_metis"]


def _read_all(path: str) -> bytes:
    with open_binary(path) as f:
        try:
            return f.read()
        except (EOFError, OSError, zlib.error) as e:
            raise err(path, "byte offset 0", f"corrupt or truncated gzip stream ({e})") from e


def read_metis(path) -> Graph:
    """Read a METIS graph: header ``n m [fmt [ncon]]``, then line i lists vertex i's neighbours.

    Ids are 1-based. ``fmt`` digits mean (vertex sizes, vertex weights, edge weights); vertex
    sizes and weights are skipped, edge weights become float32 weights [E]. Each undirected
    edge appears in both endpoints' lines, so E = 2m; the result is checked to be symmetric,
    without self loops, and marked ``symmetric=True``.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if not gz:  # the text, its lines and one int64 per token: about 6 bytes per byte
        require(6 * os.path.getsize(path), "reading the file", path)
    data = _read_all(path)
    if data.startswith(BOM):
        data = data[len(BOM) :]
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
        raise err(
            path,
            f"line {max(len(linenos) and linenos[-1], 1)}",
            "empty file: expected a header 'n m [fmt [ncon]]'",
        )
    hline = linenos[h]
    n, m, vsize, ncon, ew = _metis_header(path, hline, lines[h])
    require(
        csr_bytes(n, 2 * m, ew),
        f"line {hline}: the header declares {n:,} vertices and {m:,} edges, whose CSR",
        path,
        "check the header 'n m [fmt [ncon]]'",
    )
    body_lines = lines[h + 1 :]
    body_nos = linenos[h + 1 :]
    if len(body_lines) < n:
        last = body_nos[-1] if len(body_nos) else hline
        raise err(
            path,
            f"line {last}",
            f"the header (line {hline}) declares {n} vertices but the file has "
            f"{len(body_lines)} vertex lines",
        )
    for ln, no in zip(body_lines[n:], body_nos[n:], strict=True):
        if ln.strip():
            raise err(
                path,
                f"line {no}",
                f"more than {n} vertex lines (the header on line {hline} declares {n})",
            )
    body_lines = body_lines[:n]
    body = b"\n".join(body_lines) + b"\n" if n else b""
    if body.translate(None, DIGITS_WS):
        _metis_find_bad_token(path, body_lines, body_nos)
        body = body.translate(bytes.maketrans(b"\x0b\x0c", b"  "))
    arr = (
        np.fromstring(body.replace(b"\n", b" -1 "), dtype=np.int64, sep=" ")
        if n
        else np.empty(0, np.int64)
    )
    ends = np.flatnonzero(arr < 0)
    if ends.size != n:
        raise err(path, f"line {hline}", f"could not split the body into {n} vertex lines")
    counts = np.diff(ends, prepend=-1) - 1
    vals = arr[arr >= 0]
    if vals.size and vals.max() >= MAX_ID:
        _metis_find_bad_token(path, body_lines, body_nos)
    prefix = vsize + ncon
    step = 2 if ew else 1
    bad = np.flatnonzero((counts < prefix) | ((counts - prefix) % step != 0))
    if bad.size:
        i = int(bad[0])
        what = f"{prefix} vertex size/weight values then " if prefix else ""
        raise err(
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
        raise err(
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
        raise err(
            path,
            f"line {body_nos[v]}",
            f"neighbour id {int(nbrs[e])} is outside [1, {n}] (METIS ids are 1-based)",
        )
    indices = nbrs - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), degrees)
    loops = np.flatnonzero(indices == rows)
    if loops.size:
        v = int(rows[loops[0]])
        raise err(
            path, f"line {body_nos[v]}", f"vertex {v + 1} lists itself; METIS forbids self loops"
        )
    try:
        g = Graph(indptr, indices, weights, n)
    except GraphError as e:
        raise GraphError(f"{path}: {e}") from e
    asym = find_asymmetry(g)
    if asym is not None:
        u, v = asym
        raise err(
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
        raise err(
            path,
            where,
            f"expected a header 'n m [fmt [ncon]]' of non-negative "
            f"integers, found {show(line.strip())}",
        )
    for t in toks[:2]:
        if len(t.lstrip(b"0")) > len(str(MAX_ID)):
            raise err(path, where, f"{show(t)} ({len(t):,} digits) is too large")
    n, m = int(toks[0]), int(toks[1])
    fmt = toks[2].decode() if len(toks) > 2 else "0"
    if len(fmt) > 3 or set(fmt) - {"0", "1"}:
        raise err(
            path,
            where,
            f"fmt {fmt!r} must be up to 3 digits of 0/1 "
            f"(vertex sizes, vertex weights, edge weights)",
        )
    fmt = fmt.zfill(3)
    vsize, vweights, ew = fmt[0] == "1", fmt[1] == "1", fmt[2] == "1"
    if len(toks) > 3 and len(toks[3]) > 6:
        raise err(path, where, f"ncon {show(toks[3])} is too large")
    ncon = int(toks[3]) if len(toks) > 3 else int(vweights)
    if len(toks) > 3 and not vweights:
        raise err(path, where, f"ncon = {ncon} is given but fmt {fmt!r} has no vertex weights")
    if vweights and ncon < 1:
        raise err(path, where, f"ncon = {ncon} must be >= 1 when fmt has vertex weights")
    return n, m, int(vsize), ncon if vweights else 0, ew


def _metis_find_bad_token(path, lines, linenos):
    for ln, no in zip(lines, linenos, strict=True):
        for tok in ln.split():
            if not tok.isdigit():
                raise err(path, f"line {no}", f"{show(tok)} is not a non-negative integer")
            if len(tok) >= 19:
                raise err(path, f"line {no}", f"{show(tok)} is too large")


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
    asym = find_asymmetry(graph)
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
    with open_write(path) as f:
        f.write(f"{n} {m}{' 1' if w is not None else ''}\n".encode())
        for a in range(0, n, WRITE_ROWS):
            b = min(a + WRITE_ROWS, n)
            text = "\n".join(" ".join(toks[ptr[v] : ptr[v + 1]]) for v in range(a, b))
            f.write((text + "\n").encode())


FORMAT = Format(
    "metis",
    "METIS",
    read_metis,
    (".graph", ".metis"),
    gzip=True,
    write=write_metis,
    written=".graph/.metis (METIS)",
)
