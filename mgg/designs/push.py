"""Pushed halo rows: MGG's pipelining over two-sided messages (the 'msg' window), for
ranks that cannot read each other's memory (across nodes).

Every rank knows from its plan which of its rows each peer's chunks of RNPs read (they
tell each other once, at setup), so at step s the owners pack and send chunk s, one
message per peer, and then aggregate their own local slice s; each receiver then
aggregates the chunks as they land. Each remote row crosses the network once per call,
as in bulk halo exchange, but no rank waits for the slowest one before it computes.
"""

from __future__ import annotations

import numpy as np

from ..comm.mpi_windows import mpi_type
from ..graph.core import inverse
from ..kernels import cpu
from ..precision import bits


class Pushes:
    """The messages of one plan cut into chunks ("batches"; collective setup).

    first_new  int64 [nb + 1]: batch b first reads halo slots [first_new[b], first_new[b+1])
               (the halo is in order of first use); ranks may cut different numbers
    Receiving: halo rows land in ``staging`` [H, D] grouped by (batch, owner);
    ``remote_index`` [Er] is each remote edge's row there.
    Sending: step s packs and sends, to every peer, the rows its batch s reads.
    """

    def __init__(self, plan, comm, first_new: np.ndarray, dim: int, dtype):
        p, size = plan, plan.num_ranks
        self.mpi = comm.MPI
        self.comm = comm.dup()
        nb = first_new.size - 1
        self.steps = int(comm.allreduce(np.array([nb], np.int64), "max")[0])
        batch = np.searchsorted(first_new, np.arange(p.num_halo), "right") - 1
        order = np.lexsort((p.halo_pe, batch))  # by batch, then owner, else first use
        self.remote_index = inverse(order, np.int32)[p.remote_slot]  # slots are int32
        recv = np.zeros((self.steps, size), np.int64)
        np.add.at(recv, (batch, p.halo_pe), 1)
        self.recv_counts = recv  # [S, P] rows from each owner per batch
        # tell each owner which of its rows we read, and in which batch
        rows, pes = p.halo_row[order].astype(np.int64), p.halo_pe[order]
        asks = comm.alltoall([(rows[pes == q], recv[:, q]) for q in range(size)])
        step = np.concatenate([np.repeat(np.arange(self.steps), c) for _, c in asks])
        peer = np.concatenate([np.full(r.size, q) for q, (r, _) in enumerate(asks)])
        send_order = np.lexsort((peer, step))
        self.send_rows = np.concatenate([r for r, _ in asks]).astype(np.int64)[send_order]
        self.send_counts = np.stack([c for _, c in asks], axis=1)  # [S, P] rows to each peer
        self.staging = np.empty((p.num_halo, dim), dtype)
        self.send = np.empty((self.send_rows.size, dim), dtype)
        self._recv_off = _offsets(self.recv_counts)
        self._send_off = _offsets(self.send_counts)
        self.mpi_type = mpi_type(self.mpi, dtype)
        self.tag_ub = max(1, int(self.comm.Get_attr(self.mpi.TAG_UB) or 32767))

    def post_receives(self) -> list[list]:
        """Irecv every batch's rows; returns the requests of each batch [S][...]."""
        out = []
        for b in range(self.steps):
            reqs = []
            for q in np.flatnonzero(self.recv_counts[b]):
                o, n = self._recv_off[b, q], self.recv_counts[b, q]
                buf = bits(self.staging[o : o + n])
                reqs.append(self.comm.Irecv([buf, self.mpi_type], int(q), b % self.tag_ub))
            out.append(reqs)
        return out

    def send_step(self, s: int, x: np.ndarray) -> list:
        """Pack the rows of x [n, D] that the peers' batch s reads and Isend them."""
        if s >= self.steps:
            return []
        a, b = self._send_off[s, 0], self._send_off[s, -1] + self.send_counts[s, -1]
        cpu.gather_rows(x, self.send_rows[a:b], self.send[a:b])
        reqs = []
        for q in np.flatnonzero(self.send_counts[s]):
            o, n = self._send_off[s, q], self.send_counts[s, q]
            buf = bits(self.send[o : o + n])
            reqs.append(self.comm.Isend([buf, self.mpi_type], int(q), s % self.tag_ub))
        return reqs

    def free(self) -> None:
        if self.comm is not None:
            self.comm.Free()
            self.comm = None


def _offsets(counts: np.ndarray) -> np.ndarray:
    """Row offsets [S, P] of (step, peer) blocks laid out step-major in one buffer."""
    flat = np.cumsum(counts.ravel()) - counts.ravel()
    return flat.reshape(counts.shape)
