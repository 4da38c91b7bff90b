"""What a rank may allocate, and what a command will, checked before the big allocations.

``available_bytes()``: min(MemAvailable, the cgroup's limit minus its usage) divided by the
ranks on this node (``MGG_LOCAL_SIZE``, set by mggrun), or ``MGG_MEMORY_LIMIT`` (bytes per
rank: ``2G``, ``512M``, ``1.5GiB``) when set. ``require(nbytes, what, source)`` raises
ResourceError naming the input and the numbers when an allocation the input declares
cannot fit. ``estimate(...)`` is a command's peak resident bytes per rank, part by part:
the data, the plan, the activations and the model (parameters, gradients, optimizer
state); calibrated against VmHWM (bench/memory_estimate.py). ``check_job`` checks it
against ``MGG_MEMORY_LIMIT`` (the rank's whole peak) or what the rank has, and ``plan``
against a budget: either fits only within the budget's ``usable`` part, all but its
HEADROOM, the one line every check, fix and streamed chunk is chosen against.

Pure: no comm, torch or numpy at import, so the graph layer imports it (``model_params``
imports torch when it is called).
"""

from __future__ import annotations

import os
import re
from fractions import Fraction

from .errors import InputError, ResourceError
from .knobs import DEFAULTS
from .precision import row_dtype

__all__ = [
    "HEADROOM",
    "LIMIT_ENV",
    "available",
    "available_bytes",
    "budget_for",
    "check_estimate",
    "check_job",
    "csr_bytes",
    "estimate",
    "format_bytes",
    "job_estimate",
    "model_params",
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


# ---- the job estimate -------------------------------------------------------------------
# Calibrated against VmHWM of `mgg train` / `check` / `partition` on planted graphs and
# pubmed, hidden 16 to 4096 (bench/memory_estimate.py): bytes per unit of each part.
BASELINE = 375 * 2**20  # python, numpy, scipy, numba, torch (no torch._dynamo), mpi4py
CHECK_BASELINE = 190 * 2**20  # mgg check's: no torch
LOAD_PER_EDGE = 12  # the generator's or reader's edge arrays and CSR build
JOB_PER_ENTRY = 20  # job_graph (self loops, gcn weights): the new CSR and its build
PLAN_PER_ENTRY = 11  # local + remote CSRs, weights, neighbor partitions (per direction)
# a plan whose weights factor (GCN's of an unweighted graph: its norm and halo_norm)
# holds no weight per edge: this many bytes fewer per entry, on a GPU per local entry (a
# remote one's halo slot takes the weight's place), and on the host of a GPU job (a CPU
# job's kernels read the weights made from the factors)
NORM_SAVES_PER_ENTRY = 4
ACTIVATION_COPIES = 6  # [rows, hidden] tensors a layer holds at the peak (kept, grads, temps)
# [rows, classes] tensors: the last layer's output and its gradient over every row, and
# what the loss and the evaluation take of the labeled rows (float32): 2.4 copies measured
# on papers100m (1% labeled), 5.0 on a planted graph with 1,000 classes (all labeled)
OUTPUT_COPIES = 2.5
LABELED_COPIES = 2.5
# with the output layer computed for the labeled rows only (--output-rows labeled): [rows,
# width] tensors of the width its aggregation runs at (its output over every row, before
# the labeled ones are picked, and the gradient scattered back); a model's own (mgg.torch.
# models.Spec.picked_copies: SAGE's root rows add theirs), else this
PICKED_COPIES = 2
# per parameter: the weight and its gradient (4 + 4 bytes), and the optimizer's state
PARAM_BYTES = {"adam": 16, "sgd": 8}  # Adam: two moments; SGD without momentum: none
# A training rank whose activations (and attention) would take RETURN_ABOVE bytes or more
# gives freed blocks back to the kernel (mgg.process.fit_allocator) and holds fewer of
# them at its peak: these shares of the parts above (but never less than RETURN_ABOVE),
# measured on papers100m (bf16, scale 0.01: gcn, sage, gin, gat at P = 1 and 4; 0.05: gcn
# at P = 1, 2, 4; plan / peak 0.84-1.18)
RETURN_ABOVE = 256 << 20
RETURNED_ACTIVATIONS = 0.6
RETURNED_ATTENTION = 0.55
# a node order (mgg.partition.order): the permuted CSR beside the graph's, and for rcm and
# metis the symmetric structure they order (E entries, 2E for a directed graph) while they
# compute, per entry: A + A^T and scipy's temporaries; for METIS its int64 copy and its
# coarsened graphs (products stand-in, 12.4M entries: 1,195 MB above natural's peak)
ORDER_STRUCTURE_PER_EDGE = {"rcm": 30, "metis": 110}
# what mgg.train.prepare gives a graph without features (here, as the estimate counts it):
FEATURELESS_IDENTITY_MAX = 200_000  # one-hot node ids up to this many nodes, else
FEATURELESS_WIDTH = 64  # this many seeded random features
# the GPU (--backend cuda): the CUDA context, cuBLAS's and torch's and cupy's pools at rest;
# not calibrated on a GPU yet (docs/data.md)
DEVICE_BASELINE = 640 * 2**20
# streamed input features (mgg.torch.HostRows): per row of a chunk, two buffers and the
# dropped-out copy of one in the job's dtype
STREAM_COPIES = 3
# the smallest chunk worth a copy (or all of a rank's rows, when it has fewer)
STREAM_MIN_ROWS = 1024
# mgg check's rank 0, bytes per value of the [N, D] rows: the scipy oracle's float64
# features and sums, then the sums beside the gathered float32 output (12) and 4 more
# (measured on rmat scale 20, D = 16 and 64, P = 1, 2, 4, every case of
# bench/memory_estimate.py --command check: estimate / peak 0.86-1.26); per edge of a
# sharded graph reassembled there, what its gathered edge arrays take
CHECK_ORACLE = 16
CHECK_ORACLE_AFTER = 16
CHECK_GATHERED_PER_EDGE = 34
# op 'gcn' beside the others: per entry beyond its gcn_norm graph (CSR, weights, norm),
# measured with every op (rmat scale 20, D = 16 and 64, P = 1, 2, 4)
CHECK_GCN_PER_ENTRY = 8
# a model reads dense input features held on its device a chunk at a time (mgg.torch.
# ChunkedRows: dropout and the first GEMM per chunk, the dropout again in the backward)
# when their dropped-out copy would take this many bytes or more and its first layer
# multiplies them first (or the model recomputes): in INPUT_CHUNKS chunks, no copy held
CHUNKED_INPUT_ABOVE = 256 << 20
INPUT_CHUNKS = 8
# activations in host memory (mgg.torch.offload: --offload, or where the plan needs it after
# streaming the features): the saved tensors this large or larger leave the device
OFFLOAD_MIN_BYTES = 1 << 20
# [rows, hidden] tensors a GPU then holds at the peak: an op's input, output and gradient,
# and the saved tensor fetched ahead; a model's own (mgg.torch.models.Spec.offload_copies,
# measured by bench/offload.py on the CPU's simulated device; not on a GPU yet), else this
OFFLOAD_COPIES = 4
# bfloat16 rows on a GPU: the float32 sums one launch of the CUDA kernel rounds (mgg.kernels.
# cuda.DevicePlan: a launch per range of destination rows) take at most this many bytes
SUMS_MAX_BYTES = 1 << 30


def sums_rows(dim: int) -> int:
    """The destination rows one bf16 launch of width ``dim`` sums: its float32 sums within
    SUMS_MAX_BYTES."""
    return max(1, SUMS_MAX_BYTES // (4 * max(int(dim), 1)))


def multiplies_first(out: int, width: int) -> bool | None:
    """A layer [n, width] -> [n, out] that aggregates at the narrower width, as a model's
    first, given dense rows: True, it multiplies them before aggregating; False, it
    aggregates them first at the same width, so it could take them as ChunkedRows,
    multiplied first, for one more aggregation in its backward pass; None, neither."""
    return True if out < width else False if out == width else None


def reads_in_chunks(first: bool | None, recompute: bool, nbytes: int) -> bool:
    """Whether a model reads its dense input as ChunkedRows: the dropped-out copy would take
    ``nbytes`` >= CHUNKED_INPUT_ABOVE, and its first layer multiplies it first (``first``:
    its multiplies_first), or could while the model recomputes."""
    return nbytes >= CHUNKED_INPUT_ABOVE and (first is True or (first is False and recompute))


class Parts(dict):
    """A rank's bytes by part (:func:`estimate`); ``returns_freed``: a training rank this
    large gives freed blocks back to the kernel (mgg.process.fit_allocator), as its
    activations are counted."""

    returns_freed = False


def estimate(
    num_nodes: int,
    num_edges: int,
    ranks: int = 1,
    *,
    features: int = 0,
    feature_nnz: int | None = None,
    classes: int = 0,
    multilabel: bool = False,
    hidden: int = 16,
    layers: int = 2,
    heads: int = 1,
    copies: int = ACTIVATION_COPIES,
    offload_copies: int = OFFLOAD_COPIES,
    picked_copies: int = PICKED_COPIES,
    edge_floats: int = 0,
    params: int | None = None,
    largest_param: int | None = None,
    optimizer: str = "adam",
    command: str = "train",
    sharded: bool = False,
    symmetric: bool = True,
    dim: int = 16,
    makes_split: bool = False,
    dtype: str = DEFAULTS.dtype,
    stored: str = DEFAULTS.dtype,
    order: str = DEFAULTS.order,
    aggregates: str = "narrower",
    recompute: bool = False,
    labeled: int | None = None,
    output_rows: str = "all",
    rows: int | None = None,
    device: bool = False,
    stream: int = 0,
    offload: bool = False,
    norms: bool = False,
    backend: str = "cpu",
    designs: int = 1,
    ops: tuple = ("sum",),
) -> dict[str, int]:
    """Peak resident bytes per rank of ``command`` ('train', 'check', 'partition') on a
    graph of N nodes and E CSR entries over ``ranks`` ranks, by part; ``"total"`` is
    the peak (the baseline plus the largest phase: load, partition, run).
    ``rows``: this rank's node rows (default N/P); ``device``: what the GPU of a cuda job
    holds (train and check: no load phase; NVSHMEM windows hold a rank's own rows);
    ``stream``: (device, train) the dense input features stay in host memory and stream
    through the device in chunks of this many rows (mgg.torch.HostRows); ``offload``:
    (device, train) what the backward pass needs waits in host memory (mgg.torch.offload):
    the device holds a layer's working tensors, the host (part ``offloaded``, not in the
    device's total) the rest; ``norms``: the plan's weights factor (the model's graph is
    gcn_norm, the graph has no weights of its own): it keeps the factors, a GPU holds no
    weight per local edge (counted at P = 1, where every edge is local), and the host
    none per edge where the ``backend`` is cuda (the CPU kernels read weights made
    from the factors, as many bytes as held).

    features F (dense, or ``feature_nnz`` stored values when sparse), classes C (tasks
    when ``multilabel``), hidden/layers/heads: the model (the last layer has one head);
    ``copies``: [rows, hidden*heads] tensors each hidden layer holds at the peak (and
    OUTPUT_COPIES of [rows, C]); ``edge_floats``: floats it keeps per edge, head and layer
    (attention); ``params``: its parameters (default: dense layers F -> hidden*heads ... ->
    C), each held with its gradient and ``optimizer``'s state, and ``largest_param``
    (default: the widest layer's) once more while its gradient is stored; ``dim``: check's
    width D; ``designs``: how many check sets up at once; ``ops``: check's ops;
    ``sharded``: rank r maps only its shard (no whole dataset, no partitioning);
    ``makes_split``: the dataset has no masks, so make_split counts per class;
    ``dtype``: the job's rows (bfloat16: 2 bytes each; weights, optimizer state and the
    sums stay float32); ``stored``: the dataset's dense features; ``order``: the node
    order computed first (its structure, then the renumbered graph beside the given one);
    ``aggregates``: the width each layer aggregates at, which sizes the windows (the
    model's: mgg.torch.models.Spec); ``recompute``: layers keep only their inputs, and one
    layer at a time holds its ``copies`` (and attention) while it runs again;
    ``labeled``: rows in a split (default all), which the loss and evaluation take;
    ``output_rows`` 'labeled': the output layer computes those rows only (mgg.train.Trainer),
    holding ``picked_copies`` [rows, width] tensors over every row; ``offload_copies``: the
    [rows, hidden] tensors a device holds with ``offload``.
    """
    n, e, p = int(num_nodes), int(num_edges), max(1, int(ranks))
    f, c = int(features or 0), int(classes or 0)
    rows = -(-n // p) if rows is None else int(rows)
    rb, fb = row_dtype(dtype).itemsize, row_dtype(stored).itemsize  # bytes per value
    x = 8 * feature_nnz + 8 * (n + 1) if feature_nnz is not None else fb * n * f
    node_data = x + (n * c if multilabel else 8 * n) + 3 * n
    base = CHECK_BASELINE if command == "check" else BASELINE
    part = Parts(baseline=base)
    entries = e + n  # gcn_norm adds a self loop per node
    directions = 1 if symmetric else 2
    plan = PLAN_PER_ENTRY * directions * (entries // p + rows)
    saved = NORM_SAVES_PER_ENTRY * directions * (entries // p) if norms else 0
    model = dict(hidden=hidden, layers=layers, heads=heads, copies=copies)
    model.update(offload_copies=offload_copies, picked_copies=picked_copies)
    model.update(edge_floats=edge_floats, params=params, largest_param=largest_param)
    model.update(optimizer=optimizer, aggregates=aggregates, recompute=recompute)
    model["output_rows"] = output_rows
    model["labeled"] = -(-(n if labeled is None else labeled) // p)
    if device:
        own = node_data * rows // max(n, 1)
        if feature_nnz is None:  # dense features on the device: the rows' dtype
            own -= (fb - rb) * rows * f
        if stream and command == "train":
            own -= rb * rows * f  # the features stay on the host
            per_row = f * STREAM_COPIES * rb
            model["streamed"] = per_row * min(int(stream), rows)
        model["offload"] = bool(offload) and command == "train"
        args = (own, rows, entries // p, f, feature_nnz, c, rb, directions, dim, model)
        return _device(command, plan - (saved if p == 1 else 0), p, *args)
    if backend == "cuda":
        plan -= saved
    if sharded:
        part["dataset"] = plan + node_data // p
        load = part["dataset"]
        build = 0
    else:
        part["dataset"] = csr_bytes(n, e, build=False) + node_data
        load = part["dataset"] + LOAD_PER_EDGE * e
        build = part["dataset"] + JOB_PER_ENTRY * entries + plan
        if order != "natural":
            entries = e if symmetric else 2 * e
            part["order"] = ORDER_STRUCTURE_PER_EDGE.get(order, 0) * entries + 16 * n
            load = max(load, part["dataset"] + part["order"])
            build += csr_bytes(n, e, build=False) + 16 * n
    if makes_split and not multilabel:
        part["make_split"] = 8 * 3 * max(c, 1) + 3 * 8 * n  # bincount per class, order, rank
    part["plan"] = plan * (p if command == "partition" else 1)
    run = 0
    if command == "train":
        widths = _train_parts(part, rows, entries // p, f, feature_nnz, c, rb, **model)
        act = part["activations"] + part.get("attention", 0)
        if act >= RETURN_ABOVE:  # never below RETURN_ABOVE: more activations, more bytes
            part.returns_freed = True
            held = RETURNED_ACTIVATIONS * part["activations"]
            held += RETURNED_ATTENTION * part.get("attention", 0)
            share = max(RETURN_ABOVE, held) / act
            for k in ("activations", "attention"):
                if k in part:
                    part[k] = int(share * part[k])
            act = part["activations"] + part.get("attention", 0)
        windows = 0
        if p > 1:  # a shm window per width aggregated, and the peers' rows each reads
            windows = directions * rb * sum(widths) * n
        part["windows"] = windows
        run = part["dataset"] + plan + act + windows + part["model"]
    elif command == "check":  # rank 0's oracle, then its sums beside each design's output
        _check_parts(part, n, e, rows, entries, dim, rb, sharded, backend, ops)
        part["windows"] = designs * rb * dim * (2 * rows + (n - rows if p > 1 else 0))
        held = part["dataset"] + plan + part["rows"]
        held += part.get("gcn_graph", 0) + part.get("oracle_graph", 0)
        run = held + max(part["oracle"], CHECK_ORACLE_AFTER * n * dim + part["windows"])
    elif command == "partition":
        run = part["dataset"] + part["plan"] + node_data
    part["total"] = base + max(load, build, run) + part.get("make_split", 0)
    return part


def _check_parts(part, n, e, rows, entries, dim, rb, sharded, backend, ops) -> None:
    """Adds what ``mgg check`` holds on a host beside the dataset and the plan: its rows
    (the input, and the output widened to float32 where the designs' are not: bf16, a
    GPU's), a gcn_norm graph for op 'gcn', and rank 0's scipy oracle at its peak (float64
    features, sums and values; for a sharded dataset the graph it reassembles)."""
    widened = backend == "cuda" or rb != 4
    part["rows"] = (rb + (4 if widened else 0)) * dim * rows
    if "gcn" in ops and not sharded:
        gcn = csr_bytes(n, entries, weighted=True, build=False) + 4 * n
        part["gcn_graph"] = gcn + CHECK_GCN_PER_ENTRY * entries
    part["oracle"] = CHECK_ORACLE * n * dim + 8 * entries
    if sharded:  # its edges gathered from every rank, then a graph
        part["oracle_graph"] = (
            csr_bytes(n, e, weighted=True, build=False) + CHECK_GATHERED_PER_EDGE * e
        )


def _train_parts(
    part,
    rows,
    entries,
    f,
    feature_nnz,
    c,
    rb,
    *,
    hidden,
    layers,
    heads,
    copies,
    offload_copies,
    picked_copies,
    edge_floats,
    params,
    largest_param,
    optimizer,
    aggregates,
    recompute,
    labeled,
    output_rows="all",
    streamed=0,
    offload=False,
) -> list[int]:
    """Adds a training rank's activations (attention), and model with its gradients and
    optimizer state, to ``part``; returns the widths the layers aggregate at (``aggregates``:
    'narrower' of input and output, as GCN and SAGE; 'input', GIN; 'output', GAT; sparse
    and streamed input features are transformed first; the output layer for the labeled
    rows reads the full graph's windows). ``streamed``: the bytes of the chunks of
    streamed features (then no [rows, F] activation). ``offload``: the saved tensors in
    host memory (part ``offloaded``): the device holds the widest layer's working tensors,
    ``offload_copies`` of them (recomputing: a layer's copies and two inputs, the one
    fetched back and the next one's, or what recomputing alone holds where that is less),
    or, while the output layer runs, its tensors and a hidden layer's saved one fetched
    ahead, whichever is more (measured: bench/offload.py --output-rows labeled)."""
    widths = [hidden * heads] * (max(layers, 1) - 1) + [max(c, 1)]
    widest = max(widths[:-1], default=0)  # the widest hidden layer's output
    in_width = f if feature_nnz is None and not streamed else 0
    held_in = in_width  # the dropped-out input the first layer keeps
    if in_width and reads_in_chunks(multiplies_first(widths[0], f), recompute, rb * rows * f):
        held_in = -(-f // INPUT_CHUNKS)  # ChunkedRows: one chunk dropped out at a time
    if streamed:
        part["stream"] = int(streamed)
    pick = {"narrower": min, "input": lambda a, b: a, "output": lambda a, b: b}[aggregates]
    ins = [in_width] + widths[:-1]
    agg = {pick(a, b) if a else b for a, b in zip(ins, widths, strict=True)}
    hidden_rows = copies * sum(widths[:-1])
    heads_kept = heads * (max(layers, 1) - 1) + 1  # attention heads kept over the layers
    if recompute:  # each layer's input, and the widest layer's copies while it runs again
        hidden_rows = sum(widths[:-1]) + (copies - 1) * widest
        heads_kept = heads if layers > 1 else 1
    kept = rb * rows * hidden_rows  # what offload moves to the host
    if offload:  # recomputing: a layer's copies, its input fetched back and the next's
        work = min(hidden_rows, (copies + 1) * widest) if recompute else offload_copies * widest
        kept += rb * rows * (held_in - work)
        hidden_rows, held_in = work, 0  # the first op saves the dropped input: the host's
    picked = min(labeled, rows)
    if output_rows == "labeled":  # the output layer's rows: the labeled ones
        last = pick(ins[-1], widths[-1]) if ins[-1] else widths[-1]
        out = rb * (rows * picked_copies * last + picked * OUTPUT_COPIES * widths[-1])
    else:
        out = rb * rows * OUTPUT_COPIES * widths[-1]
    hidden_part = rb * rows * (held_in + hidden_rows)
    if offload:  # the output layer's tensors and the hidden layers' working ones take turns
        act = max(hidden_part, out + rb * rows * widest)
    else:
        act = hidden_part + out
    act = int(act + 4 * picked * LABELED_COPIES * widths[-1])
    part["activations"] = act
    if edge_floats:  # attention: per edge and head (the last layer has one head)
        part["attention"] = 4 * edge_floats * heads_kept * (entries + rows)
        if offload and layers > 1:  # one layer's on the device
            kept += 4 * edge_floats * (heads_kept - heads) * (entries + rows)
            part["attention"] = 4 * edge_floats * heads * (entries + rows)
    if offload:
        part["offloaded"] = max(int(kept), 0)
    if params is None:
        dims = list(zip([f] + widths[:-1], widths, strict=True))
        params = sum(a * b + b for a, b in dims)
        largest_param = max(a * b for a, b in dims)
    per_param = PARAM_BYTES.get(optimizer, PARAM_BYTES["adam"])
    part["model"] = per_param * int(params) + 4 * int(largest_param or 0)
    return sorted(agg)


def _device(
    command, plan, ranks, node_rows, rows, entries, f, feature_nnz, c, rb, directions, dim, model
) -> dict[str, int]:
    """estimate(device=True): the GPU's bytes of a cuda rank (plan, its node rows, the
    run), and its designs' input buffers of its own rows (mgg.designs.cuda: per width and
    direction, two in turn with peers; one PE alone reads a layer's rows in place, and
    check's from one buffer) with, for bfloat16 rows, the float32 sums the device's
    designs share (one per width, at most, of one launch's rows: sums_rows)."""
    part = {"baseline": DEVICE_BASELINE, "dataset": node_rows, "plan": plan}

    def sums(widths):
        return sum(4 * min(rows, sums_rows(w)) * w for w in widths) if rb == 2 else 0

    if command == "train":
        widths = _train_parts(part, rows, entries, f, feature_nnz, c, rb, **model)
        turns = 2 * directions if ranks > 1 else 0
        part["windows"] = turns * rb * sum(widths) * rows + sums(widths)
    else:  # check: x, out, and the windows of width D with their float32 sums
        part["activations"] = 3 * rb * dim * rows
        part["windows"] = (2 if ranks > 1 else 1) * rb * dim * rows + sums([dim])
    part["total"] = sum(v for k, v in part.items() if k != "offloaded")  # that: the host's
    return part


def check_estimate(parts: dict[str, int], source, what: str = "this job") -> int:
    """Raise ResourceError when ``parts["total"]`` (an :func:`estimate`) exceeds the
    :func:`usable` part of ``MGG_MEMORY_LIMIT`` (a rank's whole peak) or, without it, of
    what this rank has and what this process already holds (:func:`plan`'s rule, against
    the budget :func:`checked_estimate`'s fixes are planned with); returns the estimate in
    MB."""
    have, how = available()
    held = _held()
    if parts["total"] > usable(have + held):
        big = sorted(
            ((v, k) for k, v in parts.items() if k not in ("total", "baseline")), reverse=True
        )[:3]
        detail = ", ".join(f"{k} {format_bytes(v)}" for v, k in big)
        if held:
            how += f", and the {format_bytes(held)} this process holds"
        raise ResourceError(
            f"{source}: {what} needs about {format_bytes(parts['total'])} per rank "
            f"({detail}) but this rank has {usable_words(have + held, how)}; {HINT}"
        )
    return round(parts["total"] / 2**20, 1)


def model_params(model, in_dim: int, out_dim: int, hidden: int, layers: int, heads: int):
    """(parameters, the largest parameter's size) of the registry's ``model`` (a
    mgg.torch.models Spec) at these sizes, built on torch's meta device: nothing is
    allocated."""
    import inspect

    import torch

    kw = {"heads": heads} if "heads" in inspect.signature(model.cls).parameters else {}
    with torch.device("meta"):
        net = model.cls(in_dim, hidden, out_dim, num_layers=layers, **kw)
    sizes = [p.numel() for p in net.parameters()] or [0]
    return sum(sizes), max(sizes)


def facts(n: int, e: int, *, features: int = 0, classes: int = 0, **rest) -> dict:
    """What the estimate needs of a graph of ``n`` nodes and ``e`` CSR entries (dense
    features, one class per node, undirected, stored float32, not sharded, every row
    labeled, without edge weights of its own, unless ``rest`` says otherwise: symmetric,
    feature_nnz, stored, multilabel, makes_split, sharded, labeled, weighted, name)."""
    out = {"n": int(n), "e": int(e), "features": int(features), "classes": int(classes)}
    out.update(symmetric=True, feature_nnz=None, featureless=not features, stored="float32")
    out["weighted"] = False
    out.update(multilabel=False, makes_split=False, sharded=False, labeled=None)
    out.update(rest)
    return out


def split_rows(masks) -> int | None:
    """Rows in any of the split ``masks`` (bool [n] each, or None); None without one: every
    row counts, as when the job makes the split."""
    masks = [m for m in masks or () if m is not None]
    if not masks:
        return None
    out = masks[0].copy()
    for m in masks[1:]:
        out |= m
    return int(out.sum())


def job_facts(ds) -> dict:
    """What the estimate needs of ``ds`` (a Dataset, a ShardedDataset's manifest, or these
    facts already: :func:`facts`)."""
    if isinstance(ds, dict):
        return ds
    graph = getattr(ds, "graph", None)
    if graph is None:  # sharded: the manifest's facts
        return facts(
            ds.num_nodes,
            ds.num_edges,
            features=ds.num_features or 0,
            classes=ds.num_classes or 0,
            symmetric=bool(ds.symmetric),
            feature_nnz=0 if ds.features == "sparse" else None,
            featureless=ds.features is None,
            stored=ds.manifest.get("feature_dtype") or "float32",
            sharded=True,
            labeled=ds.manifest.get("labeled"),
            weighted="norm" not in ds.manifest["files"][0],  # its plans' weights don't factor
        )
    x = ds.x
    return facts(
        graph.num_nodes,
        graph.num_edges,
        features=0 if x is None else int(x.shape[1]),
        classes=ds.num_classes or 0,
        symmetric=bool(graph.symmetric),
        feature_nnz=int(x.nnz) if hasattr(x, "nnz") else None,
        multilabel=bool(ds.multilabel),
        makes_split=ds.y is not None and ds.train_mask is None,
        labeled=split_rows((ds.train_mask, ds.val_mask, ds.test_mask)),
        weighted=graph.weights is not None,
    )


def job_estimate(ds, ranks: int, command: str, *, model=None, **kw) -> dict[str, int]:
    """The :func:`estimate` of ``command`` on ``ds`` (a Dataset or a ShardedDataset), by
    part. ``model``: the registry's spec (its hidden, layers and heads are the defaults; its
    parameters are counted at the input width the job gives it: F, or for a featureless
    graph one-hot ids or random features); ``kw``: hidden, layers, heads, optimizer, dim
    (None means the default)."""
    kw = {k: v for k, v in kw.items() if v is not None}
    d = job_facts(ds)
    n, c = d["n"], d["classes"]
    if model is not None:
        kw.setdefault("hidden", model.hidden)
        kw.setdefault("layers", model.layers)
        kw.setdefault("heads", getattr(model, "heads", 1))
        kw.setdefault("edge_floats", getattr(model, "edge_floats", 0))
        kw.setdefault("copies", getattr(model, "copies", ACTIVATION_COPIES))
        kw.setdefault("offload_copies", getattr(model, "offload_copies", OFFLOAD_COPIES))
        kw.setdefault("picked_copies", getattr(model, "picked_copies", PICKED_COPIES))
        kw.setdefault("aggregates", getattr(model, "aggregates", "narrower"))
        graph = getattr(getattr(model, "cls", None), "graph", None)  # the kind its layers take
        kw.setdefault("norms", graph == "gcn_norm" and not d.get("weighted"))
        if command == "train" and hasattr(model, "cls"):
            in_dim = d["features"]
            if d["featureless"]:
                in_dim = n if n <= FEATURELESS_IDENTITY_MAX else FEATURELESS_WIDTH
            try:
                kw["params"], kw["largest_param"] = model_params(
                    model, in_dim, max(c, 1), kw["hidden"], kw["layers"], kw["heads"]
                )
            except (RuntimeError, NotImplementedError, TypeError, ValueError):
                pass  # not buildable on the meta device: dense layers' count (estimate)
    return estimate(
        n,
        d["e"],
        ranks,
        features=d["features"],
        feature_nnz=d["feature_nnz"],
        classes=c,
        multilabel=d["multilabel"],
        command=command,
        sharded=d["sharded"],
        symmetric=d["symmetric"],
        makes_split=d["makes_split"],
        stored=d["stored"],
        labeled=d.get("labeled"),
        **kw,
    )


def check_job(ds, ranks: int, command: str, **kw) -> float:
    """:func:`checked_estimate` in MB."""
    return round(checked_estimate(ds, ranks, command, **kw)["total"] / 2**20, 1)


def checked_estimate(ds, ranks: int, command: str, *, source=None, model=None, **kw) -> dict:
    """The :func:`job_estimate` of ``command`` on ``ds``, checked with
    :func:`check_estimate` before the job allocates. A refusal says what would fit
    (:func:`fixes`)."""
    parts = job_estimate(ds, ranks, command, model=model, **kw)
    d = job_facts(ds)
    c = d["classes"]
    what = f"mgg {command} on {ranks} rank(s)"
    if c > 2**24 and not d["multilabel"]:
        what += (
            f" with {c:,} classes (the largest label is {c - 1:,}; an output layer of {c:,} rows)"
        )
    try:
        check_estimate(parts, source if source is not None else ds.name, what)
        return parts
    except ResourceError as e:
        budget = {"host": available()[0] + _held()}
        ways = fixes(ds, ranks, command, budget, model=model, **kw)
        if ways:
            raise ResourceError(f"{e}; it would fit with {' or '.join(ways)}") from None
        raise


def check_host(out: dict, source, what: str) -> Parts:
    """A GPU job's host check: the largest rank's host parts of ``out`` (:func:`plan` with
    ``device``: the data, the plan, what is offloaded; the run is the GPU's) against what
    this rank has, as :func:`check_estimate`; returns those parts."""
    big = max(out["per_rank"], key=lambda r: r["total_bytes"])
    parts = Parts(big["parts"], total=big["total_bytes"])
    check_estimate(parts, source, what)
    return parts


def _held() -> int:
    """What this process holds now (counted against a budget without MGG_MEMORY_LIMIT)."""
    if os.environ.get(LIMIT_ENV, "").strip():
        return 0
    return _proc_bytes("/proc/self/status", "VmRSS") or 0


# ---- the memory plan --------------------------------------------------------------------
# a cuda rank's host (the last four: mgg check's)
HOST_PARTS = ("baseline", "dataset", "plan", "order", "make_split", "rows", "gcn_graph", "oracle",
              "oracle_graph")  # fmt: skip


def rank_rows(num_nodes: int, ranks: int, bounds=None) -> list[int]:
    """Each rank's node rows: the split's ``bounds`` (P+1) where known, else equal shares."""
    if bounds is not None:
        return [int(b) - int(a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return [(num_nodes * (r + 1)) // ranks - (num_nodes * r) // ranks for r in range(ranks)]


def plan(ds, ranks: int, command: str = "train", *, budget: dict, device: bool = False,
         bounds=None, model=None, suggest: bool = True, **kw) -> dict:  # fmt: skip
    """The memory plan of ``command`` on ``ds`` (a dataset, or its facts) over ``ranks``:
    per rank (``per_rank``: rank, rows, ``total_bytes`` and ``parts`` on the host, and with
    ``device`` the GPU's as ``device``: the host then holds the data and the plan, the GPU
    the run: its dataset (a shard's plan included), the plan it built, what is offloaded
    and its streamed features, pinned), against ``budget`` (bytes a rank has: 'host', and
    'device'), ``fits``, and,
    with ``suggest``, the ``fixes`` that fit when it does not. A rank fits where its totals
    are within the :func:`usable` part of each budget (``usable``: all but HEADROOM, the
    line its fixes and streamed chunks are chosen against too). A training rank whose GPU
    would not hold it keeps its dense features in host memory and streams them
    (``device["stream_rows"]``: the rows of a chunk, the most that fit: :func:`stream_rows`),
    and where that is not enough, or with ``offload``, its saved activations too
    (``device["offload"]``; the host's part ``offloaded``)."""
    d = job_facts(ds)
    cap = {k: usable(v) for k, v in budget.items()}
    kw.pop("rows", None)  # each rank's, from bounds
    forced = bool(kw.pop("offload", False)) and command == "train"
    per_rank, memo = [], {}
    for r, rows in enumerate(rank_rows(d["n"], ranks, bounds)):
        if rows not in memo:
            host = job_estimate(d, ranks, command, model=model, rows=rows, **kw)
            gpu, chunk, off = None, 0, False
            if device:
                for off in (False, True) if not forced else (True,):
                    kw_off, chunk = {**kw, "offload": off}, 0
                    gpu = job_estimate(
                        d, ranks, command, model=model, rows=rows, device=True, **kw_off
                    )
                    if gpu["total"] > cap["device"]:
                        chunk = stream_rows(
                            d, ranks, command, budget["device"], model, rows, kw_off
                        )
                        if chunk:
                            gpu = job_estimate(
                                d, ranks, command, model=model, rows=rows, device=True,
                                stream=chunk, **kw_off,
                            )  # fmt: skip
                    if gpu["total"] <= cap["device"] or command != "train":
                        break
                host = {k: host[k] for k in HOST_PARTS if k in host}
                if d["sharded"]:  # a shard's plan is in its dataset
                    host.pop("plan", None)
                if off:
                    host["offloaded"] = gpu.pop("offloaded")
                if chunk and kw.get("backend") == "cuda":  # HostRows: its features, pinned
                    rb = row_dtype(kw.get("dtype") or "float32").itemsize
                    host["pinned"] = rb * rows * d["features"]
                host["total"] = _host_total(host, d["sharded"])
            memo[rows] = host, gpu, chunk, off
        host, gpu, chunk, off = memo[rows]
        item = {"rank": r, "rows": rows, "total_bytes": host["total"], "parts": _parts(host)}
        if gpu is not None:
            item["device"] = {"total_bytes": gpu["total"], "parts": _parts(gpu)}
            if chunk:
                item["device"]["stream_rows"] = chunk
            if off:
                item["device"]["offload"] = True
        per_rank.append(item)
    fits = _fits(per_rank, budget)
    out = {"command": command, "np": ranks, "budget": budget, "usable": cap, "headroom": HEADROOM}
    out.update(fits=fits, per_rank=per_rank)
    if suggest:
        out["fixes"] = [] if fits else fixes(d, ranks, command, budget, model=model, **kw)
    return out


def _host_total(host: dict, sharded: bool) -> int:
    """A GPU rank's host peak from its parts: all held at once, but a shard's files, mapped
    and read once (the plan to the GPU, the features into pinned memory), are page cache
    by the time the run offloads its activations: the larger of the two phases."""
    if not sharded:
        return sum(host.values())
    held = sum(v for k, v in host.items() if k not in ("dataset", "offloaded"))
    return held + max(host.get("dataset", 0), host.get("offloaded", 0))


def stream_rows(d: dict, ranks: int, command: str, budget: int, model, rows: int, kw) -> int:
    """The most rows of dense input features a chunk streamed through a GPU of
    ``budget`` bytes may hold beside the rest of the training rank within the budget's
    :func:`usable` part (at most its ``rows``); 0 when the job has no dense features to
    stream or a chunk would hold fewer than STREAM_MIN_ROWS (or ``rows``)."""
    if command != "train" or d["feature_nnz"] is not None or not d["features"] or rows < 1:
        return 0
    one = job_estimate(d, ranks, command, model=model, rows=rows, device=True, stream=1, **kw)
    per_row = one["stream"]
    chunk = min(rows, (usable(budget) - (one["total"] - per_row)) // per_row)
    return int(chunk) if chunk >= min(STREAM_MIN_ROWS, rows) else 0


def _parts(est: dict) -> dict:
    return {k: int(v) for k, v in est.items() if k != "total"}


def _fits(per_rank: list, budget: dict) -> bool:
    """Every rank within the :func:`usable` part of each budget (host, and device)."""
    cap = {k: usable(v) for k, v in budget.items()}
    return all(
        r["total_bytes"] <= cap["host"]
        and ("device" not in r or r["device"]["total_bytes"] <= cap["device"])
        for r in per_rank
    )


def fixes(ds, ranks: int, command: str, budget: dict, **kw) -> list[str]:
    """The flags, each alone, that make the job fit ``budget`` (by :func:`plan`'s rule,
    HEADROOM kept: each planned again with its flag): bfloat16 rows, the output layer for
    the labeled rows only (a model whose last layer can: GCN, SAGE), fewer hidden units
    (halved, down to 8), one design checked at a time, or more ranks (up to 64x, when each
    has its own budget: a GPU each, or MGG_MEMORY_LIMIT); empty when none does. Not
    --recompute: two layers peak in the backward pass with or without it (docs/data.md)."""
    device = "device" in budget
    tries = []
    if (kw.get("dtype") or DEFAULTS.dtype) == "float32" and command != "partition":
        tries.append(("--dtype bfloat16", ranks, {"dtype": "bfloat16"}))
    d = job_facts(ds)
    labeled = d.get("labeled")
    if (
        command == "train"
        and kw.get("output_rows", "all") == "all"
        and getattr(getattr(kw.get("model"), "cls", None), "picks_rows", False)
        and labeled is not None
        and labeled < d["n"]
    ):
        tries.append(("--output-rows labeled", ranks, {"output_rows": "labeled"}))
    if command == "check" and kw.get("designs", 1) > 1:
        tries.append(("--designs pipelined", ranks, {"designs": 1}))
    hidden = kw.get("hidden") or getattr(kw.get("model"), "hidden", None)
    while command == "train" and hidden and hidden > 8:
        hidden //= 2
        tries.append((f"--hidden {hidden}", ranks, {"hidden": hidden}))
    if device or os.environ.get(LIMIT_ENV, "").strip():
        tries += [(f"--np {ranks * k}", ranks * k, {}) for k in (2, 4, 8, 16, 32, 64)]
    found, kinds = [], set()
    for flag, p, change in tries:
        kind = flag.split()[0]
        if kind in kinds:
            continue
        trial = plan(ds, p, command, budget=budget, device=device, suggest=False, **kw | change)
        if trial["fits"]:
            found.append(flag)
            kinds.add(kind)
    return found
