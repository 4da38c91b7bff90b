"""Distributed aggregation designs: MGG's pipelined design and the designs it beat.

Every design subclasses mgg.designs.base.Design: set up once per (plan, D), write this
rank's rows into ``design.x``, call ``design(op)``. One registry, by backend:

  cpu      MPI windows, one rank per process: pipelined (MGG), bulk_halo (DGCL-style),
           direct (per-edge gets)
  cuda     NVSHMEM, one PE per process: pipelined (MGG)
  virtual  P virtual PEs in one process on one GPU (x and the output are the whole
           [N, D]): pipelined, direct, dgcl, uvm, uvm_hbm, no_interleave

A new design is one module with a Design subclass and one line in REGISTRY.
"""

from __future__ import annotations

from .base import Design, PlanMismatchError, check_plan
from .bulk_halo import BulkHalo
from .cpu import Pipelined
from .cuda import CudaPipelined
from .direct import Direct
from .virtual import (
    VirtualDGCL,
    VirtualDirect,
    VirtualNoInterleave,
    VirtualPipelined,
    VirtualUVM,
    VirtualUVMHBM,
)

# cupy is imported when a cuda or virtual design is built, not here
REGISTRY: dict[tuple[str, str], type[Design]] = {
    ("cpu", "pipelined"): Pipelined,
    ("cpu", "bulk_halo"): BulkHalo,
    ("cpu", "direct"): Direct,
    ("cuda", "pipelined"): CudaPipelined,
    ("virtual", "pipelined"): VirtualPipelined,
    ("virtual", "direct"): VirtualDirect,
    ("virtual", "dgcl"): VirtualDGCL,
    ("virtual", "uvm"): VirtualUVM,
    ("virtual", "uvm_hbm"): VirtualUVMHBM,
    ("virtual", "no_interleave"): VirtualNoInterleave,
}


def design_names(backend: str) -> list[str]:
    """The designs of ``backend`` ('cpu', 'cuda' or 'virtual'), MGG's first."""
    names = [n for b, n in REGISTRY if b == backend]
    if not names:
        backends = sorted({b for b, _ in REGISTRY})
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(backends)}")
    return names


def get_design(backend: str, name: str) -> type[Design]:
    """The Design class ``name`` of ``backend``."""
    names = design_names(backend)
    if name not in names:
        raise ValueError(
            f"unknown design {name!r} for the {backend} backend; choose one of {', '.join(names)}"
        )
    return REGISTRY[backend, name]


__all__ = [
    "Design",
    "PlanMismatchError",
    "REGISTRY",
    "check_plan",
    "design_names",
    "get_design",
]
