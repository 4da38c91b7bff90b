"""Process-wide settings that `import mgg` applies once, before torch or numba start work.

Each yields to an explicit setting of the user's (environment variables named below).
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.abc
import importlib.util
import os
import sys
import tempfile
import threading

# what apply() found wrong in the environment, each one line naming the variable: the
# variable is set aside (numba would raise a traceback at import); mgg's commands and
# Backend refuse to run with it (refuse_bad_environment)
ENV_ERRORS: list[str] = []


def apply() -> None:
    check_numba_threads()
    one_openmp_runtime()
    keep_freed_memory()
    try:
        several = local_size() > 1
    except ValueError:  # a launcher variable that is not a count: no lock, no failed import
        several = False
    if several:
        serialize_compiles()


def check_numba_threads() -> None:
    """NUMBA_NUM_THREADS must be a whole number >= 1: numba's import raises a traceback on
    0 and warns at length on anything else. Such a value is set aside and named in
    ENV_ERRORS."""
    value = os.environ.get("NUMBA_NUM_THREADS")
    if value is None or (value.strip().isdigit() and int(value) >= 1):
        return
    del os.environ["NUMBA_NUM_THREADS"]
    ENV_ERRORS.append(
        f"NUMBA_NUM_THREADS={value!r}: expected a whole number of threads >= 1 (unset it "
        "for every core)"
    )


def refuse_bad_environment() -> None:
    """InputError naming the first of ENV_ERRORS, if any."""
    if ENV_ERRORS:
        from .errors import InputError

        raise InputError(ENV_ERRORS[0])


def one_openmp_runtime() -> None:
    """Give numba and torch one OpenMP runtime, hence one thread pool.

    numba's OpenMP layer links the system's libgomp by its file name, torch its own copy
    by soname: imported in that order they load two runtimes, two pools of threads on the
    same cores. Loading numba's first (before torch) lets torch resolve to it. If torch
    came first, the two pools stay; their idle threads then must not spin (they starved
    each other's work: 7x on a GIN epoch, docs/runtime.md), so GOMP_SPINCOUNT=0.
    An explicit setting of the user's wins either way; NUMBA_THREADING_LAYER=workqueue
    keeps the runtimes apart (for a torch built against a newer libgomp than the
    system's)."""
    layer = os.environ.get("NUMBA_THREADING_LAYER", "default")
    if "torch" not in sys.modules and layer in ("default", "safe", "forksafe", "omp"):
        try:
            ctypes.CDLL("libgomp.so.1.0.0")  # the name numba's omppool asks the loader for
            return
        except OSError:  # no system libgomp: numba runs its workqueue
            pass
    os.environ.setdefault("GOMP_SPINCOUNT", "0")


def keep_freed_memory(limit: int = 1 << 30) -> None:
    """Let glibc reuse freed blocks below ``limit`` bytes instead of returning them to the
    kernel. A training step frees and reallocates the same large arrays (dropout masks,
    activations, gradients); served by fresh mmaps, every step page-faults them in
    again: 2.5 ms of a 7-ms dropout of 42 MB. The user's MALLOC_* settings win."""
    _thresholds(limit)


def _thresholds(limit: int):
    """glibc's mmap and trim thresholds set to ``limit`` bytes (blocks below it are
    reused, above it mapped and unmapped); libc, or None where the user set MALLOC_*
    or there is no glibc."""
    if sys.platform != "linux" or any(k.startswith("MALLOC_") for k in os.environ):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, limit)
    libc.mallopt(m_trim_threshold, limit)
    return libc


def fit_allocator(returns_freed: bool) -> bool:
    """With ``returns_freed`` (a training rank whose plan holds mgg.footprint.estimate.RETURN_ABOVE
    bytes of activations or more: ``Parts.returns_freed``), give freed blocks of 1 MiB
    and more back to the kernel (and what is free now) instead of keeping them below
    1 GiB for reuse (keep_freed_memory): such a rank frees and reallocates arrays of
    hundreds of MB whose kept blocks fragment (GCN, papers100m:scale=0.05 at P = 4: peak
    4.46 -> 3.03 GB a rank, epoch 12.4 -> 12.2 s), while the page faults of fresh blocks
    cost a small job up to half its step. Returns whether it did; the user's MALLOC_*
    settings win."""
    libc = _thresholds(1 << 20) if returns_freed else None
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
# set in each launched rank only (a Slurm allocation's shell has SLURM_NTASKS too)
_JOB_SIZE_VARS = ("MGG_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def launcher_int(env, names, default: int) -> int:
    """The first of the launcher variables ``names`` set in ``env``, as an int (Slurm's
    "2(x3)": 2), else ``default``; ValueError if it is not a number."""
    for var in names:
        if env.get(var, "").strip():
            return int(env[var].split("(")[0].split(",")[0])
    return default


def job_size(env=None) -> int:
    """The ranks of the job this process was launched in (1 outside a launcher)."""
    return max(1, launcher_int(os.environ if env is None else env, _JOB_SIZE_VARS, 1))


def local_size(env=None) -> int:
    """The ranks on this node, as the launcher (MPICH, Open MPI, Slurm) reports them."""
    return max(1, launcher_int(os.environ if env is None else env, _LOCAL_SIZE_VARS, 1))


def serialize_compiles(path: str | None = None) -> None:
    """Let one process per node compile at a time (a file lock around numba's compile).

    The ranks of a job start together and miss numba's cache together: four ranks on two
    cores compiled every kernel four times over (a fresh `make demo`: 29 s of compiling,
    against 13 s in one process). Under the lock, the first rank compiles and writes the
    cache; the others, once they hold the lock, find it there and load it (numba's
    compile looks in its cache first). What is cached already loads without the lock.
    Installed when numba's dispatcher is first imported, so a process that never compiles
    does not pay for importing numba. MGG_SERIAL_COMPILE=0 turns it off."""
    if os.environ.get("MGG_SERIAL_COMPILE") == "0":
        return
    path = path or os.path.join(tempfile.gettempdir(), f"mgg-compile-{os.getuid()}.lock")
    if "numba.core.dispatcher" in sys.modules:
        _lock_compiles(path)
    elif not any(isinstance(f, _OnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _OnImport("numba.core.dispatcher", lambda: _lock_compiles(path)))


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs ``then()`` right after module ``name`` is first imported."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module):  # the import machinery has put module in sys.modules
            exec_module(module)
            self.then()

        spec.loader.exec_module = exec_then
        return spec


def _lock_compiles(path: str) -> None:
    try:
        from numba.core import sigutils
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return
    if getattr(Dispatcher.compile, "_mgg_serial", False):
        return
    compile_ = Dispatcher.compile
    held = threading.local()  # callees compile inside their caller's compile: lock once

    def compile(self, sig):
        if getattr(held, "depth", 0):
            held.depth += 1
            try:
                return compile_(self, sig)
            finally:
                held.depth -= 1
        cache = getattr(self, "_cache", None)
        if cache is None or type(cache).__name__ == "NullCache":  # cache=False: no sharing
            return compile_(self, sig)
        with global_compiler_lock:  # what numba's compile does on a cache hit, unlocked
            try:
                args, _ = sigutils.normalize_signature(sig)
                cres = None
                if self.overloads.get(tuple(args)) is None:
                    cres = cache.load_overload(sig, self.targetctx)
                if cres is not None:
                    self._cache_hits[sig] += 1
                    if not cres.objectmode:
                        self.targetctx.insert_user_function(
                            cres.entry_point, cres.fndesc, [cres.library]
                        )
                    self.add_overload(cres)
                    return cres.entry_point
            except AttributeError:  # another numba's internals: its own compile does it
                pass
        with open(path, "a") as f:  # flock: other processes, and this one's other threads
            fcntl.flock(f, fcntl.LOCK_EX)  # released when f closes, or the process dies
            held.depth = 1
            try:
                return compile_(self, sig)
            finally:
                held.depth = 0

    compile._mgg_serial = True
    Dispatcher.compile = compile


# MPICH's start-up (MPI_Init: UCX's shared-memory segment) writes files of about 4.1 MiB;
# under a smaller file-size limit every rank dies there with MPICH's raw stack. 8 MiB
# leaves room.
MPI_FILE_BYTES = 8 << 20


def file_size_refusal() -> str | None:
    """Why MPI cannot start under this process's file-size limit (RLIMIT_FSIZE, `ulimit
    -f`), in one line naming the limit, the size needed and the remedy; None when it can.
    The limit is left as the user set it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY or soft >= MPI_FILE_BYTES:
        return None
    need = MPI_FILE_BYTES >> 10
    raise_it = (
        f"raise it (ulimit -f {need}, or ulimit -f unlimited)"
        if hard == resource.RLIM_INFINITY or hard >= MPI_FILE_BYTES
        else f"its hard limit is {hard >> 10} KiB: ask for a larger one"
    )
    return (
        f"the file-size limit (ulimit -f) is {soft >> 10} KiB, and MPI's start-up writes "
        f"files of about 4.1 MiB (every rank would die in MPI_Init): it needs {need} KiB; "
        + raise_it
    )


def file_size_limit() -> str:
    """The file-size limit as a user sets it (`ulimit -f`, KiB), for an error's text."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 10} KiB"
