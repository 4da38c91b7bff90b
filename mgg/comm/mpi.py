"""The MPI backend of mgg.comm: symmetric arrays in MPI windows (CPU).

Three modes ("windows") of how a peer's rows reach a rank:
  shm  MPI_Win_allocate_shared on one node: every peer's rows are plain memory, read
       with loads (the CPU twin of nvshmem_ptr). Needs all ranks on one node.
  rma  MPI_Win_allocate with a passive-target epoch held open: rows are read with
       MPI_Rget of indexed datatypes, one call per batch of rows. Crosses nodes.
  msg  no window: the array is private, and its owner sends the rows peers need as
       two-sided messages (mgg.designs.push). Crosses nodes; the default there.

Every collective of MPIComm is watched: one that some rank does not join within
MGG_COLLECTIVE_TIMEOUT seconds (default 60; 0 waits forever) ends the job with one line
naming the op and the ranks that did not join (see ``Collectives``).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import pickle
import sys
import threading
import time

import numpy as np

from ..errors import InputError, LaunchError
from ..knobs import check_value
from ..precision import bits
from .base import WINDOWS, Comm, SymmetricArray
from .mpi_windows import MPISymmetricArray, PrivateArray

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


# ---- the collective watchdog -----------------------------------------------------------------
TIMEOUT_ENV = "MGG_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
OPS = ("barrier", "allreduce", "bcast", "allgather", "gather", "alltoall", "alltoallv")
BARRIER, ALLREDUCE, BCAST, ALLGATHER, GATHER, ALLTOALL, ALLTOALLV = range(1, len(OPS) + 1)
SPIN_S = 1e-3  # Test() in a loop this long before sleeping: a peer late by less costs nothing
NAP_S = (5e-5, 1e-3)  # then sleep between Tests, doubling from the first to the longest
CLAIM_S = 0.05  # ranks that time out together: the lowest reports
ASK_S = 2.0  # how long to wait for the state of a rank on another node
# a rank found neither in the collective nor at work alone is looked at once more this much
# later: it may have just left comm.alone() for the collective (a preempted rank, for ms)
GRACE_S = 0.25
SHOWN = 8  # ranks a message details
SLOT = 3  # words each rank publishes: what it last entered, timed out, at work alone
HINT = (
    "a collective must be called by every rank (evaluate on every rank, print on rank 0); "
    f"{TIMEOUT_ENV}=SECONDS changes the wait, 0 waits forever"
)


def collective_timeout(environ=None) -> float:
    """Seconds a collective waits for every rank to join it: MGG_COLLECTIVE_TIMEOUT, or 60
    (0: forever)."""
    text = (os.environ if environ is None else environ).get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise InputError(
            f"{TIMEOUT_ENV}={text!r}: expected the seconds a collective may wait for every "
            "rank to join it, a number >= 0 (0 waits forever)"
        )
    return value


def _joined(state: int, n: int, code: int) -> bool:
    """Whether a rank that published ``state`` joined collective ``n`` (op ``code``): it is
    in it, or past it."""
    count = state >> 4
    return count > n or (count == n and state & 15 == code)


def _where(rank: int, state: int | None, n: int) -> str:
    if state is None:
        return f"rank {rank} is on another node and did not answer"
    count, op = state >> 4, OPS[(state & 15) - 1] if state & 15 else "?"
    if count == 0:
        return f"rank {rank} has called no collective"
    if count == n:
        return f"rank {rank} is in {op} #{count}"
    return f"rank {rank}'s last collective is {op} #{count}"


def _listed(items: list[str], more: int) -> str:
    return ", ".join(items) + (f", and {more} more" if more > 0 else "")


_KEYVAL = None


class Collectives:
    """What the collectives of one MPI communicator share, made once per communicator and
    cached on it (an MPI attribute), so that every MPIComm over it counts the same
    collectives in the same order.

    ``comms``: a duplicate of the communicator per op (MPICH would match an Iallreduce with
    an Ibarrier on one communicator, and both would return: a rank in the wrong collective
    must wait for the watchdog instead). ``count``: collectives called so far; each rank
    publishes ``count << 4 | op`` on entering one (one integer store) in ``mine``, its slot
    of a shared-memory window over its node, where the node's ranks read it, and where the
    ranks of other nodes read it with MPI_Rget of an RMA window over the communicator
    (made only when the job spans nodes). The slot's second word marks a rank that timed
    out, so that one rank reports; its third, a rank at work alone (``MPIComm.alone``),
    which its peers wait for as long as it takes.
    """

    def __init__(self, MPI, comm, node, single_node: bool):
        self.MPI, self.comm, self.count = MPI, comm, 0
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.win = self.remote = None
        if self.size == 1:
            self.comms = (None,) + (comm,) * len(OPS)
            self.slots = [np.zeros(SLOT, np.int64)]
            self.node_ranks, self.node_rank = [0], 0
        else:
            self.comms = (None,) + tuple(comm.Dup() for _ in OPS)
            self.win = MPI.Win.Allocate_shared(8 * SLOT, 8, comm=node)
            self.win.Lock_all(MPI.MODE_NOCHECK)
            self.slots = [
                np.frombuffer(self.win.Shared_query(i)[0], np.int64, SLOT)
                for i in range(node.Get_size())
            ]
            self.node_rank = node.Get_rank()
            self.slots[self.node_rank][:] = 0  # MPI does not zero a window's memory
            self.win.Sync()
            comm.Barrier()  # no rank reads a slot before its owner zeroed it
            self.node_ranks = list(
                node.Get_group().Translate_ranks(list(range(node.Get_size())), comm.Get_group())
            )
            if not single_node:
                self.remote = MPI.Win.Create(self.win.tomemory(), 8, comm=comm)
                self.remote.Lock_all(MPI.MODE_NOCHECK)
                atexit.register(self._free_remote)  # unfreed, UCX warns at MPI_Finalize
        self.mine = memoryview(self.slots[self.node_rank]).cast("B").cast("q")

    @classmethod
    def of(cls, MPI, comm, node, single_node: bool) -> Collectives:
        """The communicator's, made on first use (collective then)."""
        global _KEYVAL
        if _KEYVAL is None:
            _KEYVAL = MPI.Comm.Create_keyval()
        shared = comm.Get_attr(_KEYVAL)
        if shared is None:
            shared = cls(MPI, comm, node, single_node)
            comm.Set_attr(_KEYVAL, shared)
        return shared

    def _free_remote(self) -> None:
        """At exit (collective: every rank that ends normally gets here)."""
        if self.remote is not None and not self.MPI.Is_finalized():
            self.remote.Unlock_all()
            self.remote.Free()
            self.remote = None

    def joined_here(self, n: int, code: int) -> bool:
        """Whether every rank on this node joined collective ``n``."""
        return all(_joined(int(s[0]), n, code) for s in self.slots)

    def peek(self) -> list[tuple[int, ...] | None]:
        """Each rank's slot: (what it last entered, whether it timed out, whether it is at
        work alone); None: the rank is on another node and did not answer."""
        out: list[tuple[int, ...] | None] = [None] * self.size
        for rank, slot in zip(self.node_ranks, self.slots, strict=True):
            out[rank] = tuple(slot.tolist())
        if self.remote is not None:
            MPI = self.MPI
            far = [r for r in range(self.size) if out[r] is None]
            got = np.zeros((len(far), SLOT), np.int64)
            asks = {
                i: self.remote.Rget([got[i], MPI.INT64_T], r, [0, SLOT, MPI.INT64_T])
                for i, r in enumerate(far)
            }
            end = time.monotonic() + ASK_S
            while asks and time.monotonic() < end:
                for i in [i for i, req in asks.items() if req.Test()]:
                    out[far[i]] = tuple(got[i].tolist())
                    del asks[i]
                time.sleep(1e-3)
        return out

    def claim(self) -> bool:
        """Whether this rank reports a timeout: no rank did yet, and no lower one timed out
        at the same time (ranks on other nodes that do not answer are not asked)."""
        if any(p and p[1] for p in self.peek()):
            return False
        self.slots[self.node_rank][1] = 1
        self.win.Sync()
        time.sleep(CLAIM_S)
        self.win.Sync()
        return not any(p and p[1] for p in self.peek()[: self.rank])


class MPIComm(Comm):
    """mgg.comm over mpi4py. ``window``: 'shm', 'rma', 'msg' or None (auto: shm when on
    one node, else msg: the faster across nodes in bench/results/network_designs.md).

    ``timeout``: seconds a collective waits for every rank to join it before it ends the
    job (MGG_COLLECTIVE_TIMEOUT, read here; 0: forever)."""

    def __init__(self, comm=None, window: str | None = None):
        MPI = _mpi()
        self.timeout = collective_timeout()  # after MPI is up: only rank 0 reports it
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
        self._coll = Collectives.of(MPI, self.comm, self.node, self.single_node)
        self._ops = self._coll.comms
        self._reduce = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        unlink_node_segment(self.node)
        install_abort_handler(self.comm)

    # ---- collectives ---------------------------------------------------------------------
    # Each one publishes that this rank entered it (_enter), starts the non-blocking MPI
    # call on its op's communicator and waits for it (_wait); the pickled-object ones move
    # the sizes first, then the bytes, as mpi4py's do.
    def barrier(self) -> None:
        n = self._enter(BARRIER)
        self._wait(self._ops[BARRIER].Ibarrier(), n, BARRIER)

    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        a = np.ascontiguousarray(a)
        out = np.empty_like(a)
        mpi_op = self._reduce[op]
        n = self._enter(ALLREDUCE)
        self._wait(self._ops[ALLREDUCE].Iallreduce(a, out, op=mpi_op), n, ALLREDUCE)
        return out

    def bcast(self, obj, root: int = 0):
        n, c, byte = self._enter(BCAST), self._ops[BCAST], self.MPI.BYTE
        if self.rank == root:
            data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
            size = np.array([len(data)], np.int64)
        else:
            size = np.zeros(1, np.int64)
        self._wait(c.Ibcast(size, root=root), n, BCAST)
        if self.rank != root:
            data = bytearray(int(size[0]))
        self._wait(c.Ibcast([data, byte], root=root), n, BCAST)
        return pickle.loads(data)  # a copy on the root too, as mpi4py's

    def allgather(self, obj) -> list:
        n, c, byte = self._enter(ALLGATHER), self._ops[ALLGATHER], self.MPI.BYTE
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        sizes = np.empty(self.size, np.int64)
        self._wait(c.Iallgather(np.array([len(data)], np.int64), sizes), n, ALLGATHER)
        buf, at = bytearray(int(sizes.sum())), _starts(sizes)
        self._wait(c.Iallgatherv([data, byte], [buf, (sizes, at), byte]), n, ALLGATHER)
        return _unpickled(buf, sizes, at)

    def gather(self, obj, root: int = 0):
        n, c, byte = self._enter(GATHER), self._ops[GATHER], self.MPI.BYTE
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        me = self.rank == root
        sizes = np.empty(self.size, np.int64) if me else None
        self._wait(c.Igather(np.array([len(data)], np.int64), sizes, root=root), n, GATHER)
        if not me:
            self._wait(c.Igatherv([data, byte], None, root=root), n, GATHER)
            return None
        buf, at = bytearray(int(sizes.sum())), _starts(sizes)
        self._wait(c.Igatherv([data, byte], [buf, (sizes, at), byte], root=root), n, GATHER)
        return _unpickled(buf, sizes, at)

    def alltoall(self, objs: list) -> list:
        if len(objs) != self.size:
            raise ValueError(f"alltoall takes one object per rank ({self.size}), not {len(objs)}")
        n, c, byte = self._enter(ALLTOALL), self._ops[ALLTOALL], self.MPI.BYTE
        parts = [pickle.dumps(o, pickle.HIGHEST_PROTOCOL) for o in objs]
        sent = np.array([len(b) for b in parts], np.int64)
        sizes = np.empty(self.size, np.int64)
        self._wait(c.Ialltoall(sent, sizes), n, ALLTOALL)
        buf, at = bytearray(int(sizes.sum())), _starts(sizes)
        send = [b"".join(parts), (sent, _starts(sent)), byte]
        self._wait(c.Ialltoallv(send, [buf, (sizes, at), byte]), n, ALLTOALL)
        return _unpickled(buf, sizes, at)

    def alltoallv(self, send: np.ndarray, send_counts, recv: np.ndarray, recv_counts) -> None:
        d = int(np.prod(send.shape[1:])) if send.ndim > 1 else 1
        sc = np.asarray(send_counts, np.int64) * d
        rc = np.asarray(recv_counts, np.int64) * d
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]])
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]])
        send, recv = bits(send), bits(recv)  # bf16 goes as its 16-bit words
        mt = self.MPI._typedict[send.dtype.char]
        n = self._enter(ALLTOALLV)
        req = self._ops[ALLTOALLV].Ialltoallv([send, (sc, sd), mt], [recv, (rc, rd), mt])
        self._wait(req, n, ALLTOALLV)

    def abort(self, code: int = 1) -> None:
        abort(self.comm, code)

    # ---- the watchdog --------------------------------------------------------------------
    def _enter(self, code: int) -> int:
        """This rank enters a collective of op ``code``: count it and publish (one store)."""
        coll = self._coll
        coll.count = n = coll.count + 1
        coll.mine[0] = n << 4 | code
        return n

    def _wait(self, req, n: int, code: int) -> None:
        """Wait for ``req`` of collective ``n``; past the timeout, end the job."""
        if req.Test():
            return
        if self.timeout == 0 or self.size == 1:
            req.Wait()
            return
        test, clock = req.Test, time.perf_counter
        start = clock()
        spun = start + SPIN_S
        while clock() < spun:
            if test():
                return
        deadline, nap, here, stalled = start + self.timeout, NAP_S[0], False, False
        suspect = False
        while not test():
            now = clock()
            if now >= deadline:
                slots = self._coll.peek()
                late = [r for r, s in enumerate(slots) if s is None or not _joined(s[0], n, code)]
                missing = [r for r in late if r != self.rank and not (slots[r] and slots[r][2])]
                if missing and not suspect:
                    suspect, deadline = True, now + GRACE_S
                    continue
                if missing or (stalled and not late):
                    self._fail(self._late(n, code, missing, [s and s[0] for s in slots]))
                # all in: give it one more timeout; some at work alone: wait for them
                suspect, stalled, deadline = False, not late, now + self.timeout
            elif not here:  # someone on this node is not in yet: sleep, not spin
                here = self._coll.joined_here(n, code)
                if not here:
                    time.sleep(nap)
                    nap = min(2 * nap, NAP_S[1])

    @contextlib.contextmanager
    def alone(self):
        """Work this rank does while its peers wait for it in a collective (rank 0 reading
        a checkpoint or ordering the graph for all): they wait as long as it takes."""
        slot = self._coll.slots[self._coll.node_rank]
        slot[2] += 1
        try:
            yield
        finally:
            slot[2] -= 1

    def _late(self, n: int, code: int, missing: list[int], states) -> str:
        """The one line that says who kept collective ``n`` waiting."""
        what = f"mgg: {OPS[code - 1]} #{n} on rank {self.rank}"
        if not missing:
            return (
                f"{what}: every rank joined it, but it has not completed in "
                f"{2 * self.timeout:g} s (do the ranks pass it the same shapes, dtypes and "
                f"root?); {TIMEOUT_ENV}=SECONDS changes the wait, 0 waits forever"
            )
        shown, more = missing[:SHOWN], len(missing) - SHOWN
        ranks = ("rank " if len(missing) == 1 else "ranks ") + _listed(list(map(str, shown)), more)
        where = _listed([_where(r, states[r], n) for r in shown], more)
        return f"{what} waited {self.timeout:g} s for {ranks} ({where}): {HINT}"

    def _fail(self, message: str) -> None:
        """End the job: this rank says why, unless a rank of its node already does."""
        if self._coll.claim():
            sys.stderr.write(message + "\n")
        else:
            time.sleep(0.5)  # the reporter's abort ends the job, after its line is out
        abort(self.comm, 1)
        os._exit(1)

    # ---- symmetric memory ----------------------------------------------------------------
    def symmetric(self, rows: int, dim: int, dtype=np.float32, window=None) -> SymmetricArray:
        rows, dim = int(rows), int(dim)
        sizes = self.allgather((rows, dim, np.dtype(dtype).str))
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
        """A duplicate of the job's communicator (mpi4py's), for the point-to-point messages
        of one design alone; the watchdog does not see it (MPIComm(dup) would have its own
        count of collectives)."""
        return self.comm.Dup()


def _starts(sizes: np.ndarray) -> np.ndarray:
    """Where each part of ``sizes`` starts in one buffer."""
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def _unpickled(buf: bytearray, sizes: np.ndarray, starts: np.ndarray) -> list:
    view, at = memoryview(buf), starts.tolist()
    return [pickle.loads(view[a : a + n]) for a, n in zip(at, sizes.tolist(), strict=True)]
