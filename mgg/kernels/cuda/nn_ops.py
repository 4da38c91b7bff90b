"""Launchers of nn.cu: the GPU twins of mgg/kernels/cpu_nn.py (same signatures)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

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


def dropout_dense(x, key: np.uint64, lb: int, threshold: np.uint32, scale):
    """x [n, d] float32 cupy -> the dropped-out copy (mask by the hash of (key, row, col))."""
    import cupy

    x = cupy.ascontiguousarray(x, cupy.float32)
    out = cupy.empty_like(x)
    n, d = x.shape
    _fn("mgg_dropout_dense")(
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
        ),
    )
    return out


def dropout_csr(x, key: np.uint64, lb: int, threshold: np.uint32, scale):
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
        ),
    )
    return y


def softmax_ce(logits, y, mask):
    """(grad [n, C] unscaled, stats float64 [3] on the host: summed -log p, masked rows,
    right predictions) — as mgg.nn.loss._softmax_ce."""
    import cupy

    logits = cupy.ascontiguousarray(logits, cupy.float32)
    n, c = logits.shape
    grad = cupy.empty_like(logits)
    stats = cupy.zeros(3, cupy.float64)
    _fn("mgg_softmax_ce")(
        (_blocks(n),),
        (THREADS,),
        (
            logits,
            cupy.asarray(y, cupy.int64),
            cupy.asarray(mask, cupy.bool_),
            grad,
            stats,
            np.int64(n),
            np.int32(c),
        ),
    )
    return grad, cupy.asnumpy(stats)
