"""The CUDA aggregation kernel: aggregate.cu, a thin CuPy launcher and the occupancy
model it launches by (occupancy.py).

cupy is imported lazily: this module imports (and its host-side logic runs) without a
GPU. Compiled modules are cached per (device, weighted, remote mode, width class, row
dtype): a model's few widths (input, hidden, classes) make a few compiles.

Rows are float32, or bfloat16 held as their bits in uint16 arrays (cupy has no bf16;
mgg.precision.storage): the launchers pick the variant from the array's dtype.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...knobs import DEFAULTS, REMOTES
from ...partition.plan import PartitionPlan
from ...precision import BF16, bits, holds_bf16, row_dtype, storage
from .. import checks as check
from ..reference import check_edge_weights, edge_weight_heads
from .occupancy import FLOAT_BYTES, WARP, Device, Workload, estimate, live_gpu, width_class

SOURCE = Path(__file__).with_name("aggregate.cu")


def nvshmem_home() -> str | None:
    """Where NVSHMEM's include/ and lib/ are: $NVSHMEM_HOME, or the nvidia-nvshmem wheel."""
    if os.environ.get("NVSHMEM_HOME"):
        return os.environ["NVSHMEM_HOME"]
    try:
        import nvidia.nvshmem as pkg  # the nvidia-nvshmem-cu13 wheel

        return str(Path(next(iter(pkg.__path__))))
    except ImportError:
        return None


GENERIC = (1, 0)  # the width class of the kernel that takes any D: scalar lanes, slabs
# MGG_WEIGHTED of the variant that computes GCN's weights from the plan's norm and
# halo_norm (D^-1/2 of its rows and of its halo's): no weight per edge held
NORMS = 2


def compile_options(
    weighted: int, mode: str, cls: tuple[int, int] = GENERIC, bf16: bool = False
) -> tuple[str, ...]:
    """nvcc/NVRTC options for one kernel variant; weighted: 0, 1 (edge weights) or NORMS
    (local weights from the plan's norm); cls: its (vec, W) as width_class gives (for the
    rows' element size); bf16: bfloat16 rows (compute capability 8.0 and up)."""
    if mode not in REMOTES:
        raise ValueError(f"remote mode must be one of {', '.join(REMOTES)}, got {mode!r}")
    opts = (
        "-std=c++17",
        f"-DMGG_WEIGHTED={int(weighted)}",
        f"-DMGG_REMOTE_GET={int(mode == 'get')}",
        f"-DMGG_BF16={int(bf16)}",
        f"-DMGG_VEC={cls[0]}",
        f"-DMGG_WIDTH={cls[1]}",
    )
    if mode == "get":
        home = nvshmem_home()
        if home is None:
            raise RuntimeError(
                "the get mode compiles against NVSHMEM: install "
                "nvidia-nvshmem-cu13 or set NVSHMEM_HOME"
            )
        opts += ("-dc", f"-I{home}/include", f"-L{home}/lib", "-lnvshmem_device")
    return opts


def load_module(
    device_id: int,
    weighted: int,
    mode: str,
    cls: tuple[int, int] = GENERIC,
    bf16: bool = False,
):
    """The compiled RawModule for this device and variant (compiled once per process); a
    get-mode module is registered with NVSHMEM, which must be initialized by then."""
    mod = _compiled(device_id, weighted, mode, cls, bool(bf16))
    if mode == "get":
        from ...comm.nvshmem import register_module

        register_module(mod)
    return mod


@functools.cache
def _compiled(device_id: int, weighted: int, mode: str, cls: tuple[int, int], bf16: bool):
    import cupy

    backend = "nvcc" if mode == "get" else "nvrtc"  # the get mode links libnvshmem_device
    with cupy.cuda.Device(device_id):
        mod = cupy.RawModule(
            code=SOURCE.read_text(),
            options=compile_options(weighted, mode, cls, bf16),
            backend=backend,
        )
        mod.get_function("mgg_aggregate")  # compile now
        return mod


@dataclass(frozen=True)
class LaunchConfig:
    """Grid, block and dynamic shared memory of one launch, from (ps, dist, wpb, D) and
    the rows' element size (itemsize: 4 float32, 2 bfloat16)."""

    ps: int
    dist: int
    wpb: int
    dim: int
    mode: str
    warps: int
    blocks: int
    threads: int
    smem: int
    itemsize: int = FLOAT_BYTES


def launch_config(
    ps: int,
    dist: int,
    wpb: int,
    dim: int,
    n_lnp: int,
    n_rnp: int,
    device: Device,
    mode: str = "p2p",
    itemsize: int = FLOAT_BYTES,
) -> LaunchConfig:
    """§3.4's host code: numWarps = max(#LNP, #RNP)/dist, grid = numWarps/wpb blocks of
    wpb warps, shared memory as the kernel lays it out. Rejects what the device cannot
    run, naming the limit, with the tuner's own model (one formula for both)."""
    work = Workload(n_lnp * ps, n_rnp * ps, 0, dim, 0, itemsize)
    est = estimate(ps, dist, wpb, work, device, mode)
    if not est.feasible:
        raise ValueError(
            f"invalid configuration ps={ps}, dist={dist}, wpb={wpb}, D={dim} "
            f"on {device.name}: {est.reason}"
        )
    warps = max(1, -(-max(n_lnp, n_rnp) // dist))
    blocks = max(1, -(-warps // wpb))
    return LaunchConfig(ps, dist, wpb, dim, mode, warps, blocks, wpb * WARP, est.smem, itemsize)


def row_storage(dtype, dev: Device, device_id: int) -> np.dtype:
    """The dtype the CUDA designs hold rows of ``dtype`` in on GPU ``device_id`` (``dev``,
    its limits): float32, or uint16 for bfloat16 (its bits). ValueError for any other
    dtype; InputError for bfloat16 on a GPU below compute capability 8.0."""
    d = row_dtype(dtype)
    if d == np.float32:
        return d
    if d != BF16:
        raise ValueError(f"the CUDA kernel aggregates float32 or bfloat16 rows, not {d}")
    if dev.cc is not None and tuple(dev.cc) < (8, 0):
        raise InputError(
            f"dtype bfloat16 needs a GPU of compute capability 8.0 or newer, but GPU "
            f"{device_id} ({dev.name}) has {dev.cc[0]}.{dev.cc[1]}: use --dtype float32"
        )
    return storage(d)


def exclusive_flags(part_node: np.ndarray, other_node: np.ndarray, n: int, dist: int):
    """uint8 [K]: 1 where the node of partition k is touched by no other warp (warp w owns
    partitions w*dist..w*dist+dist-1 of both kinds), so its sums need no atomics."""
    lo = np.full(n, np.iinfo(np.int64).max, np.int64)
    hi = np.full(n, -1, np.int64)
    for nodes in (part_node, other_node):
        if nodes.size == 0:
            continue
        v = np.arange(n)
        first = np.searchsorted(nodes, v, "left")
        last = np.searchsorted(nodes, v, "right") - 1
        has = last >= first
        lo[has] = np.minimum(lo[has], first[has] // dist)
        hi[has] = np.maximum(hi[has], last[has] // dist)
    excl = lo == hi
    return excl[part_node].astype(np.uint8)


@dataclass(frozen=True)
class Launch:
    """One launch's share of a plan: destination rows [a, b), and the neighbor partitions
    of those rows, LNPs [l0, l1) and RNPs [r0, r1) (the lists are sorted by node)."""

    a: int
    b: int
    l0: int
    l1: int
    r0: int
    r1: int


def launches(plan: PartitionPlan, rows: int | None = None) -> list[Launch]:
    """The plan's destination rows cut into launches of at most ``rows`` rows each (None:
    one launch of every row): what bf16's float32 sums of one launch hold."""
    n = plan.num_local_nodes
    step = max(int(rows), 1) if rows else max(n, 1)
    cuts = np.append(np.arange(0, n, step), n) if n else np.array([0, 0])
    ls = np.searchsorted(plan.lnp_node, cuts)
    rs = np.searchsorted(plan.rnp_node, cuts)
    return [
        Launch(*(int(v) for v in (cuts[i], cuts[i + 1], ls[i], ls[i + 1], rs[i], rs[i + 1])))
        for i in range(cuts.size - 1)
    ]


class DevicePlan:
    """A PartitionPlan's arrays on the GPU, cut into ``launches`` of at most ``rows``
    destination rows each (None: one), with each launch's exclusivity flags for one dist
    (warp w of a launch takes its partitions w*dist.. of both kinds) and, made once,
    ``views``: its LNP, RNP and in-degree arrays (ptr, node, excl; ptr, node, excl;
    local_indptr, remote_indptr), from its first partition and row. A plan whose weights
    factor (``plan.norm``) holds its norm [n], halo_norm [H] and remote_slot [Er]
    instead of its weights [El], [Er]."""

    def __init__(self, plan: PartitionPlan, dist: int, rows: int | None = None):
        import cupy

        self.plan, self.dist = plan, dist
        self.launches = launches(plan, rows)
        self.rows = max(x.b - x.a for x in self.launches)  # the most one launch sums
        up = cupy.asarray
        self.lnp_ptr, self.lnp_node = up(plan.lnp_ptr), up(plan.lnp_node)
        self.rnp_ptr, self.rnp_node = up(plan.rnp_ptr), up(plan.rnp_node)
        self.local_idx = up(plan.local_indices)
        self.remote_pe = up(plan.remote_pe.astype(np.int32))
        self.remote_row = up(plan.remote_row.astype(np.int32))
        self.local_w = self.remote_w = self.norm = self.halo_norm = self.remote_slot = None
        if plan.norm is not None:
            self.norm, self.halo_norm = up(plan.norm), up(plan.halo_norm)
            self.remote_slot = up(plan.remote_slot.astype(np.int32))
        elif plan.has_weights:
            self.local_w, self.remote_w = up(plan.local_weights), up(plan.remote_weights)
        self.local_indptr, self.remote_indptr = up(plan.local_indptr), up(plan.remote_indptr)
        lnp_excl = np.zeros(plan.lnp_node.size, np.uint8)
        rnp_excl = np.zeros(plan.rnp_node.size, np.uint8)
        for x in self.launches:
            ln, rn = plan.lnp_node[x.l0 : x.l1] - x.a, plan.rnp_node[x.r0 : x.r1] - x.a
            lnp_excl[x.l0 : x.l1] = exclusive_flags(ln, rn, x.b - x.a, dist)
            rnp_excl[x.r0 : x.r1] = exclusive_flags(rn, ln, x.b - x.a, dist)
        self.lnp_excl, self.rnp_excl = up(lnp_excl), up(rnp_excl)
        lnp = (self.lnp_ptr, self.lnp_node, self.lnp_excl)
        rnp = (self.rnp_ptr, self.rnp_node, self.rnp_excl)
        degrees = (self.local_indptr, self.remote_indptr)
        one = len(self.launches) == 1  # then the arrays themselves

        def cut(arrays, start):
            return arrays if one else tuple(a[start:] for a in arrays)

        self.views = [(cut(lnp, x.l0), cut(rnp, x.r0), cut(degrees, x.a)) for x in self.launches]


def run(
    dplan: DevicePlan,
    x,
    peer_ptrs,
    out,
    op: str,
    eps: float,
    cfg: LaunchConfig,
    device_id: int,
    stream=None,
    parts: str = "both",
    weights=None,
    acc=None,
) -> None:
    """Launch init, the MGG kernel and (for mean) finalize on this PE's rows; for bf16
    rows, mgg_round last instead (the one rounding, mean's division before it). Each of
    dplan's launches (a range of destination rows) runs the three in turn.

    x [>= n, D] float32, or uint16: bfloat16 rows (this PE's rows; in the symmetric heap
      for the get mode)
    peer_ptrs uint64 [P] base address of every PE's rows (p2p mode)
    out [n, D] of x's dtype
    acc: bfloat16 rows only: float32 [>= dplan.rows * D], C-contiguous, the caller's
    (nothing is allocated per launch): a launch sums its rows into it, mgg_round rounds
    them once into out (mean: divided by the in-degree first)
    parts: 'both' interleaves LNPs and RNPs in one launch (MGG); 'local' / 'remote' run
    one kind only (init with 'local', finalize with 'remote'): two launches make the
    "no interleaving" ablation, of a dplan in one launch.
    weights: per-call edge weights, a pair of C-contiguous float32 cupy arrays (local
    [El] or [El, H], remote [Er] or [Er, H]) in the plan's edge order, as
    mgg.kernels.reference.check_edge_weights returns them; op must be 'sum' (a weighted
    sum: column j of the output takes w[e, j // (D / H)]).
    """
    if parts not in ("both", "local", "remote"):
        raise ValueError(f"parts must be 'both', 'local' or 'remote', got {parts!r}")
    if parts != "both" and len(dplan.launches) > 1:
        raise ValueError(f"parts={parts!r} runs a plan in one launch, not {len(dplan.launches)}")
    d, n_all = cfg.dim, dplan.plan.num_local_nodes
    for name, a in (("x", x), ("out", out)):
        check.rows2d(a, "run", name)
        if a.shape[0] < n_all or a.shape[1] != d:
            raise InputError(
                f"run: {name} must be [>= {n_all}, {d}] (the plan's rows, the config's width), "
                f"got {tuple(a.shape)}"
            )
    bf16 = holds_bf16(out)
    if x.dtype != out.dtype or out.dtype not in (np.float32, np.uint16):
        raise ValueError(
            f"x and out hold {x.dtype} and {out.dtype} rows: both float32, or both uint16 "
            "(bfloat16 bits)"
        )
    if cfg.itemsize != out.dtype.itemsize:
        raise ValueError(
            f"the launch config is for {cfg.itemsize}-byte rows, not {out.dtype.itemsize}"
        )
    if bf16 and (acc is None or acc.dtype != np.float32 or acc.size < dplan.rows * d):
        raise ValueError(
            f"bfloat16 rows sum into a float32 accumulator: pass acc [>= {dplan.rows * d}]"
        )
    heads = 1
    if weights is not None:
        if op != "sum":
            raise ValueError(f"edge weights given with the call make a weighted sum, not {op!r}")
        heads = edge_weight_heads(dplan.plan, weights, d)
        (local_w, remote_w), weighted = weights, 1
    elif op == "gcn" and dplan.norm is not None:
        local_w, remote_w, weighted = dplan.norm, dplan.halo_norm, NORMS
    elif op == "gcn":
        local_w, remote_w, weighted = dplan.local_w, dplan.remote_w, 1
    else:
        local_w = remote_w = None
        weighted = 0
    mod = load_module(device_id, weighted, cfg.mode, width_class(d, heads, cfg.itemsize), bf16=bf16)
    i64, i32, f32 = np.int64, np.int32, np.float32
    null = np.uint64(0)  # no weights: a null pointer, nothing allocated per launch
    threads = 256
    one = len(dplan.launches) == 1  # no views made per call
    for part, (lnp, rnp, degrees) in zip(dplan.launches, dplan.views, strict=True):
        a, b = part.a, part.b
        n = b - a
        rows_x, rows_out = (x, out) if one else (x[a:b], out[a:b])
        blocks = max(1, min(65535, -(-n * d // threads)))
        sums = acc if bf16 else rows_out  # what init and the kernel write: rows a..b
        if parts in ("both", "local"):
            scale = f32(1.0 + eps) if op == "gin" else f32(0.0)
            mod.get_function("mgg_init")(
                (blocks,), (threads,), (rows_x, sums, i64(n * d), scale), stream=stream
            )
        n_lnp = part.l1 - part.l0 if parts in ("both", "local") else 0
        n_rnp = part.r1 - part.r0 if parts in ("both", "remote") else 0
        if n_lnp or n_rnp:
            args = [
                x,
                *lnp,
                i64(n_lnp),
                dplan.local_idx,
                local_w if weighted else null,
                *rnp,
                i64(n_rnp),
                dplan.remote_pe,
                dplan.remote_row,
                remote_w if weighted else null,
                dplan.remote_slot if weighted == NORMS else null,
                peer_ptrs,
                sums,
                i32(a),
                i32(d),
                i32(cfg.dist),
            ]
            if cfg.mode == "get":
                args.append(i32(cfg.ps))
            args.append(i32(heads))  # last in both variants (read by the weighted one)
            kernel = mod.get_function("mgg_aggregate")
            if cfg.smem > 48 * 1024:
                kernel.max_dynamic_shared_memory_size = cfg.smem
            grid = max(1, -(-max(1, -(-max(n_lnp, n_rnp) // cfg.dist)) // cfg.wpb))
            kernel((grid,), (cfg.threads,), tuple(args), shared_mem=cfg.smem, stream=stream)
        degrees = (*degrees, i64(n), i32(d))
        if bf16 and parts in ("both", "remote"):
            mod.get_function("mgg_round")(
                (blocks,),
                (threads,),
                (acc, rows_out, *degrees, i32(op == "mean")),
                stream=stream,
            )
        elif op == "mean" and parts in ("both", "remote"):
            mod.get_function("mgg_finalize_mean")(
                (blocks,), (threads,), (rows_out, *degrees), stream=stream
            )


_SUMS: dict[int, list] = {}  # device id -> its float32 sums, the largest last


def shared_sums(device_id: int, size: int):
    """float32 [>= size]: the sums every bf16 launch of this process on this device
    shares (launches run in one stream's order; each rounds its sums into its own out).
    A larger size adds a larger buffer and keeps the smaller ones, which a captured step
    may have baked in: so each size is allocated once, and never per launch."""
    import cupy

    held = _SUMS.setdefault(device_id, [])
    if not held or held[-1].size < size:
        held.append(cupy.empty(max(int(size), 1), cupy.float32))
    return held[-1]


def current_device() -> tuple[int, Device]:
    """(id, limits) of the current GPU, queried live."""
    import cupy

    dev_id = cupy.cuda.Device().id
    return dev_id, live_gpu(dev_id)


def aggregate_halo(
    plan: PartitionPlan,
    x,
    halo,
    op: str,
    eps: float = 0.0,
    *,
    dist: int = DEFAULTS.dist,
    wpb: int = DEFAULTS.wpb,
    out=None,
    weights=None,
    rows: int | None = None,
):
    """One rank's aggregation on the GPU with the remote rows given by the caller, as the
    CPU kernel takes them: the halo [H, D] becomes a pseudo-peer the kernel reads through
    the pointer table. x, halo: numpy or cupy, float32 (anything else is converted), or
    bfloat16 (ml_dtypes' numpy dtype, or uint16 bits): then both bf16, out uint16 bits;
    returns cupy [n, D].
    weights: per-call edge weights (local [El(, H)], remote [Er(, H)]; numpy or cupy) for
    a weighted sum, as mgg.kernels.aggregate takes them (float32, whatever the rows).
    rows: launches of at most this many destination rows (DevicePlan; None: one)."""
    import cupy

    check.rows2d(x, "aggregate_halo", "x")
    n, d = plan.num_local_nodes, x.shape[1]
    check.need(
        x.shape[0] >= n, "aggregate_halo", lambda: f"x must be [>= {n}, D], got {tuple(x.shape)}"
    )
    if halo is not None:
        check.rows2d(halo, "aggregate_halo", "halo")
        check.need(
            halo.shape[0] >= plan.num_halo and halo.shape[1] == d,
            "aggregate_halo",
            lambda: f"halo must be [{plan.num_halo}, {d}], got {tuple(halo.shape)}",
        )
    dev_id, dev = current_device()
    if weights is not None:
        if isinstance(weights, tuple | list):  # uploaded first: cupy's ascontiguousarray
            weights = [cupy.asarray(w) for w in weights]  # takes cupy arrays only
        weights = check_edge_weights(plan, weights, d, cupy)
    bf16 = holds_bf16(x)
    held = np.dtype(np.uint16 if bf16 else np.float32)  # the rows' storage on the device
    if halo is None:
        halo = np.zeros((1, d), held)
    if holds_bf16(halo) != bf16:
        raise ValueError(f"x holds {x.dtype} rows but the halo {halo.dtype}: give both in one")
    xd, hd = (cupy.ascontiguousarray(cupy.asarray(bits(a), held)) for a in (x, halo))
    dp = DevicePlan(plan, dist, rows)
    dp.remote_pe = cupy.zeros(plan.num_remote_edges, cupy.int32)
    dp.remote_row = cupy.asarray(plan.remote_slot.astype(np.int32))
    peers = cupy.asarray(np.array([hd.data.ptr], np.uint64))
    cfg = launch_config(
        plan.ps, dist, wpb, d, plan.lnp_node.size, plan.rnp_node.size, dev, itemsize=held.itemsize
    )
    out = cupy.empty((n, d), held) if out is None else out
    acc = cupy.empty(max(dp.rows * d, 1), cupy.float32) if bf16 else None
    run(dp, xd, peers, out, op, eps, cfg, dev_id, weights=weights, acc=acc)
    return out
