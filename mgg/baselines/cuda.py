"""The designs MGG beat, on one GPU with P virtual PEs (one process).

Every PE's rows live in their own device buffer (MGG, direct, DGCL-style) or in one
managed array (UVM); the designs run one PE after another on the same GPU, so their
times compare designs on equal hardware. All produce the scipy oracle's output.

  pipelined  MGG: ps-sized partitions, dist interleaving, peers read by pointer (p2p)
  direct     MGG's "direct NVSHMEM": one partition per node, no interleaving, a remote
             read per edge
  uvm        rows in unified (managed) memory; each PE's own rows prefer the GPU, the
             rest prefer the host, so remote reads fault pages over the interconnect
  dgcl       DGCL-style: a host-initiated bulk gather of the halo into a staging
             buffer, then a kernel over local memory only
  no_interleave  the ablation of Fig. 9: LNPs and RNPs in two separate launches
"""

from __future__ import annotations

import mmap

import numpy as np

from ..kernels.cuda import DevicePlan, run
from ..kernels.cuda.virtual import VirtualDesign


class Direct(VirtualDesign):
    """No neighbor partitioning (a partition is a node's whole neighbor list), no
    interleaving (dist = 1): every remote edge is one read of a peer's row."""

    name = "direct"

    def __init__(self, plans, dim, *, ps=None, dist=1, wpb=4):
        widest = max(
            int(
                max(np.diff(p.local_indptr).max(initial=0), np.diff(p.remote_indptr).max(initial=0))
            )
            for p in plans
        )
        super().__init__(plans, dim, ps=max(1, widest), dist=1, wpb=wpb)


class DGCL(VirtualDesign):
    """Bulk gather of every needed remote row (each once) into a staging buffer by
    host-initiated copies, then the kernel reads only local memory."""

    name = "dgcl"

    def prepare(self) -> None:
        super().prepare()
        cp = self.cupy
        self.halo = []  # per PE: ([(peer, staging slots, peer rows)], staging, peer table)
        for p, dp in zip(self.plans, self.dplans, strict=True):
            pes = p.halo_pe
            groups = [
                (
                    int(pe),
                    cp.asarray(np.flatnonzero(pes == pe)),
                    cp.asarray(p.halo_row[pes == pe].astype(np.int64)),
                )
                for pe in np.unique(pes)
            ]
            staging = cp.zeros((max(1, p.num_halo), self.dim), cp.float32)
            # remote edges read staging slots, through a pseudo-peer P
            dp.remote_pe = cp.full(p.num_remote_edges, len(self.plans), cp.int32)
            dp.remote_row = cp.asarray(p.remote_slot.astype(np.int32))
            peers = cp.asarray(
                np.array([b.data.ptr for b in self.bufs] + [staging.data.ptr], np.uint64)
            )
            self.halo.append((groups, staging, peers))

    def _run_pe(self, r, p, dp, cfg, out, op, eps) -> None:
        groups, staging, peers = self.halo[r]
        for pe, slots, rows in groups:  # the bulk exchange: one gather per peer
            staging[slots] = self.bufs[pe][rows]
        run(dp, self.bufs[r], peers, out, op, eps, cfg, self.dev_id)


CPU_DEVICE_ID = -1  # cudaCpuDeviceId: what a range preferring the host reads back as
PAGE = mmap.PAGESIZE


def place_rows(rt, base: int, row_bytes: int, bounds, r: int, device_id: int) -> dict:
    """Managed rows [lb, ub) of PE r preferred on (and prefetched to) the GPU, every other
    row on the host, all accessed by the GPU; then the preferred location read back, so
    that advice refused shows. rt: cuda.bindings.runtime (CUDA 13 takes a cudaMemLocation,
    which CuPy's memAdvise cannot say 'host' with). Returns {"verified", "detail"}."""
    lb, ub, n = int(bounds[r]), int(bounds[r + 1]), int(bounds[-1])
    kind = rt.cudaMemLocationType
    advise = rt.cudaMemoryAdvise
    problems = []

    def loc(where):
        m = rt.cudaMemLocation()
        m.type = kind.cudaMemLocationTypeHost if where == "host" else kind.cudaMemLocationTypeDevice
        m.id = 0 if where == "host" else device_id
        return m

    def call(what, fn, *args):
        try:
            err, *out = fn(*args)
        except Exception as e:  # noqa: BLE001 - a binding of another CUDA version
            problems.append(f"{what}: {type(e).__name__}: {e}")
            return None
        if err != rt.cudaError_t.cudaSuccess:
            problems.append(f"{what}: {err!r}")
            return None
        return out

    ranges = [
        (a, b, where)
        for a, b, where in ((0, lb, "host"), (lb, ub, device_id), (ub, n, "host"))
        if b > a
    ]
    for a, b, where in ranges:
        ptr, nbytes = base + a * row_bytes, (b - a) * row_bytes
        call(
            "advise preferred",
            rt.cudaMemAdvise,
            ptr,
            nbytes,
            advise.cudaMemAdviseSetPreferredLocation,
            loc(where),
        )
        call(
            "advise accessed-by",
            rt.cudaMemAdvise,
            ptr,
            nbytes,
            advise.cudaMemAdviseSetAccessedBy,
            loc(device_id),
        )
        call("prefetch", rt.cudaMemPrefetchAsync, ptr, nbytes, loc(where), 0, 0)
    attr = rt.cudaMemRangeAttribute.cudaMemRangeAttributePreferredLocation
    for a, b, where in ranges:
        # advice applies to whole CPU pages: read back only the pages no other range shares
        lo = -(-(base + a * row_bytes) // PAGE) * PAGE
        hi = (base + b * row_bytes) // PAGE * PAGE
        if hi <= lo:
            continue
        got = call("read back", rt.cudaMemRangeGetAttribute, 4, attr, lo, hi - lo)
        want = CPU_DEVICE_ID if where == "host" else device_id
        if got is not None and got[0] != want:
            problems.append(f"rows [{a}, {b}) prefer {got[0]!r}, not {want}")
    return {"verified": not problems, "detail": "; ".join(problems) or "as advised"}


class UVM(VirtualDesign):
    """All rows in one managed array; before PE r runs, its rows are advised to the GPU
    and prefetched, every other row advised to the host: remote reads go to host memory.
    ``advice`` records whether the placement was verified on every PE (when it is not,
    every row may sit on the GPU and the design measures nothing of UVM)."""

    name = "uvm"

    def prepare(self) -> None:
        cp = self.cupy
        n = self.plans[0].num_nodes
        nbytes = max(n * self.dim * 4, 4)
        free, _ = cp.cuda.runtime.memGetInfo()
        if nbytes > 0.9 * free:
            raise MemoryError(
                f"UVM needs {nbytes / 2**30:.1f} GiB of managed memory but "
                f"the GPU has {free / 2**30:.1f} GiB free"
            )
        mem = cp.cuda.ManagedMemory(nbytes)
        self.managed = cp.ndarray((max(n, 1), self.dim), cp.float32, cp.cuda.MemoryPointer(mem, 0))
        base = self.managed.data.ptr
        self.bounds = self.plans[0].bounds
        self.peers = cp.asarray(
            np.array([base + int(b) * self.dim * 4 for b in self.bounds[:-1]], np.uint64)
        )
        self.bufs = [self.managed[int(self.bounds[r]) :] for r in range(len(self.plans))]
        self.dplans = [DevicePlan(p, self.dist) for p in self.plans]
        self.cfgs = [self._cfg(p, self.dist) for p in self.plans]
        self.advice = {"verified": True, "detail": "as advised"}  # until a PE's is not
        try:
            from cuda.bindings import runtime as rt
        except ImportError as e:
            rt = None
            self.advice = {"verified": False, "detail": f"cuda.bindings unavailable: {e}"}
        self._rt = rt

    def load(self, x):
        self.managed[: x.shape[0]] = self.cupy.asarray(x, self.cupy.float32)
        self.cupy.cuda.Device().synchronize()

    def _place(self, r) -> None:
        if self._rt is None:
            return
        got = place_rows(self._rt, self.managed.data.ptr, self.dim * 4, self.bounds, r, self.dev_id)
        if self.advice["verified"] and not got["verified"]:
            self.advice = {"verified": False, "detail": f"PE {r}: {got['detail']}"}

    def _run_pe(self, r, p, dp, cfg, out, op, eps) -> None:
        self._place(r)
        run(dp, self.bufs[r], self.peers, out, op, eps, cfg, self.dev_id)


class NoInterleave(VirtualDesign):
    """MGG without interleaving (Fig. 9): all LNPs in one launch, then all RNPs in a
    second, so local and remote work no longer share the SMs."""

    name = "no_interleave"

    def _run_pe(self, r, p, dp, cfg, out, op, eps) -> None:
        for parts in ("local", "remote"):
            run(dp, self.bufs[r], self.peers, out, op, eps, cfg, self.dev_id, parts=parts)


Pipelined = VirtualDesign

GPU_DESIGNS = {d.name: d for d in (Pipelined, Direct, DGCL, UVM, NoInterleave)}


def aggregate_virtual_design(
    name: str, plans, x: np.ndarray, op: str = "sum", *, eps: float = 0.0, **knobs
) -> np.ndarray:
    """The stitched [N, D] output of one design over P virtual PEs."""
    design = GPU_DESIGNS[name](plans, x.shape[1], **knobs)
    design.load(x)
    return design.gather(design.run(op, eps))
