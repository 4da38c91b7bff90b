"""P virtual PEs in one process on one GPU: MGG and the designs it beat, on equal
hardware. The remote path of the kernel runs for real (peers are other rows of device
memory, read through a table of base pointers) without several processes or NVSHMEM.

The input ``x`` is the whole [N, D] matrix, PE r's rows at [lb_r, ub_r); a call runs every
PE's aggregation, one after another, and returns the whole [N, D] output.

  pipelined      MGG: ps-sized partitions, dist interleaving, peers read by pointer (p2p)
  direct         MGG's "direct NVSHMEM": one partition per node, no interleaving, a
                 remote read per edge
  uvm            MGG's kernel over managed memory whose remote rows sit in host memory:
                 each PE's own rows prefer the GPU, the rest the host, so every remote
                 read crosses the host interconnect (where rows live, not the kernel)
  uvm_hbm        direct's per-edge reads over managed memory with every row resident in
                 HBM (UVM with every page on the GPU): against pipelined, the pipelining
  dgcl           DGCL-style: per PE, one gather kernel copies its whole halo (each needed
                 remote row once, from every peer) into a staging buffer, then the kernel
                 over local memory only
  no_interleave  the ablation of Fig. 9: LNPs and RNPs in two separate launches

Rows are float32 or bfloat16 (every row array, staging and managed memory included, holds
uint16 bits; each PE sums into one float32 accumulator that its last launch rounds).
"""

from __future__ import annotations

import mmap
import time

import numpy as np

from ..kernels.cuda import DevicePlan, current_device, launch_config, row_storage, run
from ..kernels.cuda.nn_ops import gather_rows
from ..knobs import DEFAULTS
from ..partition.plan import PartitionPlan
from ..precision import is_bf16
from .base import Design


class VirtualPipelined(Design):
    """plans: all P PartitionPlans; comm: None (one process holds every PE); knobs: ps
    (re-cut the plans), dist, wpb. The baselines below subclass it and change where rows
    live (``prepare``) and how they arrive (``run_pe``)."""

    name = "pipelined"
    knobs = ("ps", "dist", "wpb")
    edge_weights_ok = False  # a benchmark of the paper's designs: gcn/sum/mean/gin
    stores_rounded = True  # bf16: the kernel rounds its float32 sums into out itself

    def __init__(
        self,
        plans: list[PartitionPlan],
        comm,
        dim: int,
        dtype=np.float32,
        *,
        ps: int | None = None,
        dist: int = DEFAULTS.dist,
        wpb: int = DEFAULTS.wpb,
    ):
        if comm is not None:
            raise ValueError("virtual PEs share one process: pass comm=None")
        self.dev_id, self.dev = current_device()
        self.held = row_storage(dtype, self.dev, self.dev_id)  # what row arrays hold
        import cupy

        self.cupy = cupy
        self.plans = [p.with_ps(ps) if ps else p for p in plans]
        super().__init__(self.plans, None, dim, dtype)
        self.dist, self.wpb = int(dist), int(wpb)
        self.bounds = self.plans[0].bounds
        t0 = time.perf_counter()
        self.prepare()
        cupy.cuda.Device().synchronize()
        self.setup_seconds = time.perf_counter() - t0

    @property
    def rows(self) -> int:
        return int(self.bounds[-1])

    @property
    def weighted(self) -> bool:
        return self.plans[0].has_weights

    @property
    def xp(self):
        return self.cupy

    def prepare(self) -> None:
        """Allocate x (``allocate``), the per-PE device plans and launch configs, and for
        bf16 rows the float32 accumulator the PEs take in turn."""
        whole = self.allocate()
        self.x = whole[: self.rows]
        self.peers = self.peer_table(whole.data.ptr)
        self.dplans = [DevicePlan(p, self.dist) for p in self.plans]
        self.cfgs = [
            launch_config(
                p.ps,
                self.dist,
                self.wpb,
                self.dim,
                p.lnp_node.size,
                p.rnp_node.size,
                self.dev,
                itemsize=self.dtype.itemsize,
            )
            for p in self.plans
        ]
        widest = max(p.num_local_nodes for p in self.plans) * self.dim
        self.acc = self.cupy.empty(max(widest, 1), np.float32) if is_bf16(self.dtype) else None

    @property
    def row_bytes(self) -> int:
        return self.dim * self.dtype.itemsize

    def allocate(self):
        """The device array [max(N, 1), D] that x is the first N rows of."""
        return self.cupy.zeros((max(self.rows, 1), self.dim), self.held)

    def peer_table(self, base: int, extra=()):
        """uint64 [P + len(extra)]: each PE's first row in the array at ``base``."""
        ptrs = [base + int(b) * self.row_bytes for b in self.bounds[:-1]] + list(extra)
        return self.cupy.asarray(np.array(ptrs, np.uint64))

    def pe_rows(self, r: int):
        """PE r's rows of x [n_r, D]."""
        return self.x[int(self.bounds[r]) : int(self.bounds[r + 1])]

    def run(self, op, eps, out):
        for r, (p, dp, cfg) in enumerate(zip(self.plans, self.dplans, self.cfgs, strict=True)):
            self.run_pe(r, dp, cfg, out[p.lb : p.ub], op, eps)
            self.count(p.num_remote_edges)

    def run_pe(self, r, dp, cfg, out, op, eps) -> None:
        run(dp, self.pe_rows(r), self.peers, out, op, eps, cfg, self.dev_id, acc=self.acc)


class VirtualDirect(VirtualPipelined):
    """No neighbor partitioning (a partition is a node's whole neighbor list), no
    interleaving (dist = 1): every remote edge is one read of a peer's row."""

    name = "direct"
    knobs = ("wpb",)

    def __init__(self, plans, comm, dim, dtype=np.float32, *, wpb=DEFAULTS.wpb):
        widest = max(p.widest_row for p in plans)
        super().__init__(plans, comm, dim, dtype, ps=max(1, widest), dist=1, wpb=wpb)


class VirtualDGCL(VirtualPipelined):
    """DGCL-style: a PE first receives its whole halo, then computes over local memory.
    On one GPU the exchange is one gather kernel per PE (every peer's rows at once, each
    needed row once, as DGCL batches each peer pair's rows into one transfer) into a
    staging buffer, which the kernel reads as a pseudo-peer P; no host loop over peers."""

    name = "dgcl"

    def prepare(self) -> None:
        super().prepare()
        cp = self.cupy
        self.halo = []  # per PE: (global rows of its halo [H], staging [H, D], peer table)
        for p, dp in zip(self.plans, self.dplans, strict=True):
            staging = cp.zeros((max(1, p.num_halo), self.dim), self.held)
            # remote edges read staging slots, through the pseudo-peer P
            dp.remote_pe = cp.full(p.num_remote_edges, len(self.plans), cp.int32)
            dp.remote_row = cp.asarray(p.remote_slot.astype(np.int32))
            peers = self.peer_table(self.x.data.ptr, [staging.data.ptr])
            self.halo.append((cp.asarray(p.halo_nodes), staging, peers))

    def run_pe(self, r, dp, cfg, out, op, eps) -> None:
        src, staging, peers = self.halo[r]
        gather_rows(self.x, src, staging)  # the bulk exchange
        run(dp, self.pe_rows(r), peers, out, op, eps, cfg, self.dev_id, acc=self.acc)


CPU_DEVICE_ID = -1  # cudaCpuDeviceId: what a range preferring the host reads back as
PAGE = mmap.PAGESIZE


def advise_rows(rt, base: int, row_bytes: int, ranges, device_id: int) -> dict:
    """Managed rows [a, b) of each (a, b, where) in ``ranges`` preferred on (and prefetched
    to) ``where`` ('host' or a device id), all accessed by GPU ``device_id``; then the
    preferred location read back, so that advice refused shows. rt: cuda.bindings.runtime
    (CUDA 13 takes a cudaMemLocation, which CuPy's memAdvise cannot say 'host' with).
    Returns {"verified", "detail"}."""
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

    ranges = [(int(a), int(b), where) for a, b, where in ranges if b > a]
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


def place_rows(rt, base: int, row_bytes: int, bounds, r: int, device_id: int) -> dict:
    """UVM's placement while PE r runs (advise_rows): its rows [lb, ub) on the GPU, every
    other row on the host."""
    lb, ub, n = int(bounds[r]), int(bounds[r + 1]), int(bounds[-1])
    ranges = ((0, lb, "host"), (lb, ub, device_id), (ub, n, "host"))
    return advise_rows(rt, base, row_bytes, ranges, device_id)


def managed_array(cp, rows: int, dim: int, dtype=np.float32):
    """A [max(rows, 1), D] array of ``dtype`` (float32, or uint16: bf16 bits) in managed
    memory; MemoryError if the GPU could not hold it."""
    dtype = np.dtype(dtype)
    nbytes = max(rows, 1) * dim * dtype.itemsize
    free, _ = cp.cuda.runtime.memGetInfo()
    if nbytes > 0.9 * free:
        raise MemoryError(
            f"UVM needs {nbytes / 2**30:.1f} GiB of managed memory but "
            f"the GPU has {free / 2**30:.1f} GiB free"
        )
    mem = cp.cuda.ManagedMemory(nbytes)
    return cp.ndarray((max(rows, 1), dim), dtype, cp.cuda.MemoryPointer(mem, 0))


def runtime_bindings():
    """(cuda.bindings.runtime, the advice so far): (None, not verified and why) where the
    bindings do not import, so no placement can be made or checked."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError as e:
        return None, {"verified": False, "detail": f"cuda.bindings unavailable: {e}"}
    return rt, {"verified": True, "detail": "as advised"}


class VirtualUVM(VirtualPipelined):
    """MGG's kernel (ps, dist, wpb as pipelined) over one managed array whose remote rows
    live in host memory. Before PE r runs (inside the call, so timed), its rows are
    advised to the GPU and prefetched there, every other row advised to the host and
    prefetched back: each call moves every PE's rows to HBM and back, and every remote
    read crosses the host interconnect (PCIe). Against pipelined it measures where the
    remote rows live, not the kernel. ``advice`` records whether the placement was
    verified on every PE (when it is not, every row may sit on the GPU and the design
    measures nothing of UVM)."""

    name = "uvm"

    def allocate(self):
        whole = managed_array(self.cupy, self.rows, self.dim, self.held)
        self._base = whole.data.ptr
        self._rt, self.advice = runtime_bindings()  # advice: until a PE's is not verified
        return whole

    def run_pe(self, r, dp, cfg, out, op, eps) -> None:
        if self._rt is not None:
            got = place_rows(self._rt, self._base, self.row_bytes, self.bounds, r, self.dev_id)
            if self.advice["verified"] and not got["verified"]:
                self.advice = {"verified": False, "detail": f"PE {r}: {got['detail']}"}
        super().run_pe(r, dp, cfg, out, op, eps)


class VirtualUVMHBM(VirtualDirect):
    """UVM with every page resident: one managed array, every row preferred on, accessed
    by and prefetched to this GPU once at setup, so remote rows sit in the same HBM as
    MGG's; read per edge as a UVM kernel reads them (direct's pattern: a partition is a
    node's neighbor list, no interleaving). Against pipelined it measures MGG's
    pipelining alone; against direct, what managed memory itself costs. ``advice`` as
    uvm's (the placement read back)."""

    name = "uvm_hbm"

    def allocate(self):
        whole = managed_array(self.cupy, self.rows, self.dim, self.held)
        rt, self.advice = runtime_bindings()
        if rt is not None:
            everything = ((0, self.rows, self.dev_id),)
            self.advice = advise_rows(rt, whole.data.ptr, self.row_bytes, everything, self.dev_id)
        return whole


class VirtualNoInterleave(VirtualPipelined):
    """MGG without interleaving (Fig. 9): all LNPs in one launch, then all RNPs in a
    second, so local and remote work no longer share the SMs."""

    name = "no_interleave"

    def run_pe(self, r, dp, cfg, out, op, eps) -> None:
        for parts in ("local", "remote"):  # bf16: one accumulator through both launches
            rows = self.pe_rows(r)
            run(dp, rows, self.peers, out, op, eps, cfg, self.dev_id, parts=parts, acc=self.acc)
