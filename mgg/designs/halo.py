"""Moving per-node rows and per-edge values between the ranks of a plan, outside the
aggregation kernels: what a layer needs besides aggregating (GAT's attention scalars of
remote sources, per-edge weights in the transposed plan's order).

Both are set up once per plan (collectively) and run over the comm's alltoallv, on host
arrays (the MPI wheel is not CUDA-aware): numpy in, numpy out; cupy in, cupy out, with
only what crosses ranks passing through the host."""

from __future__ import annotations

import numpy as np

from ..arrays import array_module, held, to_host
from ..partition.plan import PartitionPlan


class HaloExchange:
    """The halo of a plan: rows of peers that this rank's remote edges read.

    gather(x [n, k]) -> [H, k] the remote rows in halo order (plan.halo_pe/halo_row)
    scatter_add(g [H, k]) -> [n, k] its adjoint: each rank's halo rows summed back into
    the rows of their owners
    """

    def __init__(self, plan: PartitionPlan, comm):
        self.plan, self.comm = plan, comm
        self._device = {}  # index arrays uploaded by _on
        p, size = plan, plan.num_ranks
        self.order = np.argsort(p.halo_pe, kind="stable")  # halo slots grouped by owner
        self.recv_counts = np.bincount(p.halo_pe, minlength=size).astype(np.int64)
        if size == 1:
            self.send_rows = np.zeros(0, np.int64)
            self.send_counts = np.zeros(1, np.int64)
            return
        requests = np.split(
            p.halo_row[self.order].astype(np.int64), np.cumsum(self.recv_counts)[:-1]
        )
        wanted = comm.alltoall(requests)  # tell each owner which of its rows we need
        self.send_rows = np.concatenate(wanted).astype(np.int64)
        self.send_counts = np.array([w.size for w in wanted], np.int64)

    def gather(self, x):
        """Collective. x [n, k] this rank's rows (numpy or cupy) -> [H, k] on x's device."""
        xp = array_module(x)
        out = xp.empty((self.plan.num_halo, *x.shape[1:]), x.dtype)
        if self.comm is None or self.plan.num_ranks == 1:
            return out
        recv = np.empty(out.shape, x.dtype)
        send = to_host(x[_on(self, xp, "send_rows")])
        self.comm.alltoallv(np.ascontiguousarray(send), self.send_counts, recv, self.recv_counts)
        out[_on(self, xp, "order")] = xp.asarray(recv)
        return out

    def scatter_add(self, g):
        """Collective. g [H, k] per halo row (numpy or cupy) -> [n, k] summed into the
        owners' rows, on g's device."""
        xp = array_module(g)
        out = xp.zeros((self.plan.num_local_nodes, *g.shape[1:]), g.dtype)
        if self.comm is None or self.plan.num_ranks == 1:
            return out
        recv = np.empty((self.send_rows.size, *g.shape[1:]), g.dtype)
        send = to_host(g[_on(self, xp, "order")])
        self.comm.alltoallv(np.ascontiguousarray(send), self.recv_counts, recv, self.send_counts)
        if xp is np:
            np.add.at(out, self.send_rows, recv)
        else:
            import cupyx

            cupyx.scatter_add(out, _on(self, xp, "send_rows"), xp.asarray(recv))
        return out


class EdgeTranspose:
    """Per-edge values of a plan (local [El, ...], remote [Er, ...], in its edge order)
    into the order of its transposed plan, where each edge is held by its source's rank.

    An edge u -> v with both ends on one rank only moves within the rank; an edge whose
    ends live on two ranks moves from v's rank (forward remote edge) to u's (transposed
    remote edge), once per call. Duplicate edges pair up in order (their values agree
    whenever they are a function of (u, v)).
    """

    def __init__(self, plan: PartitionPlan, comm):
        t = plan.transposed
        self.plan, self.comm = plan, comm
        self._device = {}  # index arrays uploaded by _on
        fl, fr = plan.edge_keys()
        tl, tr = t.edge_keys(transposed=True)
        self.local = _pairing(fl, tl, "local")
        size = plan.num_ranks
        if size == 1:  # no remote edges: nothing to pair or send
            return
        self.send_order = np.argsort(plan.remote_pe, kind="stable")
        self.send_counts = np.bincount(plan.remote_pe, minlength=size).astype(np.int64)
        # the transposed remote edges of peer q are forward remote edges on their owner
        self.recv_counts = np.bincount(t.remote_pe, minlength=size).astype(np.int64)
        keys = np.empty(int(self.recv_counts.sum()), np.int64)
        comm.alltoallv(fr[self.send_order], self.send_counts, keys, self.recv_counts)
        self.remote = _pairing(keys, tr, "remote")

    def __call__(self, local, remote):
        """Collective: (local [El, ...], remote [Er, ...]) -> the transposed plan's pair,
        numpy for numpy, cupy for cupy: only the remote values cross the host (for MPI)."""
        xp = array_module(local)
        local = xp.ascontiguousarray(local[_on(self, xp, "local")])
        if self.plan.num_ranks == 1:  # nor an upload, which a captured step (one PE) can't hold
            return local, xp.empty((0, *remote.shape[1:]), remote.dtype)
        recv = np.empty((int(self.recv_counts.sum()), *remote.shape[1:]), remote.dtype)
        send = to_host(remote[_on(self, xp, "send_order")])
        self.comm.alltoallv(np.ascontiguousarray(send), self.send_counts, recv, self.recv_counts)
        return local, xp.asarray(recv)[_on(self, xp, "remote")]


def _on(obj, xp, name: str):
    """obj's host index array ``name`` on xp's device (uploaded once, then kept)."""
    return held(obj._device, name, xp, lambda: (getattr(obj, name),))[0]


def _pairing(source_keys: np.ndarray, target_keys: np.ndarray, what: str) -> np.ndarray:
    """index [T]: target i takes source index[i], matching equal keys in order."""
    if source_keys.size != target_keys.size:
        raise RuntimeError(
            f"the transposed plan has {target_keys.size} {what} edges, the forward plan "
            f"{source_keys.size}: the plans are of different graphs"
        )
    so = np.argsort(source_keys, kind="stable")
    to = np.argsort(target_keys, kind="stable")
    if not np.array_equal(source_keys[so], target_keys[to]):
        raise RuntimeError(f"the {what} edges of the transposed plan are not the forward's")
    index = np.empty(target_keys.size, np.int64)
    index[to] = so
    return index
