"""Launchers of nn.cu: the GPU twins of mgg/kernels/cpu_nn.py (same signatures).

Rows (dropout_dense's x, sddmm's a and b, gather_rows') may be bfloat16: uint16 cupy
arrays of its bits (or ml_dtypes' bfloat16 on the host), computed in float32 and rounded
once; everything else is float32.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ...precision import bits, holds_bf16
from .. import checks as check

SOURCE = Path(__file__).with_name("nn.cu")
THREADS = 256


@functools.cache
def _module(device_id: int):
    import cupy

    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",))


def _fn(name: str):
    import cupy

    return _module(cupy.cuda.Device().id).get_function(name)


def _blocks(n: int) -> int:
    return max(1, min(65535, -(-n // THREADS)))


def _warp_blocks(rows: int) -> int:
    """Blocks of THREADS for one warp per row (a grid-stride loop covers the rest)."""
    return max(1, min(1 << 20, -(-rows * 32 // THREADS)))


def _dev(a, dtype):
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(a, dtype))


def _rows(a, bf16: bool):
    """Rows on the device, C-contiguous: uint16 bf16 bits, or float32."""
    if bf16:
        return _dev(bits(a), np.uint16)
    return _dev(a, np.float32)


def _key_at(key_at):
    """A kernel's key_at: a one-element uint64 (or int64) device array the kernel reads
    its key from (a captured step's slot), or a null pointer: the key by value."""
    return np.uint64(0) if key_at is None else key_at


def dropout_dense(x, key: np.uint64, lb: int, threshold: np.uint32, scale, key_at=None):
    """x [n, d] float32, or bf16 (uint16 bits) cupy -> the dropped-out copy, of x's dtype
    (mask by the hash of (key, row, col), the same for both; bf16: x * scale rounded once).
    ``key_at``: a device slot holding the key, read by the kernel instead of ``key``."""
    import cupy

    check.rows2d(x, "dropout_dense", "x")
    bf16 = holds_bf16(x)
    x = _rows(x, bf16)
    out = cupy.empty_like(x)
    n, d = x.shape
    _fn("mgg_dropout_dense_bf16" if bf16 else "mgg_dropout_dense")(
        (_blocks(n * d),),
        (THREADS,),
        (
            x,
            out,
            np.int64(n),
            np.int64(d),
            np.uint64(key),
            np.int64(lb),
            np.uint32(threshold),
            np.float32(scale),
            _key_at(key_at),
        ),
    )
    return out


def dropout_csr(x, key: np.uint64, lb: int, threshold: np.uint32, scale, key_at=None):
    """A dropped-out copy of a cupyx CSR matrix [n, ncols] (stored entries only)."""
    import cupy

    y = x.copy()
    indptr = y.indptr.astype(cupy.int64)
    _fn("mgg_dropout_csr")(
        (_blocks(y.shape[0]),),
        (THREADS,),
        (
            indptr,
            y.indices.astype(cupy.int32),
            y.data,
            np.int64(y.shape[0]),
            np.int64(y.shape[1]),
            np.uint64(key),
            np.int64(lb),
            np.uint32(threshold),
            np.float32(scale),
            _key_at(key_at),
        ),
    )
    return y


def edge_dropout(
    dst, src, heads: int, num_nodes: int, key, threshold: np.uint32, scale, key_at=None
):
    """float32 [E, heads] cupy: scale where edge e (src[e] -> dst[e], global ids [E])
    survives in head h, 0 where it is dropped; the mask of cpu_nn.edge_dropout, bit for
    bit (keyed by (key, dst, src, h))."""
    import cupy

    dst, src = _dev(dst, cupy.int64), _dev(src, cupy.int64)
    if dst.shape != src.shape or dst.ndim != 1:
        raise ValueError(f"dst {dst.shape} and src {src.shape} must be one [E] each")
    out = cupy.empty((dst.size, heads), cupy.float32)
    if out.size:
        _fn("mgg_edge_dropout")(
            (_blocks(out.size),),
            (THREADS,),
            (
                dst,
                src,
                out,
                np.int64(dst.size),
                np.int32(heads),
                np.int64(num_nodes),
                np.uint64(key),
                np.uint32(threshold),
                np.float32(scale),
                _key_at(key_at),
            ),
        )
    return out


def sddmm(indptr, indices, a, b, heads: int):
    """float32 [E, heads] cupy: out[e, h] = <a[v, h·C:(h+1)·C], b[indices[e], h·C:(h+1)·C]>
    for the edges e of row v of the CSR (indptr [n+1], indices [E]); a [n, H·C],
    b [R, H·C] float32, or both bf16 (summed in float32) — as cpu_nn.sddmm."""
    import cupy

    out = cupy.empty((indices.size, heads), cupy.float32)
    if a.shape[1] % heads:
        raise ValueError(f"{heads} heads do not divide the width {a.shape[1]}")
    if out.size == 0:  # no edge: b is not read (may be None)
        return out
    check.csr_rows(indptr, indices, a, b, heads)
    bf16 = holds_bf16(a)
    if holds_bf16(b) != bf16:
        raise ValueError(f"a holds {a.dtype} rows but b {b.dtype}: give both in one dtype")
    a, b = _rows(a, bf16), _rows(b, bf16)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"a is {a.shape[1]} wide but b is {b.shape[1]}")
    if b.shape[0] > np.iinfo(np.int32).max:
        raise ValueError(f"b has {b.shape[0]} rows, more than int32 indices address")
    _fn("mgg_sddmm_bf16" if bf16 else "mgg_sddmm")(
        (_warp_blocks(indptr.size - 1),),
        (THREADS,),
        (
            _dev(indptr, cupy.int64),
            _dev(indices, cupy.int32),
            a,
            b,
            out,
            np.int64(indptr.size - 1),
            np.int64(indices.size),
            np.int32(heads),
            np.int32(a.shape[1] // heads),
        ),
    )
    return out


def _scores(lp, rp, src, a_all, a_dst) -> tuple:
    """The attention kernels' first arguments: the destinations' CSRs, the sources and
    the per-node scores, on the device in the kernels' types."""
    import cupy

    i64, f32 = cupy.int64, cupy.float32
    return _dev(lp, i64), _dev(rp, i64), _dev(src, i64), _dev(a_all, f32), _dev(a_dst, f32)


def gat_softmax(lp, rp, src, a_all, a_dst, slope: float):
    """float32 [E, H] cupy: as cpu_nn.gat_softmax (one warp per destination)."""
    import cupy

    check.scores(lp, rp, src, a_all, a_dst, "gat_softmax")
    n, heads = a_dst.shape
    alpha = cupy.empty((src.size, heads), cupy.float32)
    if alpha.size and n:
        _fn("mgg_gat_softmax")(
            (_warp_blocks(n),),
            (THREADS,),
            (
                *_scores(lp, rp, src, a_all, a_dst),
                alpha,
                np.int64(n),
                np.int32(heads),
                np.float32(slope),
            ),
        )
    return alpha


def gat_softmax_backward(lp, rp, src, a_all, a_dst, alpha, dalpha, slope: float):
    """(dscore [E, H], da_dst [n, H]) float32 cupy: as cpu_nn.gat_softmax_backward."""
    import cupy

    check.scores(lp, rp, src, a_all, a_dst, "gat_softmax_backward")
    check.per_edge(alpha, src, a_dst.shape[1], "gat_softmax_backward", "alpha")
    check.per_edge(dalpha, src, a_dst.shape[1], "gat_softmax_backward", "dalpha")
    n, heads = a_dst.shape
    dscore = cupy.empty((src.size, heads), cupy.float32)
    da_dst = cupy.zeros((n, heads), cupy.float32)
    if dscore.size and n:
        _fn("mgg_gat_softmax_backward")(
            (_warp_blocks(n),),
            (THREADS,),
            (
                *_scores(lp, rp, src, a_all, a_dst),
                _dev(alpha, cupy.float32),
                _dev(dalpha, cupy.float32),
                dscore,
                da_dst,
                np.int64(n),
                np.int32(heads),
                np.float32(slope),
            ),
        )
    return dscore, da_dst


def segment_sum(ptr, perm, values, segments: int):
    """float32 [segments, H] cupy: as cpu_nn.segment_sum (one warp per segment)."""
    import cupy

    check.segments(ptr, perm, values, segments)
    heads = values.shape[1]
    out = cupy.zeros((segments, heads), cupy.float32)
    if segments and perm.size:
        _fn("mgg_segment_sum")(
            (_warp_blocks(segments),),
            (THREADS,),
            (
                _dev(ptr, cupy.int64),
                _dev(perm, cupy.int64),
                _dev(values, cupy.float32),
                out,
                np.int64(segments),
                np.int32(heads),
            ),
        )
    return out


def gather_rows(x, src, out) -> None:
    """One launch: out[i] = x[src[i]]. x [N, D] and out [H, D] C-contiguous cupy arrays of
    one dtype, float32 or uint16 (bf16 bits), src int64 [H] cupy; 16-byte loads where the
    row's bytes and the pointers allow, else 4-byte (2-byte: odd bf16 rows)."""
    check.same_width(x, out, "gather_rows", "x")
    check.need(
        out.shape[0] >= src.size,
        "gather_rows",
        lambda: f"out has {out.shape[0]} rows for {src.size}",
    )
    h, d = int(src.size), int(x.shape[1])
    if x.dtype != out.dtype or x.dtype.itemsize not in (2, 4):
        raise ValueError(f"gather_rows copies float32 or uint16 rows, not {x.dtype} to {out.dtype}")
    if h == 0:
        return
    row = d * x.dtype.itemsize
    unit = next(u for u in (16, 4, 2) if row % u == 0 and x.data.ptr % u == out.data.ptr % u == 0)
    q = row // unit
    units = h * q
    kernel = {16: "mgg_gather_rows4", 4: "mgg_gather_rows1", 2: "mgg_gather_rows_half"}[unit]
    _fn(kernel)((_blocks(units),), (THREADS,), (x, src, out, np.int64(units), np.int32(q)))
