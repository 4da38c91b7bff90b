"""What a rank has, and whether one allocation fits in it: the machine's facts.

``available()``: min(MemAvailable, the cgroup's limit minus its usage) divided by the
ranks on this node (``MGG_LOCAL_SIZE``, set by mggrun), or ``MGG_MEMORY_LIMIT`` (bytes per
rank: ``2G``, ``512M``, ``1.5GiB``) when set. ``require(nbytes, what, source)`` raises
ResourceError naming the input and the numbers when an allocation the input declares
cannot fit. A plan fits only within a budget's ``usable`` part: all but HEADROOM.
What a job will hold is the footprint model's (mgg.footprint), above the layers it counts.

Imports nothing of mgg but its errors, so that every layer may ask it.
"""

from __future__ import annotations

import os
import re
from fractions import Fraction

from .errors import InputError, ResourceError

__all__ = [
    "HEADROOM",
    "LIMIT_ENV",
    "available",
    "available_bytes",
    "budget_for",
    "csr_bytes",
    "format_bytes",
    "held_bytes",
    "parse_size",
    "peak_rss_mb",
    "require",
    "usable",
    "usable_words",
]

LIMIT_ENV = "MGG_MEMORY_LIMIT"
LOCAL_SIZE_ENV = "MGG_LOCAL_SIZE"
HINT = (
    "check the sizes the input declares; else give each rank more memory (fewer ranks per "
    f"node, a sharded dataset: mgg partition --out), or set {LIMIT_ENV} to override"
)
# The share of a rank's budget (host or GPU) no plan may fill: what no estimate counts
# (the allocator's fragmentation, the CUDA context's growth, NCCL's and NVSHMEM's heaps)
# takes it, so a rank planned at 99% of its memory runs out of it (memory.usable).
HEADROOM = 0.10
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of ``'2G'``, ``'512M'``, ``'1.5GiB'``, ``'4096'`` (binary units)."""
    m = _SIZE.match(str(text))
    if m is None or (m.group(3).lower() == "i"):
        raise InputError(
            f"{LIMIT_ENV}={text!r}: expected a size like 2G, 512M, 1.5GiB or a byte count"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: float) -> str:
    """``7.3 TiB``, ``11.2 GiB``, ``512 B``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _proc_bytes(path: str, key: str) -> int | None:
    """A ``Key:  N kB`` line of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB: VmHWM (ru_maxrss would also count what
    the parent held when it forked this process)."""
    peak = _proc_bytes("/proc/self/status", "VmHWM")
    if peak is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return peak / 2**20


def reset_peak_rss() -> bool:
    """Start this process's VmHWM again from its RSS now (Linux's clear_refs 5), so
    peak_rss_mb measures a phase; whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def pss_mb() -> float | None:
    """This process's proportional set size now, in MB: its private pages plus its share
    of pages it maps with others (the shared-memory windows counted once across ranks);
    None where /proc/self/smaps_rollup is absent."""
    pss = _proc_bytes("/proc/self/smaps_rollup", "Pss")
    return None if pss is None else pss / 2**20


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_free() -> int | None:
    """The cgroup's limit minus its usage (v2, else v1); None without a limit."""
    paths = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrl, rel = line.rstrip("\n").split(":", 2)
                if ctrl == "":
                    paths.append(("/sys/fs/cgroup" + rel, "memory.max", "memory.current"))
                elif "memory" in ctrl.split(","):
                    base = "/sys/fs/cgroup/memory"
                    paths.append((base + rel, "memory.limit_in_bytes", "memory.usage_in_bytes"))
                    paths.append((base, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    except (OSError, ValueError):
        return None
    paths.append(("/sys/fs/cgroup", "memory.max", "memory.current"))
    for base, lim, use in paths:
        limit = _read_int(os.path.join(base, lim))
        if limit is not None and limit < 2**60:  # v1 says "no limit" with a huge number
            return max(0, limit - (_read_int(os.path.join(base, use)) or 0))
    return None


def available(ranks: int | None = None) -> tuple[int, str]:
    """(bytes this rank may still allocate, how that was found, in words); ``ranks``: the
    ranks on this node (default MGG_LOCAL_SIZE, set by mggrun)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if text:
        return parse_size(text), f"{LIMIT_ENV}={text}"
    free, how = _proc_bytes("/proc/meminfo", "MemAvailable"), "MemAvailable"
    cg = _cgroup_free()
    if cg is not None and (free is None or cg < free):
        free, how = cg, "the cgroup's limit minus usage"
    if free is None:
        return 2**62, "no /proc/meminfo"
    try:
        ranks = max(1, int(ranks or os.environ.get(LOCAL_SIZE_ENV, "1")))
    except ValueError:
        ranks = 1
    if ranks > 1:
        return free // ranks, f"{how} / {ranks} ranks on this node"
    return free, how


def available_bytes() -> int:
    """What this rank may allocate now, in bytes (see :func:`available`)."""
    return available()[0]


def _keep() -> Fraction:
    """The share of a budget a plan may fill (1 - HEADROOM, as an exact fraction)."""
    return 1 - Fraction(HEADROOM).limit_denominator(10**6)


def usable(budget: int) -> int:
    """The bytes of ``budget`` a plan may fill: all but its HEADROOM (rounded down)."""
    keep = _keep()
    return int(budget) * keep.numerator // keep.denominator


def budget_for(nbytes: int) -> int:
    """The smallest budget whose :func:`usable` part holds ``nbytes``."""
    keep = _keep()
    return -(-int(nbytes) * keep.denominator // keep.numerator)


def usable_words(budget: int, how: str) -> str:
    """``36.0 GiB usable: 90% of the 40.0 GiB available (how)``: what a plan may fill of
    ``budget``."""
    return (
        f"{format_bytes(usable(budget))} usable: {float(_keep()):.0%} of the "
        f"{format_bytes(budget)} available ({how})"
    )


def require(nbytes: float, what: str, source, hint: str = HINT) -> None:
    """Raise ResourceError ``SOURCE: WHAT needs X but this rank has Y available (how);
    hint`` when ``nbytes`` exceed :func:`available_bytes`. No HEADROOM here: it refuses one
    allocation an input declares (a header's sizes, a spec's counts) that cannot succeed
    now, before it is tried; whether a job fits, headroom kept, is the estimate's judgement
    (:func:`check_estimate`, :func:`plan`), which counts that allocation with the rest."""
    have, how = available()
    if nbytes > have:
        raise ResourceError(
            f"{source}: {what} needs {format_bytes(nbytes)} but this rank has "
            f"{format_bytes(have)} available ({how}); {hint}"
        )


def csr_bytes(num_nodes: int, num_edges: int, weighted: bool = False, build: bool = True) -> int:
    """Bytes of a CSR graph of N nodes and E entries (indptr int64 [N+1], indices int32 or
    int64 [E], float32 weights [E]) and, with ``build``, of building it from edge arrays
    (src, dst and the sort: about 24 bytes per edge more)."""
    n, e = int(num_nodes), int(num_edges)
    idx = 4 if n < 2**31 else 8
    total = 8 * (n + 1) + e * (idx + (4 if weighted else 0))
    return total + (24 * e + 8 * n if build else 0)


def held_bytes() -> int:
    """What this process holds now (counted against a budget without MGG_MEMORY_LIMIT)."""
    if os.environ.get(LIMIT_ENV, "").strip():
        return 0
    return _proc_bytes("/proc/self/status", "VmRSS") or 0
