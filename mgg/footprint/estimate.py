"""A command's peak bytes per rank, part by part: the data, the plan, the activations and
the model (parameters, gradients, optimizer state), on the host and on a GPU.

Imports no torch (mgg check runs without it): a training job's rules for chunked,
streamed and offloaded rows are read from mgg.torch.chunks when one is estimated.

Each calibration constant names the benchmark that measured it (bench/memory_estimate.py
against VmHWM unless said); the rules for chunked, streamed and offloaded rows are the
torch layers' (:func:`chunks`).
"""

from __future__ import annotations

from ..designs.cuda import sums_rows
from ..errors import ResourceError
from ..job import OPTIMIZERS, Job
from ..knobs import DEFAULTS
from ..memory import HINT, available, csr_bytes, format_bytes, held_bytes, usable, usable_words
from ..precision import row_dtype

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
# on papers100m (1% labeled: bench/papers.py), 5.0 on a planted graph with 1,000 classes
# (all labeled: bench/memory_estimate.py)
OUTPUT_COPIES = 2.5
LABELED_COPIES = 2.5
# with the output layer computed for the labeled rows only (--output-rows labeled): [rows,
# width] tensors of the width its aggregation runs at (its output over every row, before
# the labeled ones are picked, and the gradient scattered back); a model's own (mgg.torch.
# models.Spec.picked_copies: SAGE's root rows add theirs), else this
PICKED_COPIES = 2
# A training rank whose activations (and attention) would take RETURN_ABOVE bytes or more
# gives freed blocks back to the kernel (mgg.process.fit_allocator) and holds fewer of
# them at its peak: these shares of the parts above (but never less than RETURN_ABOVE),
# measured on papers100m (bf16, scale 0.01: gcn, sage, gin, gat at P = 1 and 4; 0.05: gcn
# at P = 1, 2, 4; plan / peak 0.84-1.18: bench/papers.py, docs/data.md)
RETURN_ABOVE = 256 << 20
RETURNED_ACTIVATIONS = 0.6
RETURNED_ATTENTION = 0.55
# a node order (mgg.partition.order): the permuted CSR beside the graph's, and for rcm and
# metis the symmetric structure they order (E entries, 2E for a directed graph) while they
# compute, per entry: A + A^T and scipy's temporaries; for METIS its int64 copy and its
# coarsened graphs (products stand-in, 12.4M entries: 1,195 MB above natural's peak;
# rcm: bench/memory_estimate.py --command check, its "rcm order" case)
ORDER_STRUCTURE_PER_EDGE = {"rcm": 30, "metis": 110}
# the GPU (--backend cuda): the CUDA context, cuBLAS's and torch's and cupy's pools at rest;
# not calibrated on a GPU yet (docs/data.md)
DEVICE_BASELINE = 640 * 2**20
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
# numba's compilation: a job whose kernels numba's cache does not hold (compiled for the
# source as it is now: the first run after an install or an edit, a dtype or model not run
# before, a NUMBA_CACHE_DIR not written yet) holds LLVM's compile memory too, kept by the
# allocator after it: cold peak minus warm peak 143-177 MiB on Cora (sage, gin, gcn in
# float32 and bfloat16, gat), 217-289 MiB on planted graphs whose generator compiles too
# (gcn and gat at hidden 16 and 4096: bench/memory_estimate.py --cold, a fresh
# NUMBA_CACHE_DIR per run; this: the largest). Counted for every job, cached or not: which
# kernels a run compiles, for which types, is not known before it runs, and so
# MGG_MEMORY_LIMIT bounds a cold run's peak too (tests/test_sizes.py)
COMPILE = 296 * 2**20


def chunks():
    """The torch layers' rules for large inputs (mgg.torch.chunks), imported when a
    training job is estimated."""
    from ..torch import chunks

    return chunks


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
    offload_copies: int | None = None,
    picked_copies: int = PICKED_COPIES,
    edge_floats: int = 0,
    params: int | None = None,
    largest_param: int | None = None,
    optimizer: str = Job.optimizer,
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
    output_rows: str = Job.output_rows,
    rows: int | None = None,
    device: bool = False,
    stream: int = 0,
    offload: bool = False,
    norms: bool = False,
    backend: str = Job.backend,
    designs: int = 1,
    ops: tuple = ("sum",),
    compiling: bool = True,
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
    [rows, hidden] tensors a device holds with ``offload`` (None: mgg.torch.chunks').
    ``compiling``: the host may compile kernels (part ``compile``: COMPILE).
    """
    n, e, p = int(num_nodes), int(num_edges), max(1, int(ranks))
    f, c = int(features or 0), int(classes or 0)
    rows = -(-n // p) if rows is None else int(rows)
    rb, fb = row_dtype(dtype).itemsize, row_dtype(stored).itemsize  # bytes per value
    x = 8 * feature_nnz + 8 * (n + 1) if feature_nnz is not None else fb * n * f
    node_data = x + (n * c if multilabel else 8 * n) + 3 * n
    base = CHECK_BASELINE if command == "check" else BASELINE
    part = Parts(baseline=base)
    part["compile"] = COMPILE if compiling else 0  # the host's (a GPU's plan: not there)
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
            per_row = f * chunks().STREAM_COPIES * rb
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
    part["total"] = base + part["compile"] + max(load, build, run) + part.get("make_split", 0)
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
    output_rows=Job.output_rows,
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
    rule = chunks()
    first = rule.multiplies_first(widths[0], f)
    if in_width and rule.reads_in_chunks(first, recompute, rb * rows * f):
        held_in = -(-f // rule.INPUT_CHUNKS)  # ChunkedRows: one chunk dropped out at a time
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
        copies_off = chunks().OFFLOAD_COPIES if offload_copies is None else offload_copies
        work = min(hidden_rows, (copies + 1) * widest) if recompute else copies_off * widest
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
    # the weight and its gradient (4 + 4 bytes), and the optimizer's state
    per_param = 8 + OPTIMIZERS.get(optimizer, OPTIMIZERS[Job.optimizer])[1]
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
    held = held_bytes()
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
