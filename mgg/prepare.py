"""A job's data on each rank: the plan and this rank's node data as tensors
(:func:`prepare`, :class:`LocalData`), for the Trainer, predict and embed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import scipy.sparse as sp
import torch

from . import process
from .backend import Backend, get_backend
from .distgraph import DistGraph
from .errors import InputError
from .graph.dataset import FEATURELESS_IDENTITY_MAX, FEATURELESS_WIDTH, Dataset, random_features
from .graph.papers import PapersDataset
from .job import Job
from .knobs import DEFAULTS, Knobs
from .partition import order as node_order
from .partition.plan import job_plan
from .partition.shards import ShardedDataset
from .precision import as_rows
from .torch import HostRows, InputRows, as_features, graph_kind

SPARSE_FEATURES_DENSITY = 0.1  # dense features at most this full (and >= 256 wide) go CSR


@dataclass
class LocalData:
    """This rank's rows of the node data (n = ub - lb), on the job's device.

    x  tensor [n, F] of the job's dtype, SparseRows, or HostRows (streamed from host
       memory);  y int64 tensor [n];  masks bool tensors [n]
    identity  what the job trains on, the same on every rank (prepare; checkpoints record
              it and a resume must match it: mgg.checkpoint.check_data)
    node_ids  int64 [n] (numpy): the original id of each row; the rows are in the job's
              node order (``order``: its name, computed in ``order_seconds``)
    """

    x: torch.Tensor | InputRows
    y: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_features: int
    num_classes: int
    notes: str = ""
    identity: dict = field(default_factory=dict)
    node_ids: np.ndarray | None = None
    order: str = DEFAULTS.order
    order_seconds: float = 0.0


def prepare(
    dataset: Dataset | ShardedDataset,
    comm=None,
    model: str | Job | None = None,
    *,
    knobs: Knobs | None = None,
    seed: int = 0,
    source: dict | None = None,
    order_file=None,
    keep_source: bool = False,
    **given,
) -> tuple[DistGraph, LocalData]:
    """This rank's plan and node data for the job of ``comm``.

    ``dataset``: a Dataset (partitioned here, on every rank) or a ShardedDataset (rank r
    opens only its shard, partitioned beforehand by ``mgg partition --out``).
    ``model``: a :class:`mgg.job.Job` (its model, design, backend, knobs, row_normalize and
    stream_rows), or a registered model name (its layers say which graph they expect) or a
    graph kind of ``job_graph`` (default: Job's), the job then given by keywords: the Job's
    ``design``, ``backend`` (a name or a Backend), ``row_normalize`` and ``stream_rows``,
    and ``knobs`` (mgg.knobs.Knobs) with knob keywords (``ps=``, ``dist=``, ``window=``,
    ``split=``, ...: those the backend and design take). A sharded dataset keeps its own ps
    unless one is given, and its split. Datasets without a split get 20 training and 30
    validation nodes per class (seeded); datasets without features get one-hot node ids
    (sparse) or, beyond 200,000 nodes, seeded random ones. Wide dense features that are
    mostly zeros (bag-of-words) are stored sparse.
    ``row_normalize`` scales each feature row to sum 1 (Kipf & Welling's preprocessing).
    The knob ``order`` (or ``order_file``, a saved permutation: mgg.partition.order)
    renumbers the nodes before the split; the data keeps its original ids
    (``LocalData.node_ids``), the split and generated features are those of natural order.
    ``source``: where ``dataset`` came from (``mgg.graph.specs.dataset_source``; a sharded
    dataset's default is its manifest's), recorded in ``LocalData.identity`` with the
    sizes, graph kind and the flags that changed the data (row_normalize; seed where it
    made the split or the features). It identifies a file by its size and head and tail,
    so it is the same at any rank count and for a sharded dataset as for the file it was
    partitioned from. ``keep_source``: keep the graph before ``model``'s loops and
    weights, so that layers wanting another kind derive it (DistGraph.derive; a sharded
    dataset has only its own). ``stream_rows``: dense features stay in host memory
    (HostRows) and stream through the device this many rows at a time (what
    mgg.footprint.plan says when they do not fit on the device beside the rest).
    """
    if comm is None and process.job_size() > 1:
        raise InputError(
            f"prepare: this process is one of {process.job_size()} ranks but no comm was "
            "given, so it would train on the whole graph alone: pass comm=get_comm()"
        )
    job, be = _job(model, knobs, given)
    knobs, design, kind = job.knobs, job.design, graph_kind(job.model)
    row_normalize, stream_rows, model = job.row_normalize, job.stream_rows, job.model
    size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
    if isinstance(dataset, ShardedDataset):
        dataset.check_job(size, kind, model, knobs, order_file)
        if not dataset.labels:
            raise ValueError(f"{dataset.path}: no labels: node classification needs them")
        shard = dataset.open(rank, size)
        knobs = replace(knobs, order=dataset.order)  # the order its plans were built in
        dg = DistGraph(shard.plan, comm, design=design, backend=be, knobs=knobs, kind=kind)
        rows, n = shard.rows, dataset.num_nodes
        source = dataset.manifest.get("source") if source is None else source
        seeded = False  # its split was made when it was partitioned
        order, order_s = dataset.order, dataset.manifest.get("order_seconds", 0.0)
    else:
        if dataset.y is None:
            raise ValueError(
                f"dataset {dataset.name!r} has no labels: node classification needs them"
            )
        ordered = node_order.for_job(
            dataset.graph, knobs.order, comm, path=order_file, seed=seed, split=knobs.split
        )
        raw = ordered.apply(dataset.graph)
        plan = job_plan(raw, kind, size, knobs.ps, rank=rank, split=knobs.split)
        dg = DistGraph(
            plan, comm, design=design, backend=be, knobs=knobs, kind=kind,
            source=raw if keep_source else None,
        )  # fmt: skip
        ids = ordered.ids(dg.lb, dg.ub)
        if isinstance(dataset, PapersDataset):  # features drawn in the job's dtype
            rows = dataset.rows(dg.lb, dg.ub, seed, ids, dtype=dg.dtype)
        else:
            rows = dataset.rows(dg.lb, dg.ub, seed, ids)
        n = dataset.graph.num_nodes
        seeded = dataset.y is not None and dataset.train_mask is None  # a seeded split
        order, order_s = ordered.name, ordered.seconds
    dg.seed = seed
    lb, ub = dg.lb, dg.ub
    node_ids = rows.node_ids(lb, ub)
    notes = rows.notes
    if order != DEFAULTS.order:
        notes += f"; nodes in {order} order ({order_s:.2f} s)"
    if rows.x is None:
        if n <= FEATURELESS_IDENTITY_MAX:
            ones = np.ones(ub - lb, np.float32)
            x = sp.csr_matrix((ones, node_ids, np.arange(ub - lb + 1)), shape=(ub - lb, n))
            notes += "; features: one-hot node ids"
        else:
            x = random_features(seed, lb, ub, FEATURELESS_WIDTH, ids=rows.ids)
            notes += f"; features: {FEATURELESS_WIDTH} seeded random"
            seeded = True
    else:
        x = rows.x
        if sp.issparse(x):
            x = sp.csr_matrix(x, dtype=np.float32)
        elif x.dtype != dg.dtype or row_normalize:  # else kept as stored (bf16 shards)
            x = np.ascontiguousarray(x, np.float32)
        if (
            not sp.issparse(x)
            and x.shape[1] >= 256
            and x.size
            and np.count_nonzero(x) <= SPARSE_FEATURES_DENSITY * x.size
        ):
            x = sp.csr_matrix(np.asarray(x, np.float32))  # bag-of-words: multiplied sparse
        if row_normalize:
            x = _row_normalize(x)
            notes += "; features: rows normalized to sum 1"
    x = as_rows(x, dg.dtype, f"the features of {rows.name!r}")
    be = dg.backend
    device = torch.device("cpu")
    if be.gpu:
        import cupy

        device = torch.device("cuda", cupy.cuda.Device().id)
        torch.cuda.set_device(device)
    if stream_rows and not sp.issparse(x):
        x = HostRows.of(x, dg, stream_rows)
        notes += f"; features streamed from host memory, {x.chunk:,} rows at a time"
    elif sp.issparse(x) and be.gpu:
        x = be.to_device(x)
    y = np.asarray(rows.y)
    y = y.astype(np.float32) if y.ndim == 2 else y.astype(np.int64)  # 2-D: multi-label
    data = LocalData(
        as_features(x, device),
        torch.as_tensor(y, device=device),
        *(torch.as_tensor(np.array(m, bool), device=device) for m in rows.masks),
        num_features=int(x.shape[1]),
        num_classes=int(rows.num_classes),
        notes=notes.strip("; "),
        node_ids=node_ids,
        order=order,
        order_seconds=order_s,
    )
    where = dict(source or {})
    data.identity = {
        "dataset": rows.name,
        "path": where.pop("path", None),
        "source": {k: v for k, v in where.items() if k != "num_edges"} or None,
        "num_nodes": int(n),
        "num_features": data.num_features,
        "num_classes": data.num_classes,
        "graph_kind": kind,
        "row_normalize": bool(row_normalize and rows.x is not None),
        **({"seed": seed} if seeded else {}),
    }
    return dg, data


def _row_normalize(x, chunk: int = 1 << 16):
    """Each row of x (float32, dense or CSR) divided by the sum of its magnitudes, worked
    in float64 and rounded once to float32: rows whose sum overflows float32 (features
    near 3.4e38, which mgg's errors suggest --row-normalize for) still sum to 1, where
    float32 sums would be inf and the rows all 0. Zero rows stay 0."""
    if sp.issparse(x):  # the nonzeros alone, in float64
        x = sp.csr_matrix(x, dtype=np.float64)
    sums = np.asarray(abs(x).sum(axis=1, dtype=np.float64)).ravel()
    inv = np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)
    if sp.issparse(x):
        return sp.csr_matrix(sp.diags(inv) @ x, dtype=np.float32)
    out = np.empty(x.shape, np.float32)
    for a in range(0, x.shape[0], chunk):  # float64 a chunk of rows at a time
        np.multiply(x[a : a + chunk], inv[a : a + chunk, None], out=out[a : a + chunk],
                    casting="same_kind")  # fmt: skip
    return out


def _job(model, knobs: Knobs | None, given: dict) -> tuple[Job, Backend]:
    """prepare's job: ``model`` itself (a Job, then nothing else given), or one from the
    keywords, the knobs parsed once (those the backend and design take)."""
    if isinstance(model, Job):
        if given or knobs is not None:
            extra = ", ".join(given) or "knobs"
            raise InputError(f"prepare: the Job carries its knobs and parameters; got {extra} too")
        return model, get_backend(model.backend)
    be = get_backend(given.pop("backend", Job.backend))
    design = given.pop("design", Job.design)
    row_normalize = bool(given.pop("row_normalize", False))
    stream_rows = int(given.pop("stream_rows", None) or 0)
    knobs = Knobs.parse(given, takes=be.takes(design), job=be.job(design), base=knobs)
    job = Job(model=model or Job.model, design=design, backend=be.name, knobs=knobs,
              row_normalize=row_normalize, stream_rows=stream_rows)  # fmt: skip
    return job, be
