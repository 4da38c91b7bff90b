"""SplitMix64 hashing for counter-based random streams (the CUDA copy is in kernels/cuda/nn.cu).

A leaf module: numpy and numba only.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["GOLDEN", "mix64", "key64", "keys64"]

# the Weyl increment that spaces counters of a stream apart before mixing
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_KEY0 = 0x243F6A8885A308D3
_M64 = 0xFFFFFFFFFFFFFFFF


@numba.njit(cache=True, inline="always")
def mix64(z):
    """SplitMix64's finalizer: a well-mixed uint64 for any uint64 counter."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def key64(*parts: int) -> np.uint64:
    """A 64-bit key from integers: k = mix64(k ^ part) over the parts, from a fixed start.

    Parts are taken modulo 2**64 (a negative part as its two's complement).
    """
    k = np.uint64(_KEY0)
    for p in parts:
        k = mix64(k ^ np.uint64(int(p) & _M64))
    return np.uint64(k)


def keys64(*parts: int, last: np.ndarray) -> np.ndarray:
    """key64(*parts, k) for every k of ``last`` (uint64 [K]) at once: uint64 [K] (the
    fold's last step, vectorized)."""
    return mix64(key64(*parts) ^ np.asarray(last, np.uint64))
