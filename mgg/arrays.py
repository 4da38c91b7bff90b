"""Where an array lives and what it is: numpy (and scipy.sparse) on the host, cupy (and
cupyx.scipy.sparse) on the GPU. cupy is imported only once one of its arrays is seen."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def on_gpu(a) -> bool:
    return type(a).__module__.split(".")[0] in ("cupy", "cupyx")


def is_sparse(a) -> bool:
    """Whether a is a sparse matrix: scipy.sparse, or cupyx.scipy.sparse on the GPU."""
    return sp.issparse(a) or type(a).__module__.startswith("cupyx.scipy.sparse")


def to_host(a):
    """A numpy (or scipy.sparse) copy of a device array; host arrays pass through."""
    return a.get() if on_gpu(a) else a


def array_module(a):
    """numpy, or cupy for a device array."""
    if not on_gpu(a):
        return np
    import cupy

    return cupy


def held(cache: dict, key, xp, build) -> tuple:
    """build()'s host arrays (a tuple) on xp's device (numpy: as they are), built and
    uploaded on the first call, then kept in ``cache``: no upload per call."""
    key = (key, xp.__name__)
    if key not in cache:
        cache[key] = tuple(xp.asarray(a) for a in build())
    return cache[key]
