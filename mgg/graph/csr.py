"""Edge arrays into CSR, in parallel: the one builder of the generators and papers100m.

A radix partition: each block of edges counted and scattered into buckets of rows, then
each bucket's entries into its rows (its row counters in cache), each step parallel, no
thread reading another's edges, no atomics (a locked add on a row counter out of cache
stalls its thread); then each row sorted and its duplicates merged, rows in chunks of
about equal entries. The result depends on the edges alone, not on the threads.
``merge_rows`` adds a second CSR's rows to a first's (papers100m's later rounds).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from .core import index_dtype

__all__ = ["build_csr", "dynamic", "merge_rows", "row_chunks"]

_IDX_MASK = np.int64(0xFFFFFFFF)
_CHUNKS_PER_THREAD = 8
_BUCKETS_MAX = 1024  # buckets of rows of the edges' radix partition
_INSERTION_MAX = 32  # rows up to this long: insertion sort; longer ones radix sort


def dynamic(fn):
    """fn with the parallel loops it runs scheduled an iteration at a time (numba's
    parallel_chunksize 1), not split in equal shares up front: their iterations are
    blocks of work, and a slow thread (a busy core, skewed rows) takes fewer of them."""

    @functools.wraps(fn)
    def run(*args, **kw):
        with numba.parallel_chunksize(1):
            return fn(*args, **kw)

    return run


def row_chunks(indptr: np.ndarray, parts: int | None = None) -> np.ndarray:
    """int64 [K+1]: row bounds of K chunks of about equal entries (each at least one row
    wide), K = ``parts`` or _CHUNKS_PER_THREAD per numba thread."""
    n = indptr.size - 1
    k = max(1, min(parts or _CHUNKS_PER_THREAD * numba.get_num_threads(), n))
    targets = np.linspace(0, int(indptr[-1]), k + 1)
    bounds = np.searchsorted(indptr, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, n
    return np.unique(np.maximum.accumulate(bounds))


def _buckets(n: int) -> int:
    """The shift that groups rows into buckets of 2**shift rows, at most _BUCKETS_MAX of
    them (a bucket's row counters stay in a core's cache while its rows are filled)."""
    shift = 0
    while (n - 1) >> shift >= _BUCKETS_MAX:
        shift += 1
    return shift


@numba.njit(parallel=True, cache=True)
def _bucket_counts(src, dst, symmetric, shift, blocks, counts):
    """counts [B, K]: the entries of block b of edges (loops dropped) that fall in bucket k."""
    for b in numba.prange(blocks.size - 1):
        for i in range(blocks[b], blocks[b + 1]):
            u, v = src[i], dst[i]
            if u != v:
                counts[b, v >> shift] += 1
                if symmetric:
                    counts[b, u >> shift] += 1


@numba.njit(parallel=True, cache=True)
def _bucket_fill(src, dst, symmetric, keyed, shift, blocks, pos, rows, vals):
    """Each entry (row, value) to its bucket's next slot (pos [B, K]: block b's next slot
    in bucket k); the value u, or keyed, (u << 32) | i, so a sort puts the stream's first
    first. Buckets in order, blocks in order within one: the stream's order kept."""
    for b in numba.prange(blocks.size - 1):
        at = pos[b]
        for i in range(blocks[b], blocks[b + 1]):
            u, v = src[i], dst[i]
            if u == v:
                continue
            k = at[v >> shift]
            rows[k] = v
            vals[k] = (np.int64(u) << 32) | i if keyed else u
            at[v >> shift] = k + 1
            if symmetric:
                k = at[u >> shift]
                rows[k] = u
                vals[k] = (np.int64(v) << 32) | i if keyed else v
                at[u >> shift] = k + 1


@numba.njit(parallel=True, cache=True)
def _rows_of_buckets(rows, vals, shift, starts, indptr, out):
    """Each bucket's entries into its rows (a counting sort within the bucket, whose rows'
    counters stay in cache): indptr [n+1] and out, the values row by row."""
    n = indptr.size - 1
    for k in numba.prange(starts.size - 1):
        lo, hi = k << shift, min((k + 1) << shift, n)
        if lo >= hi:
            continue
        a, b = starts[k], starts[k + 1]
        count = np.zeros(hi - lo, np.int64)
        for i in range(a, b):
            count[rows[i] - lo] += 1
        at = a
        for r in range(hi - lo):
            indptr[lo + r] = at
            c = count[r]
            count[r] = at
            at += c
        for i in range(a, b):
            r = rows[i] - lo
            out[count[r]] = vals[i]
            count[r] += 1
    indptr[n] = starts[starts.size - 1]


@numba.njit(cache=True)
def _insertion_sort(seg):
    for i in range(1, seg.size):
        x = seg[i]
        j = i - 1
        while j >= 0 and seg[j] > x:
            seg[j + 1] = seg[j]
            j -= 1
        seg[j + 1] = x


@numba.njit(cache=True)
def _radix_sort(seg, tmp, count, passes):
    """seg sorted (non-negative ints below 2 ** (8 passes)): LSD radix, a byte a pass,
    through tmp (at least as long); count int64 [257] is scratch."""
    a, b = seg, tmp[: seg.size]
    for p in range(passes):
        shift = 8 * p
        count[:] = 0
        for i in range(a.size):
            count[((a[i] >> shift) & 255) + 1] += 1
        for d in range(256):
            count[d + 1] += count[d]
        for i in range(a.size):
            x = a[i]
            d = (x >> shift) & 255
            b[count[d]] = x
            count[d] += 1
        a, b = b, a
    if passes % 2:
        seg[:] = a


@numba.njit(parallel=True, cache=True)
def _sort_dedup(indptr, vals, shift, passes, chunks, kept):
    """Sort each row, its distinct values (by value >> shift) first; kept[v + 1] = how
    many. passes > 0: values below 2 ** (8 passes), rows longer than _INSERTION_MAX
    radix sorted; else numba's sort."""
    for c in numba.prange(chunks.size - 1):
        widest = 0
        for v in range(chunks[c], chunks[c + 1]):
            widest = max(widest, indptr[v + 1] - indptr[v])
        tmp = np.empty(widest if passes else 0, vals.dtype)
        count = np.empty(257, np.int64)
        for v in range(chunks[c], chunks[c + 1]):
            a, b = indptr[v], indptr[v + 1]
            if b == a:
                kept[v + 1] = 0
                continue
            seg = vals[a:b]
            if b - a <= _INSERTION_MAX:
                _insertion_sort(seg)
            elif passes:
                _radix_sort(seg, tmp, count, passes)
            else:
                seg.sort()
            w = 1
            last = seg[0] >> shift
            for i in range(1, b - a):
                s = seg[i] >> shift
                if s != last:
                    seg[w] = seg[i]
                    w += 1
                    last = s
            kept[v + 1] = w


@numba.njit(parallel=True, cache=True)
def _count_below(indptr, lens_ptr, vals, limit, chunks, out):
    """out[v + 1] = row v's kept values whose stream index is <= limit."""
    for c in numba.prange(chunks.size - 1):
        for v in range(chunks[c], chunks[c + 1]):
            a = indptr[v]
            k = 0
            for i in range(a, a + lens_ptr[v + 1] - lens_ptr[v]):
                if (vals[i] & _IDX_MASK) <= limit:
                    k += 1
            out[v + 1] = k


@numba.njit(parallel=True, cache=True)
def _compact(indptr, kept_ptr, vals, new_indptr, out, shift, limit, chunks):
    """Each row's first kept_ptr[v+1] - kept_ptr[v] values (>> shift; stream index <=
    limit unless limit < 0) to out[new_indptr[v]:]."""
    for c in numba.prange(chunks.size - 1):
        for v in range(chunks[c], chunks[c + 1]):
            a = indptr[v]
            w = new_indptr[v]
            for i in range(a, a + kept_ptr[v + 1] - kept_ptr[v]):
                if limit < 0 or (vals[i] & _IDX_MASK) <= limit:
                    out[w] = vals[i] >> shift
                    w += 1


@numba.njit(parallel=True, cache=True)
def _stream_indices(indptr, kept_ptr, vals, out, chunks):
    for c in numba.prange(chunks.size - 1):
        for v in range(chunks[c], chunks[c + 1]):
            a = indptr[v]
            w = kept_ptr[v]
            for i in range(a, a + kept_ptr[v + 1] - kept_ptr[v]):
                out[w] = vals[i] & _IDX_MASK
                w += 1


@dynamic
def build_csr_emptying(edges: list, n: int, symmetric: bool, target=None):
    """CSR (indptr int64 [n+1], indices [E]) of the edges ``[src, dst]`` (the list is
    emptied so that the arrays can be freed early), and the distinct entries before
    trimming.

    Self loops are dropped and duplicates merged; ``symmetric`` adds every reverse edge.
    With ``target``, only the shortest prefix of the edge stream that yields ``target``
    distinct entries is kept (when the stream has that many; symmetric entries come in
    pairs).
    """
    keyed = target is not None
    if keyed and (edges[0].size >= 2**31 or n >= 2**31):
        raise ValueError(f"too many edges or nodes to trim ({edges[0].size:,}, {n:,})")
    if keyed and target <= 0:
        edges.clear()
        return np.zeros(n + 1, np.int64), np.empty(0, index_dtype(n)), 0
    indptr, vals = _bucket_sort(edges, n, symmetric, keyed)
    chunks = row_chunks(indptr)
    shift = 32 if keyed else 0
    kept = np.zeros(n + 1, np.int64)
    passes = 0 if keyed else (max(n - 1, 1).bit_length() + 7) // 8
    _sort_dedup(indptr, vals, shift, passes, chunks, kept)
    np.cumsum(kept, out=kept)
    distinct = int(kept[-1])
    limit, new_indptr = -1, kept
    if keyed and distinct > target:
        first = np.empty(distinct, np.int64)
        _stream_indices(indptr, kept, vals, first, chunks)
        first.partition(target - 1)
        limit = int(first[target - 1])
        del first
        new_indptr = np.zeros(n + 1, np.int64)
        _count_below(indptr, kept, vals, limit, chunks, new_indptr)
        np.cumsum(new_indptr, out=new_indptr)
    indices = np.empty(int(new_indptr[-1]), index_dtype(n))
    _compact(indptr, kept, vals, new_indptr, indices, shift, limit, chunks)
    return new_indptr, indices, distinct


def _bucket_sort(edges: list, n: int, symmetric: bool, keyed: bool):
    """(indptr int64 [n+1], values row by row, unsorted) of the edges ``[src, dst]`` (the
    list emptied, the arrays freed once scattered): each block of edges counted and
    scattered into buckets of rows, then each bucket into its rows, all in parallel."""
    src, dst = edges
    edges.clear()
    shift = _buckets(max(n, 1))
    k = ((max(n, 1) - 1) >> shift) + 1
    parts = max(1, min(_CHUNKS_PER_THREAD * numba.get_num_threads(), src.size))
    blocks = np.linspace(0, src.size, parts + 1).astype(np.int64)
    pos = np.zeros((parts, k), np.int64)
    _bucket_counts(src, dst, symmetric, shift, blocks, pos)
    starts = np.zeros(k + 1, np.int64)
    np.cumsum(pos.sum(axis=0), out=starts[1:])
    pos = (starts[:-1] + np.cumsum(pos, axis=0) - pos).astype(np.int64)  # bucket-major
    total = int(starts[-1])
    rows = np.empty(total, index_dtype(n))
    vals = np.empty(total, np.int64 if keyed else index_dtype(n))
    _bucket_fill(src, dst, symmetric, keyed, shift, blocks, pos, rows, vals)
    del pos, src, dst
    indptr = np.empty(n + 1, np.int64)
    out = np.empty_like(vals)
    _rows_of_buckets(rows, vals, shift, starts, indptr, out)
    return indptr, out


def build_csr(src, dst, n: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """(indptr int64 [n+1], indices [E]) of the edges src -> dst [e]: self loops dropped,
    duplicates merged, rows sorted; ``symmetric`` adds every reverse edge."""
    indptr, indices, _ = build_csr_emptying([src, dst], n, symmetric)
    return indptr, indices


@numba.njit(parallel=True, cache=True)
def _merge_count(pa, ia, pb, ib, chunks, out):
    for c in numba.prange(chunks.size - 1):
        for v in range(chunks[c], chunks[c + 1]):
            i, ie, j, je = pa[v], pa[v + 1], pb[v], pb[v + 1]
            k = 0
            while i < ie and j < je:
                x, y = ia[i], ib[j]
                i += x <= y
                j += y <= x
                k += 1
            out[v + 1] = k + (ie - i) + (je - j)


@numba.njit(parallel=True, cache=True)
def _merge_fill(pa, ia, pb, ib, chunks, new_indptr, out):
    for c in numba.prange(chunks.size - 1):
        for v in range(chunks[c], chunks[c + 1]):
            i, ie, j, je = pa[v], pa[v + 1], pb[v], pb[v + 1]
            w = new_indptr[v]
            while i < ie and j < je:
                x, y = ia[i], ib[j]
                out[w] = x if x <= y else y
                i += x <= y
                j += y <= x
                w += 1
            while i < ie:
                out[w] = ia[i]
                i += 1
                w += 1
            while j < je:
                out[w] = ib[j]
                j += 1
                w += 1


@dynamic
def merge_rows(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The CSR (indptr int64 [n+1], indices [E]) whose row v is the union of row v of
    ``a`` and of ``b`` ((indptr, indices) each, rows sorted and without duplicates)."""
    (pa, ia), (pb, ib) = a, b
    n = pa.size - 1
    chunks = row_chunks(pa)
    indptr = np.zeros(n + 1, np.int64)
    _merge_count(pa, ia, pb, ib, chunks, indptr)
    np.cumsum(indptr, out=indptr)
    out = np.empty(int(indptr[-1]), np.result_type(ia.dtype, ib.dtype))
    _merge_fill(pa, ia, pb, ib, chunks, indptr, out)
    return indptr, out
