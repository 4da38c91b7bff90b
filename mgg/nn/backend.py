"""Where arrays live: numpy (and scipy.sparse) on the CPU, cupy (and cupyx.scipy.sparse)
on the GPU. Layers use numpy calls, which dispatch to cupy for cupy arrays; only the
few custom kernels and host transfers need to know."""

from __future__ import annotations

import scipy.sparse as sp


def on_gpu(a) -> bool:
    return type(a).__module__.split(".")[0] in ("cupy", "cupyx")


def is_sparse(a) -> bool:
    if sp.issparse(a):
        return True
    return on_gpu(a) and type(a).__module__.startswith("cupyx.scipy.sparse")


def to_host(a):
    """A numpy (or scipy.sparse) copy of a device array; host arrays pass through."""
    if not on_gpu(a):
        return a
    return a.get()


def to_device(a):
    """The cupy (or cupyx sparse) version of a host array."""
    import cupy

    if sp.issparse(a):
        import cupyx.scipy.sparse as csp

        return csp.csr_matrix(sp.csr_matrix(a))
    return cupy.asarray(a)


def assign(dst, src) -> None:
    """dst[...] = src, copying a host array up when dst lives on the GPU."""
    dst[...] = to_device(src) if on_gpu(dst) and not on_gpu(src) else src
