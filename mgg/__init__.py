"""mgg: full-graph GNN training and inference across many devices with fine-grained
communication-computation pipelining (MGG, OSDI'23)."""

import ctypes
import os
import sys


def _one_openmp_runtime() -> None:
    """Give numba and torch one OpenMP runtime, hence one thread pool.

    numba's OpenMP layer links the system's libgomp by its file name, torch its own copy
    by soname: imported in that order they load two runtimes, two pools of threads on the
    same cores. Loading numba's first (before torch) lets torch resolve to it. If torch
    came first, the two pools stay; their idle threads then must not spin (they starved
    each other's work: 7x on a GIN epoch, docs/runtime.md), so GOMP_SPINCOUNT=0.
    An explicit setting of the user's wins either way."""
    layer = os.environ.get("NUMBA_THREADING_LAYER", "default")
    if "torch" not in sys.modules and layer in ("default", "safe", "forksafe", "omp"):
        try:
            ctypes.CDLL("libgomp.so.1.0.0")  # the name numba's omppool asks the loader for
            return
        except OSError:  # no system libgomp: numba runs its workqueue
            pass
    os.environ.setdefault("GOMP_SPINCOUNT", "0")


_one_openmp_runtime()


def _keep_freed_memory(limit: int = 1 << 30) -> None:
    """Let glibc reuse freed blocks below ``limit`` bytes instead of returning them to the
    kernel. A training step frees and reallocates the same large arrays (dropout masks,
    activations, gradients); served by fresh mmaps, every step page-faults them in
    again: 2.5 ms of a 7-ms dropout of 42 MB. The user's MALLOC_* settings win."""
    if sys.platform != "linux" or any(k.startswith("MALLOC_") for k in os.environ):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, limit)
    libc.mallopt(m_trim_threshold, limit)


_keep_freed_memory()

__version__ = "0.1.0"
