"""numba kernels that run one rank's LNP/RNP plan on the CPU.

An aggregation is three steps over a rank's output rows ``out`` [n, D]:
``init`` (zeros, or (1+eps)·x for GIN), ``accumulate`` over neighbor partitions, once for
the LNPs reading local rows and once (or batch by batch) for the RNPs reading fetched
rows, and ``finalize`` (divide by the in-degree for mean). A rank whose in-edges are all
local (no RNPs: P = 1) runs the three at once instead (``aggregate_rows``): each row is
summed in its thread and written once, rounded there for bf16 rows.
"""

from __future__ import annotations

from collections import namedtuple

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..precision import accumulator, bits
from . import checks as check
from .bf16 import load, put

OPS = ("sum", "mean", "gcn", "gin")

# How the kernels end a node's sums: added to out (once False: accumulate's; store a
# [0, D] array of the rows' dtype), or, once True (aggregate_rows), summed in a float row
# of the chunk and stored into store [n, D] (bf16 words or floats): (1+eps)·x[v] first
# (init, from_x: GIN), divided by deg[v] (mean).
Fold = namedtuple("Fold", "store once init from_x deg mean")


def init_out(op: str, x: np.ndarray, out: np.ndarray, eps: float = 0.0) -> None:
    """out [n, D] (the sums: float32 for bf16 rows x) <- 0, or (1+eps)·x[:n] for GIN."""
    _check_sums(x, out)
    if op == "gin":
        n = out.shape[0]
        check.same_width(x, out, "init_out", "x")
        check.need(x.shape[0] >= n, "init_out", lambda: f"x has {x.shape[0]} rows, out {n}")
        _scale_rows(
            bits(np.ascontiguousarray(x[:n])).ravel(), out.ravel(), out.dtype.type(1.0 + eps)
        )
    else:
        _zero(out)


def _check_sums(src, out) -> None:
    """ValueError unless ``out`` is what rows of src's dtype are summed in."""
    if out.dtype != accumulator(src.dtype):
        raise ValueError(
            f"{src.dtype} rows are summed in {accumulator(src.dtype)}, not {out.dtype}"
        )


def finalize(op: str, in_degrees: np.ndarray, out: np.ndarray) -> None:
    """Divide each row by its in-degree for mean (rows of isolated nodes stay 0)."""
    if op == "mean":
        check.need(
            in_degrees.size >= out.shape[0],
            "finalize",
            lambda: f"in_degrees has {in_degrees.size} entries for {out.shape[0]} rows",
        )
        _divide_rows(out, in_degrees)


def accumulate(part_ptr, part_node, k0: int, k1: int, indices, weights, src, out) -> None:
    """out[node[k]] += sum_e w_e · src[indices[e]] for partitions k in [k0, k1).

    part_ptr int64 [K+1], part_node int32 [K]  neighbor partitions (LNP or RNP)
    indices  int [E]    rows of ``src`` (local rows, or halo slots)
    weights  float32 [E], or [E, H] per head (D = H·C: column j takes w[e, j // C]),
             or None
    src      [R, D] rows read (float32, float64, or bf16: widened on load)
    out      [n, D] the sums (float32 for bf16 rows; both C-contiguous)
    Partitions are spread over threads in edge-balanced chunks (a static schedule: a
    dynamic one measured the same, and setting it inside compiled code defeats numba's
    cache); a node whose partitions straddle two chunks gets its tail through a
    per-chunk carry row, so no two threads write one row.
    """
    check.same_width(src, out, "accumulate")
    check.partitions(part_ptr, part_node, k0, k1, indices, weights, "accumulate")
    if k1 <= k0 or out.shape[1] == 0:
        return
    _check_sums(src, out)
    src = bits(src)
    fold = Fold(src[:0], False, out.dtype.type(0), False, np.empty(0, np.int64), False)
    _dispatch(part_ptr, part_node, k0, k1, indices, weights, src, out, fold)


def aggregate_rows(
    op: str, part_ptr, part_node, indices, weights, x, out, eps, in_degrees, isolated=True
):
    """out [n, D] <- op's whole aggregation, when partitions [0, K) hold every in-edge of
    the n rows (a rank without remote edges): init, sums, mean's division and bf16's
    rounding in one pass. Each row is summed in a float row of its thread and stored
    once: out is written once, and bf16 rows need no float32 [n, D] sums nor a pass
    that rounds them. Arguments as ``accumulate``'s; x [>= n, D] the local rows (GIN's
    (1+eps)·x[v]), out like x's rows, in_degrees int [n] (0: a row with no partition);
    ``isolated``: whether some row has none (False: no pass over the rows for them).
    """
    check.same_width(x, out, "aggregate_rows", "x")
    n, d = out.shape
    check.need(x.shape[0] >= n, "aggregate_rows", lambda: f"x has {x.shape[0]} rows, out {n}")
    check.need(
        in_degrees.size >= n,
        "aggregate_rows",
        lambda: f"in_degrees has {in_degrees.size} entries for {n} rows",
    )
    check.partitions(part_ptr, part_node, 0, part_node.size, indices, weights, "aggregate_rows")
    if n == 0 or d == 0:
        return
    if out.dtype != x.dtype:
        raise ValueError(f"out is {out.dtype}, expected the rows' {x.dtype}")
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("aggregate_rows needs C-contiguous x and out arrays")
    acc = accumulator(x.dtype)
    x, store = bits(x), bits(out)
    deg = np.ascontiguousarray(in_degrees, np.int64)
    fold = Fold(store, True, acc.type(1.0 + eps), op == "gin", deg, op == "mean")
    if part_node.size:
        sums = np.empty((0, d), acc)  # none: the rows are summed in the threads' rows
        _dispatch(part_ptr, part_node, 0, part_node.size, indices, weights, x, sums, fold)
    if isolated:
        _fill_isolated(x, fold)


def _dispatch(part_ptr, part_node, k0, k1, indices, weights, src, out, fold) -> None:
    """The weight kind's kernel over partitions [k0, k1), ending each node as ``fold``
    says."""
    d = out.shape[1]
    if not (src.flags.c_contiguous and out.flags.c_contiguous and fold.store.flags.c_contiguous):
        raise ValueError("accumulate needs C-contiguous src and out arrays")
    nchunks = min(numba.get_num_threads() * 32, k1 - k0)
    if weights is None:
        _run(part_ptr, part_node, k0, k1, nchunks, indices, src, out, fold)
    elif weights.ndim == 1:
        _run_w(part_ptr, part_node, k0, k1, nchunks, indices, weights, src, out, fold)
    else:
        if d % weights.shape[1]:
            raise ValueError(f"{weights.shape[1]} heads do not divide the width {d}")
        _run_heads(part_ptr, part_node, k0, k1, nchunks, indices, weights, src, out, fold)


# One compiled entry per weight kind: cutting the chunks, the kernel and the carries in
# one call from Python (they were four, plus a chunk-size context: 55 -> 26 us for a
# 64-node graph; a whole aggregation of Cora at D = 16 takes 60-90 us).
@numba.njit(cache=True)
def _chunks(part_ptr, k0, k1, nchunks, out, fold):
    """Edge-balanced cuts [nchunks+1] of partitions [k0, k1), their carry rows [nchunks, D]
    (like out's) and, folding, their head rows (like carry)."""
    e0, e1 = part_ptr[k0], part_ptr[k1]
    cuts = np.empty(nchunks + 1, np.int64)
    cuts[0], cuts[nchunks] = k0, k1
    for c in range(1, nchunks):
        target = e0 + (e1 - e0) * c // nchunks
        lo, hi = k0, k1  # first k with part_ptr[k] >= target (np.searchsorted costs 2 s
        while lo < hi:  # of compiling on a cold cache)
            mid = (lo + hi) // 2
            if part_ptr[mid] < target:
                lo = mid + 1
            else:
                hi = mid
        cuts[c] = lo
    carry = np.zeros((nchunks, out.shape[1]), out.dtype)
    return cuts, carry, np.zeros((nchunks if fold.once else 0, out.shape[1]), out.dtype)


@numba.njit(cache=True)
def _run(part_ptr, part_node, k0, k1, nchunks, indices, src, out, fold):
    cuts, carry, head = _chunks(part_ptr, k0, k1, nchunks, out, fold)
    _accumulate(part_ptr, part_node, cuts, indices, src, out, carry, head, fold)
    _merge_carries(part_node, cuts, out, carry, head, fold)


@numba.njit(cache=True)
def _run_w(part_ptr, part_node, k0, k1, nchunks, indices, weights, src, out, fold):
    cuts, carry, head = _chunks(part_ptr, k0, k1, nchunks, out, fold)
    _accumulate_w(part_ptr, part_node, cuts, indices, weights, src, out, carry, head, fold)
    _merge_carries(part_node, cuts, out, carry, head, fold)


@numba.njit(cache=True)
def _run_heads(part_ptr, part_node, k0, k1, nchunks, indices, weights, src, out, fold):
    cuts, carry, head = _chunks(part_ptr, k0, k1, nchunks, out, fold)
    _accumulate_heads(part_ptr, part_node, cuts, indices, weights, src, out, carry, head, fold)
    _merge_carries(part_node, cuts, out, carry, head, fold)


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Ask the CPU to start loading the cache line of arr (1-D) at flat index idx."""

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), i8p)
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8",
        )
        # read, high temporal locality, data cache
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


# How far ahead (in edges) the next source rows are prefetched. Gathering rows is bound
# by memory latency, not bandwidth; prefetching 16 edges ahead hides it (measured in
# bench/cpu_aggregation.py: 1.3-1.6x over no prefetch).
PREFETCH = 16


# A kernel's node k of chunk c sums into dst[base:base+D]: out's row (or carry[c] for
# the chunk's first node when its partitions began in the chunk before), or, with
# fold.once (aggregate_rows), a float row of the chunk's own (_open_row) that _end_node
# stores once the node's partitions in the chunk are done.
@numba.njit(cache=True, inline="always")
def _chunk(part_node, cuts, c, carry, fold):
    """Chunk c's partitions [c0, c1), whether its first node began in the chunk before
    (straddle), and its float row (folding; else empty)."""
    c0, c1 = cuts[c], cuts[c + 1]
    straddle = c > 0 and c0 < c1 and part_node[c0] == part_node[c0 - 1]
    return c0, c1, straddle, np.empty(carry.shape[1] if fold.once else 0, carry.dtype)


@numba.njit(cache=True, inline="always")
def _open_row(part_node, k, c0, tail, row, sf, d, fold):
    """Folding, at the first partition in the chunk of partition k's node v: its row
    starts at (1+eps)·x[v] (GIN, unless it is the tail of a node begun in the chunk
    before), else at 0."""
    v = part_node[k]
    if k > c0 and part_node[k - 1] == v:
        return
    if fold.from_x and not tail:
        b = np.uint64(v) * d
        for j in range(d):
            row[j] = fold.init * load(sf, b + j)
    else:
        for j in range(d):
            row[j] = 0


@numba.njit(cache=True, inline="always")
def _end_node(part_node, k, c, c1, tail, row, cf, hf, tf, d, fold):
    """Folding, after the node's last partition in chunk c: its row to carry[c] (a
    tail), to head[c] (it goes on in the next chunk: _merge_carries adds its tails), or
    stored."""
    v = part_node[k]
    if not fold.once or (k + 1 < c1 and part_node[k + 1] == v):
        return
    spills = k + 1 == c1 and c1 < part_node.size and part_node[c1] == v
    if tail or spills:
        rf, base = (cf, np.uint64(c) * d) if tail else (hf, np.uint64(c) * d)
        for j in range(d):
            rf[base + j] = row[j]
    else:
        _store_row(row, v, d, tf, fold)


@numba.njit(cache=True, inline="always")
def _store_row(row, v, d, tf, fold):
    """tf (store, flat)[v] <- row (divided by v's in-degree for mean; rounded for bf16
    rows). tf is taken once per chunk: a view per row updates the array's shared
    reference count atomically, which serializes the threads."""
    base = np.uint64(v) * d
    if fold.mean and fold.deg[v] > 0:
        inv = 1.0 / fold.deg[v]
        for j in range(d):
            put(tf, base + j, row[j] * inv)
    else:
        for j in range(d):
            put(tf, base + j, row[j])


# The hot loops use flat arrays and unsigned offsets: a signed 2-D index makes numba test
# for negative (wraparound) indices on every access, and taking row views (src[u]) makes
# it update a shared reference count atomically, which serializes the threads. Four
# edges are summed per update of the output row, to shorten the chain of dependent adds.
# The weighted loop is a separate kernel: a single kernel with a has_w flag measured
# 0-5% slower on unweighted sums (round-robin, 8M-edge R-MAT, D = 16 and 128).
@numba.njit(cache=True, parallel=True, fastmath=True)
def _accumulate(part_ptr, part_node, cuts, indices, src, out, carry, head, fold):
    d = np.uint64(carry.shape[1])
    sf, of, cf, hf, tf = src.ravel(), out.ravel(), carry.ravel(), head.ravel(), fold.store.ravel()
    last = indices.size - PREFETCH - 4
    for c in numba.prange(cuts.size - 1):
        c0, c1, straddle, row = _chunk(part_node, cuts, c, carry, fold)
        for k in range(c0, c1):
            tail = straddle and part_node[k] == part_node[c0]
            if fold.once:  # (dst, base) chosen here: returned by a helper, they
                dst, base = row, np.uint64(0)  # measured 13% slower at D = 16
                _open_row(part_node, k, c0, tail, row, sf, d, fold)
            elif tail:
                dst, base = cf, np.uint64(c) * d
            else:
                dst, base = of, np.uint64(part_node[k]) * d
            e, e1 = part_ptr[k], part_ptr[k + 1]
            while e + 4 <= e1:
                if e < last:
                    for i in range(4):
                        _prefetch(sf, np.uint64(indices[e + PREFETCH + i]) * d)
                b0 = np.uint64(indices[e]) * d
                b1 = np.uint64(indices[e + 1]) * d
                b2 = np.uint64(indices[e + 2]) * d
                b3 = np.uint64(indices[e + 3]) * d
                for j in range(d):
                    dst[base + j] += (load(sf, b0 + j) + load(sf, b1 + j)) + (
                        load(sf, b2 + j) + load(sf, b3 + j)
                    )
                e += 4
            while e < e1:
                b0 = np.uint64(indices[e]) * d
                for j in range(d):
                    dst[base + j] += load(sf, b0 + j)
                e += 1
            _end_node(part_node, k, c, c1, tail, row, cf, hf, tf, d, fold)


@numba.njit(cache=True, parallel=True, fastmath=True)
def _accumulate_w(part_ptr, part_node, cuts, indices, weights, src, out, carry, head, fold):
    d = np.uint64(carry.shape[1])
    sf, of, cf, hf, tf = src.ravel(), out.ravel(), carry.ravel(), head.ravel(), fold.store.ravel()
    last = indices.size - PREFETCH - 4
    for c in numba.prange(cuts.size - 1):
        c0, c1, straddle, row = _chunk(part_node, cuts, c, carry, fold)
        for k in range(c0, c1):
            tail = straddle and part_node[k] == part_node[c0]
            if fold.once:  # (dst, base) chosen here: returned by a helper, they
                dst, base = row, np.uint64(0)  # measured 13% slower at D = 16
                _open_row(part_node, k, c0, tail, row, sf, d, fold)
            elif tail:
                dst, base = cf, np.uint64(c) * d
            else:
                dst, base = of, np.uint64(part_node[k]) * d
            e, e1 = part_ptr[k], part_ptr[k + 1]
            while e + 4 <= e1:
                if e < last:
                    for i in range(4):
                        _prefetch(sf, np.uint64(indices[e + PREFETCH + i]) * d)
                b0 = np.uint64(indices[e]) * d
                b1 = np.uint64(indices[e + 1]) * d
                b2 = np.uint64(indices[e + 2]) * d
                b3 = np.uint64(indices[e + 3]) * d
                w0, w1, w2, w3 = weights[e], weights[e + 1], weights[e + 2], weights[e + 3]
                for j in range(d):
                    dst[base + j] += (w0 * load(sf, b0 + j) + w1 * load(sf, b1 + j)) + (
                        w2 * load(sf, b2 + j) + w3 * load(sf, b3 + j)
                    )
                e += 4
            while e < e1:
                b0 = np.uint64(indices[e]) * d
                w0 = weights[e]
                for j in range(d):
                    dst[base + j] += w0 * load(sf, b0 + j)
                e += 1
            _end_node(part_node, k, c, c1, tail, row, cf, hf, tf, d, fold)


@numba.njit(cache=True, parallel=True, fastmath=True)
def _accumulate_heads(part_ptr, part_node, cuts, indices, weights, src, out, carry, head, fold):
    d = np.uint64(carry.shape[1])
    nh = np.uint64(weights.shape[1])
    c = d // nh
    sf, of, cf, hf, wf = src.ravel(), out.ravel(), carry.ravel(), head.ravel(), weights.ravel()
    tf = fold.store.ravel()
    last = indices.size - PREFETCH - 2
    for ch in numba.prange(cuts.size - 1):
        c0, c1, straddle, row = _chunk(part_node, cuts, ch, carry, fold)
        for k in range(c0, c1):
            tail = straddle and part_node[k] == part_node[c0]
            if fold.once:  # (dst, base) chosen here: returned by a helper, they
                dst, base = row, np.uint64(0)  # measured 13% slower at D = 16
                _open_row(part_node, k, c0, tail, row, sf, d, fold)
            elif tail:
                dst, base = cf, np.uint64(ch) * d
            else:
                dst, base = of, np.uint64(part_node[k]) * d
            e, e1 = part_ptr[k], part_ptr[k + 1]
            while e + 2 <= e1:
                if e < last:
                    _prefetch(sf, np.uint64(indices[e + PREFETCH]) * d)
                    _prefetch(sf, np.uint64(indices[e + PREFETCH + 1]) * d)
                b0 = np.uint64(indices[e]) * d
                b1 = np.uint64(indices[e + 1]) * d
                w0, w1 = np.uint64(e) * nh, np.uint64(e + 1) * nh
                for h in range(nh):
                    x0, x1 = wf[w0 + h], wf[w1 + h]
                    for j in range(h * c, h * c + c):
                        dst[base + j] += x0 * load(sf, b0 + j) + x1 * load(sf, b1 + j)
                e += 2
            while e < e1:
                b0 = np.uint64(indices[e]) * d
                w0 = np.uint64(e) * nh
                for h in range(nh):
                    x0 = wf[w0 + h]
                    for j in range(h * c, h * c + c):
                        dst[base + j] += x0 * load(sf, b0 + j)
                e += 1
            _end_node(part_node, k, ch, c1, tail, row, cf, hf, tf, d, fold)


@numba.njit(cache=True)
def _merge_carries(part_node, cuts, out, carry, head, fold):
    """Each chunk's tail row (carry[c]) to its node: added to out's row; folding, summed
    after the head row of the chunk where the node began, then stored (same order)."""
    d = carry.shape[1]
    if not fold.once:
        for c in range(1, cuts.size - 1):
            c0 = cuts[c]
            if c0 < cuts[c + 1] and part_node[c0] == part_node[c0 - 1]:
                v = part_node[c0]
                for j in range(d):
                    out[v, j] += carry[c, j]
        return
    row = np.empty(d, carry.dtype)
    for c in range(cuts.size - 1):
        c0, c1 = cuts[c], cuts[c + 1]
        if c0 == c1 or c1 >= part_node.size or part_node[c1] != part_node[c1 - 1]:
            continue  # empty, or its last node ends in it
        v = part_node[c1 - 1]
        if c > 0 and part_node[c0] == v and part_node[c0 - 1] == v:
            continue  # the whole chunk is a tail of v: its head is in an earlier chunk
        row[:] = head[c]
        for c2 in range(c + 1, cuts.size - 1):
            a0 = cuts[c2]
            if a0 == cuts[c2 + 1]:
                continue
            if part_node[a0] != v:
                break
            for j in range(d):
                row[j] += carry[c2, j]
        _store_row(row, v, np.uint64(d), fold.store.ravel(), fold)


@numba.njit(cache=True, parallel=True)
def _fill_isolated(x, fold):
    """Folding, the rows of nodes with no in-edge: (1+eps)·x[v] for GIN, else 0."""
    store, deg = fold.store, fold.deg
    d = np.uint64(store.shape[1])
    xf, tf = x.ravel(), store.ravel()
    for v in numba.prange(store.shape[0]):
        if deg[v] == 0:
            b = np.uint64(v) * d
            for j in range(d):
                put(tf, b + j, fold.init * load(xf, b + j) if fold.from_x else 0.0)


@numba.njit(cache=True, parallel=True)
def _zero(out):
    for i in numba.prange(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = 0


@numba.njit(cache=True, parallel=True)
def _scale_rows(x, out, s):
    for i in numba.prange(out.size):
        out[i] = s * load(x, i)


@numba.njit(cache=True, parallel=True)
def _divide_rows(out, deg):
    for i in numba.prange(out.shape[0]):
        if deg[i] > 0:
            inv = 1.0 / deg[i]
            for j in range(out.shape[1]):
                out[i, j] *= inv


def gather_rows(x: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """out[i] = x[rows[i]]: x [n, D], rows int [m], out [m, D] (C-contiguous), packing the
    rows peers need into one send buffer."""
    check.same_width(x, out, "gather_rows", "x")
    check.need(
        out.shape[0] >= rows.size,
        "gather_rows",
        lambda: f"out has {out.shape[0]} rows for {rows.size}",
    )
    if rows.size and x.shape[1]:
        _gather_rows(bits(x), rows, bits(out))


@numba.njit(cache=True, parallel=True)
def _gather_rows(x, rows, out):
    for i in numba.prange(rows.size):
        out[i, :] = x[rows[i], :]
