"""bfloat16 in numba, which has no bf16 type: a bf16 array reaches a kernel as its 16-bit
words (uint16, mgg.precision.bits), is widened on load to float32 (the word is the top
half of the float32) and rounded to nearest even once on store.

``load(a, i)`` reads element i of a flat array as float32 whether a is float32 (or
float64) or bf16 words, and ``put(a, i, v)`` writes it back (rounded for bf16), so one
kernel serves every dtype; ``store_rows`` rounds a float32 accumulator into bf16 rows.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from ..precision import BF16, accumulator, bits, row_dtype


@intrinsic
def _widen(typingctx, word):
    """float32 whose top 16 bits are ``word`` (uint16) and low 16 bits zero."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        wide = builder.shl(builder.zext(args[0], i32), i32(16))
        return builder.bitcast(wide, ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def _float_bits(typingctx, value):
    """The 32 bits of a float32, as uint32."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def load(a, i):
    """Element i of a flat array, widened to float32 when a holds bf16 words."""
    return a[i]


@overload(load)
def _load(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: _widen(a[i])
    return lambda a, i: a[i]


def put(a, i, v):
    """a[i] = v (float), rounded to a bf16 word (nearest even) when a holds bf16 words."""
    a[i] = v


@overload(put)
def _put(a, i, v):
    if a.dtype == types.uint16:

        def impl(a, i, v):
            a[i] = to_bf16(v)

        return impl

    def impl(a, i, v):
        a[i] = v

    return impl


@numba.njit(cache=True, inline="always")
def to_bf16(x):
    """The bf16 word nearest to float32 x (ties to even); NaN stays a (quiet) NaN, inf
    stays inf, and finite values past bf16's largest become inf, as IEEE rounding does."""
    b = _float_bits(np.float32(x))
    if (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((b >> np.uint32(16)) | np.uint32(0x40))
    b += np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))
    return np.uint16(b >> np.uint32(16))


def sums_for(out, dtype, xp=np):
    """Where rows of ``dtype`` are summed before they land in out [n, D]: out itself, or,
    for bf16, a float32 array of its shape (module ``xp``) that store_rows rounds."""
    acc = accumulator(dtype)
    return out if acc == row_dtype(dtype) else xp.empty(out.shape, acc)


def store_rows(acc: np.ndarray, out: np.ndarray) -> None:
    """out [n, D] (bf16) <- acc [n, D] (float32), rounded once to nearest even; a no-op
    when out is acc (rows summed in their own dtype)."""
    if out is acc:
        return
    if out.shape != acc.shape or out.dtype != BF16:
        raise ValueError(f"out is {out.dtype} {out.shape}: the sums {acc.shape} round to bf16")
    _store_rows(np.ascontiguousarray(acc, np.float32), bits(out))


@numba.njit(cache=True, parallel=True)
def _store_rows(acc, out):
    for i in numba.prange(acc.shape[0]):
        for j in range(acc.shape[1]):
            out[i, j] = to_bf16(acc[i, j])
