"""The rows of MPIComm.symmetric: an array in an MPI window (shm: node memory every peer
loads; rma: one-sided gets of indexed rows) or private (msg: its owner sends)."""

from __future__ import annotations

import numpy as np

from ..precision import bits, storage
from .base import SymmetricArray


def mpi_type(MPI, dtype):
    """The MPI datatype of an element of ``dtype`` (bf16: its 16-bit word)."""
    return MPI._typedict[storage(dtype).char]


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
    def __init__(self, comm, rows: int, dim: int, dtype: np.dtype, mode: str):
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
