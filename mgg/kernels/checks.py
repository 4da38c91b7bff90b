"""What every kernel launcher checks before it launches (numba's and CUDA's alike): the
lengths and widths of the arrays a kernel indexes, against each other and the plan, so
that no input reaches an out-of-bounds read. O(1) each: shapes, and on the host the last
entry of an offsets array (never a scan of the edges; a device array's entries are not
read, which would wait for the GPU). The indices inside a plan are checked once, where
the plan is built."""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def need(ok: bool, who: str, what) -> None:
    """InputError '{who}: {what()}' unless ``ok`` (``what`` makes the text only then)."""
    if not ok:
        raise InputError(f"{who}: {what() if callable(what) else what}")


def rows2d(a, who: str, name: str) -> None:
    """``a`` is a 2-D array."""
    need(getattr(a, "ndim", None) == 2, who, lambda: f"{name} must be 2-D, got shape {_shape(a)}")


def ends_at(ptr, size: int, who: str, ptr_name: str, name: str) -> None:
    """The offsets ``ptr`` [k+1] end within ``size`` entries of ``name`` (host arrays
    only: a device array's last entry is not read)."""
    if isinstance(ptr, np.ndarray) and ptr.size:
        last = int(ptr[-1])
        need(
            0 <= last <= size,
            who,
            lambda: f"{ptr_name} ends at {last} but {name} has {size} entries",
        )


def segments(ptr, perm, values, count: int, who: str = "segment_sum") -> None:
    """segment_sum's: ptr [count+1], perm [E] (a permutation of values' rows), values
    [E, H]."""
    rows2d(values, who, "values")
    need(
        ptr.ndim == 1 and ptr.size == count + 1,
        who,
        lambda: f"ptr must be [{count + 1}] for {count} segments, got {_shape(ptr)}",
    )
    need(
        perm.size == values.shape[0],
        who,
        lambda: (
            f"values must be [{perm.size}, H] (one row per entry of perm), got {_shape(values)}"
        ),
    )
    ends_at(ptr, perm.size, who, "ptr", "perm")


def csr_rows(indptr, indices, a, b, heads: int, who: str = "sddmm") -> None:
    """sddmm's: indptr [n+1], indices [E] (rows of b), a [n, H·C], b [R, H·C]."""
    rows2d(a, who, "a")
    rows2d(b, who, "b")
    n = indptr.size - 1
    need(a.shape[0] >= n, who, lambda: f"a must have the CSR's {n} rows, got {_shape(a)}")
    need(b.shape[1] == a.shape[1], who, lambda: f"a is {a.shape[1]} wide but b is {b.shape[1]}")
    need(heads >= 1, who, lambda: f"heads must be >= 1, got {heads}")
    ends_at(indptr, indices.size, who, "indptr", "indices")


def scores(lp, rp, src, a_all, a_dst, who: str) -> None:
    """The attention kernels': lp, rp [n+1], src [E] (E = El + Er), a_all [S, H],
    a_dst [n, H]."""
    rows2d(a_all, who, "a_all")
    rows2d(a_dst, who, "a_dst")
    n, heads = a_dst.shape
    need(
        lp.size == n + 1 and rp.size == n + 1,
        who,
        lambda: (
            f"lp and rp must be [{n + 1}] for a_dst's {n} rows, got {_shape(lp)} and {_shape(rp)}"
        ),
    )
    need(a_all.shape[1] == heads, who, lambda: f"a_all has {a_all.shape[1]} heads, a_dst {heads}")
    if isinstance(lp, np.ndarray) and isinstance(rp, np.ndarray) and n >= 0:
        e = int(lp[n]) + int(rp[n])
        need(
            src.size == e,
            who,
            lambda: f"src must be [{e}] (the edges of lp and rp), got {src.size}",
        )


def per_edge(t, src, heads: int, who: str, name: str) -> None:
    """An attention array [E, H] over src's E edges."""
    need(
        getattr(t, "shape", None) == (src.size, heads),
        who,
        lambda: f"{name} must be [{src.size}, {heads}], got {_shape(t)}",
    )


def partitions(part_ptr, part_node, k0: int, k1: int, indices, weights, who: str) -> None:
    """accumulate's and aggregate_rows': partitions [k0, k1) of part_ptr [K+1] and
    part_node [K], their edges' indices [E] and weights [E(, H)] (or None)."""
    k = part_node.size
    need(0 <= k0 <= k1 <= k, who, lambda: f"partitions [{k0}, {k1}) outside the plan's {k}")
    need(
        part_ptr.size == k + 1,
        who,
        lambda: f"part_ptr must be [{k + 1}] for {k} partitions, got {_shape(part_ptr)}",
    )
    ends_at(part_ptr, indices.size, who, "part_ptr", "indices")
    if weights is not None:
        need(
            weights.ndim in (1, 2) and weights.shape[0] == indices.size,
            who,
            lambda: (
                f"weights must be [{indices.size}] or [{indices.size}, H] (one per edge), "
                f"got {_shape(weights)}"
            ),
        )


def same_width(src, out, who: str, src_name: str = "src", out_name: str = "out") -> None:
    """src and out: 2-D arrays of one width (the kernels stride both by out's)."""
    rows2d(src, who, src_name)
    rows2d(out, who, out_name)
    need(
        src.shape[1] == out.shape[1],
        who,
        lambda: f"{src_name} is {src.shape[1]} wide but {out_name} is {out.shape[1]}",
    )


def _shape(a) -> str:
    shape = getattr(a, "shape", None)
    return str(tuple(shape)) if shape is not None else type(a).__name__
