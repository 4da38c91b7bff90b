"""The MPI backend of mgg.comm: symmetric arrays in MPI windows (CPU).

Three modes ("windows") of how a peer's rows reach a rank:
  shm  MPI_Win_allocate_shared on one node: every peer's rows are plain memory, read
       with loads (the CPU twin of nvshmem_ptr). Needs all ranks on one node.
  rma  MPI_Win_allocate with a passive-target epoch held open: rows are read with
       MPI_Rget of indexed datatypes, one call per batch of rows. Crosses nodes.
  msg  no window: the array is private, and its owner sends the rows peers need as
       two-sided messages (mgg.designs.push). Crosses nodes; the default there.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from ..errors import LaunchError
from ..knobs import check_value
from ..precision import bits, storage
from .base import WINDOWS, Comm, SymmetricArray

_abort_installed = False


def _mpi():
    from mpi4py import MPI

    return MPI


def install_abort_handler(comm) -> None:
    """Make an uncaught exception (or a non-zero exit) on any rank abort the whole job.

    Without this, the other ranks would wait forever in their next collective.
    """
    global _abort_installed
    if _abort_installed or comm.Get_size() == 1:
        return
    _abort_installed = True
    prev_hook = sys.excepthook

    def hook(kind, value, tb):
        if issubclass(kind, SystemExit) and value.code in (0, None):
            return prev_hook(kind, value, tb)
        prev_hook(kind, value, tb)
        sys.stderr.write(
            f"mgg: rank {comm.Get_rank()} failed; aborting all {comm.Get_size()} ranks\n"
        )
        abort(comm, 1)

    sys.excepthook = hook
    threading.excepthook = lambda a: hook(a.exc_type, a.exc_value, a.exc_traceback)


def abort(comm, code: int) -> None:
    """MPI_Abort, after giving the launcher time to forward what this rank printed (an
    abort tears the job down at once, and output still in flight is lost)."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_SECONDS)
    try:  # what this rank had to say is out: silence MPICH's "Abort(2) on node ..." line
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    except OSError:
        pass
    comm.Abort(code)


ABORT_GRACE_SECONDS = 1.0


def unlink_node_segment(node) -> None:
    """Unlink MPICH's intranode segment (/dev/shm/mpich_shm_*) early, so that no way of
    ending the job (a kill, MPI_Abort) leaves it behind: MPICH unlinks it only in
    MPI_Finalize. Safe once this rank has communicated: MPICH maps it while bootstrapping
    shared memory and waits there until every rank of the node has; the maps stay valid."""
    if node.Get_size() == 1 or node.Get_rank() != 0:
        return
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split(None, 5)[-1].strip() for ln in f if "/dev/shm/mpich_shm_" in ln}
    except OSError:
        return
    for path in paths:
        if path.startswith("/dev/shm/mpich_shm_") and " " not in path:
            try:
                os.unlink(path)
            except OSError:
                pass


def mpi_type(MPI, dtype):
    """The MPI datatype of an element of ``dtype`` (bf16: its 16-bit word)."""
    return MPI._typedict[storage(dtype).char]


class LaunchMismatchError(LaunchError):
    """The job's world is not the size mggrun asked for."""


def check_world_size(size: int, asked: str | None, MPI=None) -> None:
    """Raise LaunchMismatchError when mggrun asked for ``asked`` ranks (its MGG_NP) and MPI
    reports a world of ``size``: then mpi4py is bound to another MPI library than the
    mpiexec that started the job, and every rank would run alone, as a singleton."""
    if not asked or int(asked) == size:
        return
    lib = MPI.Get_library_version().splitlines()[0].strip() if MPI is not None else "unknown"
    raise LaunchMismatchError(
        f"mggrun started {asked} ranks but MPI reports a world of {size}: mpi4py is bound "
        f"to another MPI library ({lib}) than the mpiexec that launched the job "
        f"({os.environ.get('MGG_MPIEXEC') or 'the one beside this Python'}). Set "
        "MGG_MPIEXEC to that library's mpiexec, or LD_LIBRARY_PATH to the library of this "
        "mpiexec (docs/gpu-notes.md shows both)"
    )


class MPIComm(Comm):
    """mgg.comm over mpi4py. ``window``: 'shm', 'rma', 'msg' or None (auto: shm when on
    one node, else msg: the faster across nodes in bench/results/network_designs.md)."""

    def __init__(self, comm=None, window: str | None = None):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        if comm is None:
            check_world_size(self.size, os.environ.get("MGG_NP"), MPI)
        self.node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.single_node = self.comm.allreduce(self.node.Get_size()) == self.size**2
        window = check_value("window", window)
        if window == "shm" and not self.single_node:
            nodes = self.comm.allreduce(int(self.node.Get_rank() == 0))
            raise ValueError(
                f"--window shm needs every rank on one node, and this job's {self.size} "
                f"ranks are on {nodes}; use --window msg, rma or auto"
            )
        self.window = ("shm" if self.single_node else "msg") if window is None else window
        self.window_asked = window is not None
        self.windows = tuple(w for w in WINDOWS if w != "shm" or self.single_node)
        # one node: shm's loads beat any copy; across nodes, measure
        self.window_choices = () if self.single_node else ("msg", "rma")
        unlink_node_segment(self.node)
        install_abort_handler(self.comm)

    # ---- collectives ---------------------------------------------------------------------
    def barrier(self) -> None:
        self.comm.Barrier()

    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        MPI = self.MPI
        a = np.ascontiguousarray(a)
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op={"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op])
        return out

    def bcast(self, obj, root: int = 0):
        return self.comm.bcast(obj, root=root)

    def allgather(self, obj) -> list:
        return self.comm.allgather(obj)

    def gather(self, obj, root: int = 0):
        return self.comm.gather(obj, root=root)

    def alltoall(self, objs: list) -> list:
        return self.comm.alltoall(objs)

    def alltoallv(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> None:
        d = int(np.prod(send.shape[1:])) if send.ndim > 1 else 1
        sc = np.asarray(send_counts, np.int64) * d
        rc = np.asarray(recv_counts, np.int64) * d
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        send, recv = bits(send), bits(recv)  # bf16 goes as its 16-bit words
        mt = self.MPI._typedict[send.dtype.char]
        self.comm.Alltoallv([send, (sc, sd), mt], [recv, (rc, rd), mt])

    def abort(self, code: int = 1) -> None:
        abort(self.comm, code)

    # ---- symmetric memory ----------------------------------------------------------------
    def symmetric(self, rows: int, dim: int, dtype=np.float32, window=None) -> SymmetricArray:
        rows, dim = int(rows), int(dim)
        sizes = self.comm.allgather((rows, dim, np.dtype(dtype).str))
        if len(set(sizes)) != 1:
            raise ValueError(
                f"symmetric arrays must have the same shape on every rank, got {sorted(set(sizes))}"
            )
        mode = check_value("window", window or self.window)
        if mode not in self.windows:
            raise ValueError(f"window={mode!r} needs every rank on one node")
        if mode == "msg":
            return PrivateArray(rows, dim, np.dtype(dtype))
        return MPISymmetricArray(self, rows, dim, np.dtype(dtype), mode)

    def dup(self):
        """A duplicate of the job's communicator, for messages of one design alone."""
        return self.comm.Dup()


class PrivateArray(SymmetricArray):
    """The 'msg' mode: a plain [rows, dim] array that no peer reads; its owner sends."""

    mode = "msg"

    def __init__(self, rows: int, dim: int, dtype: np.dtype):
        self.rows, self.dim, self.dtype = rows, dim, dtype
        self.local = np.empty((rows, dim), dtype)

    def publish(self) -> None:
        """Nothing to publish: the owner's messages carry the rows."""

    def free(self) -> None:
        self.local = None


class RowSelection:
    """A fixed transfer from one peer: its rows ``rows`` into ``slots`` of the receiving
    buffer (consecutive rows when slots is None), as committed MPI datatypes."""

    def __init__(self, sym: MPISymmetricArray, pe: int, rows, slots=None):
        self.pe = int(pe)
        self.rows = np.ascontiguousarray(rows, np.int64)
        self.slots = None if slots is None else np.ascontiguousarray(slots, np.int64)
        if self.slots is not None and self.slots.size != self.rows.size:
            raise ValueError(f"{self.rows.size} rows but {self.slots.size} slots")
        if self.rows.size and (self.rows.min() < 0 or self.rows.max() >= sym.rows):
            raise ValueError(f"rows outside [0, {sym.rows}) requested from rank {pe}")
        self.target = self.origin = None
        if sym.mode == "rma" and self.rows.size:
            self.target = sym._indexed(self.rows)
            if self.slots is not None:
                self.origin = sym._indexed(self.slots)

    @property
    def size(self) -> int:
        return int(self.rows.size)

    def free(self) -> None:
        for t in (self.target, self.origin):
            if t is not None:
                t.Free()
        self.target = self.origin = None


class MPISymmetricArray(SymmetricArray):
    def __init__(self, comm: MPIComm, rows: int, dim: int, dtype: np.dtype, mode: str):
        MPI = comm.MPI
        self.comm, self.rows, self.dim, self.dtype, self.mode = comm, rows, dim, dtype, mode
        self.itemsize = dtype.itemsize
        nbytes = max(rows * dim * self.itemsize, 1)
        info = MPI.Info.Create()
        info.Set("same_size", "true")
        if mode == "shm":
            self.win = MPI.Win.Allocate_shared(nbytes, self.itemsize, info=info, comm=comm.node)
            self._node_view = self._map_node()
            self.local = self.peer(comm.node.Get_rank())
        else:
            self.win = MPI.Win.Allocate(nbytes, self.itemsize, info=info, comm=comm.comm)
            buf = np.frombuffer(self.win.tomemory(), dtype=dtype, count=rows * dim)
            self.local = buf.reshape(rows, dim)
            self._node_view = None
        info.Free()
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self._row_type = mpi_type(MPI, dtype).Create_contiguous(max(dim, 1)).Commit()

    def _map_node(self):
        """One array over the node's segments: rows of node-rank i start at i * rows."""
        MPI = self.comm.MPI
        node = self.comm.node
        base, _ = self.win.Shared_query(0)
        base_addr = MPI.Get_address(base)
        row_bytes = self.dim * self.itemsize
        for i in range(node.Get_size()):
            mem, _ = self.win.Shared_query(i)
            off = MPI.Get_address(mem) - base_addr
            if row_bytes and off != i * self.rows * row_bytes:
                raise RuntimeError(
                    f"shared window segment of node rank {i} is at byte offset "
                    f"{off}, not contiguous; use window='rma'"
                )
        total = node.Get_size() * self.rows * self.dim
        mem = MPI.memory.fromaddress(base_addr, max(total * self.itemsize, 1))
        return np.frombuffer(mem, dtype=self.dtype, count=total).reshape(-1, self.dim)

    # ---- direct loads (shm) --------------------------------------------------------------
    @property
    def node_view(self) -> np.ndarray:
        """[node_size * rows, dim]: every rank's rows; rank pe's row r is row pe*rows + r."""
        if self._node_view is None:
            raise ValueError("direct loads need window='shm'")
        return self._node_view

    def peer(self, pe: int) -> np.ndarray:
        return self.node_view[pe * self.rows : (pe + 1) * self.rows]

    # ---- one-sided gets ------------------------------------------------------------------
    def publish(self) -> None:
        """Collective: make every rank's local writes visible to all peers."""
        self.win.Sync()
        self.comm.barrier()
        self.win.Sync()

    def selection(self, pe: int, rows, slots=None) -> RowSelection:
        return RowSelection(self, pe, rows, slots)

    def rget(self, sel: RowSelection, out: np.ndarray):
        """Start fetching a selection into out [*, dim]; one MPI call. Returns a request to
        wait on, or None when the rows are already there (shm loads, empty selection)."""
        if sel.size == 0:
            return None
        if self.mode == "shm":
            src = self.peer(sel.pe)
            if sel.slots is None:
                out[: sel.size] = src[sel.rows]
            else:
                out[sel.slots] = src[sel.rows]
            return None
        if sel.slots is None:
            origin = [bits(out), sel.size, self._row_type]
        else:
            origin = [bits(out), 1, sel.origin]
        return self.win.Rget(origin, sel.pe, [0, 1, sel.target])

    def _indexed(self, rows: np.ndarray):
        """Committed datatype selecting these rows of a [*, dim] buffer."""
        MPI = self.comm.MPI
        return (
            mpi_type(MPI, self.dtype)
            .Create_indexed_block(max(self.dim, 1), rows * self.dim)
            .Commit()
        )

    def free(self) -> None:
        """Collective: release the window (after every peer is done reading)."""
        if self.win is None:
            return
        self.comm.barrier()
        self.win.Unlock_all()
        self._row_type.Free()
        self.local = self._node_view = None
        self.win.Free()
        self.win = None
