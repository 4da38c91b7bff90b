"""Full-graph training of torch models: data on each rank, the Trainer loop, metrics and
checkpoints."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from . import checkpoint, optim, precision, process
from .arrays import to_host
from .backend import Backend, get_backend
from .comm import on_root
from .distgraph import DistGraph
from .errors import DivergedError, InputError
from .graph.dataset import Dataset, random_features
from .graph.papers import PapersDataset
from .harness.timing import slowest
from .knobs import DEFAULTS, Knobs, space
from .memory import FEATURELESS_IDENTITY_MAX, FEATURELESS_WIDTH
from .partition import order as node_order
from .partition.plan import job_plan
from .partition.shards import ShardedDataset
from .precision import as_rows
from .progress import progress
from .torch import (
    ChunkedRows,
    HostRows,
    InputRows,
    SparseRows,
    as_features,
    graph_kind,
    save_model,
    sync_gradients,
)
from .torch.graphs import CapturedStep
from .torch.models import check_rows_of
from .tuner import Protocol, Workload, drive

FLOAT32_SAFE = float(np.sqrt(np.finfo(np.float32).max))  # larger values' products overflow
SPARSE_FEATURES_DENSITY = 0.1  # dense features at most this full (and >= 256 wide) go CSR
UNREAD_MAX = 100  # steps whose losses wait on the device at most (then read_losses runs)


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
    model: str = "gcn",
    *,
    knobs: Knobs | None = None,
    seed: int = 0,
    row_normalize: bool = False,
    design: str = "pipelined",
    backend: str | Backend = "cpu",
    source: dict | None = None,
    order_file=None,
    keep_source: bool = False,
    stream_rows: int | None = None,
    **given,
) -> tuple[DistGraph, LocalData]:
    """This rank's plan and node data for the job of ``comm``.

    ``dataset``: a Dataset (partitioned here, on every rank) or a ShardedDataset (rank r
    opens only its shard, partitioned beforehand by ``mgg partition --out``).
    ``model``: a registered model name (its layers say which graph they expect) or a graph
    kind of ``job_graph``. ``knobs`` (mgg.knobs.Knobs) and knob keywords (``ps=``,
    ``dist=``, ``window=``, ``split=``, ...: those the backend and design take) configure
    the job; a sharded dataset keeps its own ps unless one is given, and its split. Datasets
    without a split get 20 training and 30 validation nodes per class (seeded); datasets
    without features get one-hot node ids (sparse) or, beyond 200,000 nodes, seeded random
    ones. Wide dense features that are mostly zeros (bag-of-words) are stored sparse.
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
    mgg.memory.plan says when they do not fit on the device beside the rest).
    """
    if comm is None and process.job_size() > 1:
        raise InputError(
            f"prepare: this process is one of {process.job_size()} ranks but no comm was "
            "given, so it would train on the whole graph alone: pass comm=get_comm()"
        )
    kind = graph_kind(model)
    be = get_backend(backend)
    knobs = Knobs.parse(given, takes=be.takes(design), job=be.job(design), base=knobs)
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


@dataclass
class _Unread:
    """A step whose loss is still on the device: its history record, this rank's share of
    the loss (a 0-d tensor) and the step's start and end marks (Trainer._mark)."""

    rec: dict
    loss: torch.Tensor
    start: object
    end: object


class Trainer:
    """Full-graph training of a torch ``model`` (``model(x, g)`` -> logits [n, C] over this
    rank's rows) with any torch.optim ``optimizer``.

    Every rank runs the same steps (SPMD): forward, the cross-entropy over the global train
    mask (each rank its share), backward (aggregations over the transposed plan), one
    allreduce of all gradients, the same optimizer step, so the weights stay identical on
    every rank; ``check_sync`` verifies that with a hash after each step. A step never waits
    for the device (beyond MPI's allreduce when P > 1): its loss is read later, with every
    loss not yet read, where fit prints or evaluates, at checkpoints and at its end
    (:meth:`read_losses`).

    Multi-label targets (``data.y`` 0/1 [n, T], C = T, as ogbn-proteins): the loss is the
    binary cross-entropy with logits averaged over train rows and tasks, and the metric
    (still reported as train_acc / val_acc / test_acc) is OGB's ROC-AUC over each global
    split (:func:`rocauc`); ``metric`` says which.

    ``checkpoint_dir``: rank 0 locks it for the trainer's life and fit() writes a
    checkpoint there every ``checkpoint_every`` epochs (0: none between) and after the
    last. ``select``: which weights the run ends with (:meth:`summary` leaves the model at
    them): "best-val", those of the evaluated epoch with the highest validation metric
    (the earliest of ties; the default where a validation split exists and ``eval_every``
    evaluates), or "last". ``patience``: fit() stops once that many epochs passed since
    the best validation epoch (0: never). ``log_dir``: rank 0 writes each epoch's record
    there (mgg.curves.RunLog: JSON lines, TensorBoard, a PNG at the end). ``tune``:
    search the knobs (``tune_space``, default the device's) in the first epochs; knobs
    this job sets (``config``, flags) are held, not searched. ``cuda_graph``: on a GPU, one
    rank, the step is captured as a CUDA graph after a few eager steps and replayed
    (mgg.torch.graphs): the same step with no host work. ``output_rows`` "labeled": the
    model's last layer computes only the rows of a split, over their in-edges (``model(x,
    g, rows=g.restricted(...))``: mgg.torch.Model with a GCNConv or SAGEConv last), which
    is all the loss and the metrics read; "all" (the default) computes every row.
    :meth:`predict` computes every row either way.
    """

    def __init__(
        self,
        graph: DistGraph,
        data: LocalData,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        tune: bool = False,
        config: Knobs | dict | None = None,
        tune_space: dict | None = None,
        tune_start: dict | None = None,
        tune_budget: int = 40,
        check_sync: bool = False,
        checkpoint_dir=None,
        checkpoint_every: int = 0,
        eval_every: int = 1,
        select: str | None = None,
        patience: int = 0,
        log_dir=None,
        log=None,
        progress_bar=None,
        cuda_graph: bool = False,
        output_rows: str = "all",
    ):
        if data.x.shape[0] != graph.num_local_nodes:
            raise ValueError(
                f"features have {data.x.shape[0]} rows but rank {graph.rank} "
                f"owns {graph.num_local_nodes} nodes"
            )
        self.g, self.data, self.model, self.opt = graph, data, model, optimizer
        self.comm = graph.comm if graph.size > 1 else None
        self.lead = graph.rank == 0
        self.check_sync = check_sync
        if (
            isinstance(checkpoint_every, bool)
            or not isinstance(checkpoint_every, int | np.integer)
            or checkpoint_every < 0
        ):
            raise InputError(
                f"--checkpoint-every must be an integer >= 0 (0: only after the last epoch), "
                f"got {checkpoint_every!r}"
            )
        if checkpoint_every and not checkpoint_dir:
            raise InputError(
                f"--checkpoint-every {checkpoint_every} needs --checkpoint-dir to write them to"
            )
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_every = int(checkpoint_every)
        # rank 0 holds the folder for the trainer's life: a second job there is refused
        self._folder_lock = (
            checkpoint.lock(self.checkpoint_dir, self.comm) if checkpoint_dir else None
        )
        self._resumed_from = None  # the checkpoint whose epoch fit() must not run past
        self._saved = None  # the epoch of the last checkpoint written
        self.eval_every = eval_every
        self.log = log if self.lead else None
        self.progress_bar = progress_bar
        self.epoch = 0
        self.history: list[dict] = []
        self._unread: list[_Unread] = []  # steps whose loss is still on the device
        self.tune, self.tune_space, self.tune_start = tune, tune_space, tune_start
        self.tune_budget = tune_budget
        self.tuning: dict | None = None  # the search's result once it ran
        self.multilabel = data.y.ndim == 2
        self.metric = "rocauc" if self.multilabel else "accuracy"
        self.train_count, val_count = self._sum(
            [float(data.train_mask.sum()), float(data.val_mask.sum())]
        )
        if self.train_count == 0:
            raise ValueError("the train mask is empty on every rank: there is nothing to learn")
        self.select, self.patience = _selection(select, patience, val_count, eval_every)
        self.best: dict | None = None  # the best validation epoch's record
        self._best_state: dict | None = None  # its weights (select best-val)
        self.stopped: int | None = None  # the epoch at which patience ran out
        self.log_dir, self.run_log = log_dir, None
        self.final: dict = {}  # summary()'s evaluation of the selected weights
        self._y, self._masks = data.y, (data.train_mask, data.val_mask, data.test_mask)
        self._labeled = None  # output_rows "labeled": the local rows of a split, int64 [L]
        if output_rows == "labeled":
            kept = torch.nonzero(self._masks[0] | self._masks[1] | self._masks[2]).squeeze(1)
            self._labeled = kept.cpu().numpy()
            self._y, self._masks = self._y[kept], tuple(m[kept] for m in self._masks)
            check_rows_of(model, graph, graph.restricted(self._labeled, "labeled"), None)
        elif output_rows != "all":
            raise InputError(f"--output-rows {output_rows!r}: choose all or labeled")
        # the train rows as indices, once: a boolean mask's indexing waits for the device
        self._train_rows = torch.nonzero(self._masks[0]).squeeze(1)
        if isinstance(config, Knobs):
            graph.configure(config)
        elif config:
            graph.configure(**config)
        if tune:
            self.tune_space = self._space(tune_space)
        self._captured = self._captured_step() if cuda_graph else None

    def _captured_step(self) -> CapturedStep:
        """The step as a CUDA graph (mgg.torch.graphs), where this job can replay one."""
        why = None
        if getattr(self.model, "offload", False):
            why = "--offload allocates host memory for what it saves, which a capture cannot"
        elif not self.g.backend.gpu:
            why = "it needs --backend cuda"
        elif self.comm is not None:
            why = "it runs one rank (a step with peers exchanges rows and gradients over MPI)"
        elif self.tune:
            why = "--tune changes the knobs between steps; tune first (mgg tune), then --config"
        if why:
            raise InputError(f"--cuda-graph: {why}")
        return CapturedStep(self.g, self._step_body, self.data.y.device)

    def _space(self, grid: dict | None) -> dict:
        """The tuner's space with the knobs this job sets (config, flags) held at their
        value; refused when that leaves nothing to search."""
        grid = dict(grid or space(self.g.backend.device()))
        fixed = [k for k in grid if k in self.g.knobs.given]
        if len(fixed) == len(grid):
            raise InputError(
                f"--tune searches {', '.join(grid)}, and --config (or their flags) sets every "
                "one: nothing to tune; drop --tune, or the knobs it should search"
            )
        return {**grid, **{k: [getattr(self.g.knobs, k)] for k in fixed}}

    def _sum(self, values) -> np.ndarray:
        a = np.asarray(values, np.float64)
        return a if self.comm is None else self.comm.allreduce(a)

    def _logits(self, every: bool = False) -> torch.Tensor:
        """The model's logits: [n, C] over this rank's rows, or with output_rows "labeled"
        (unless ``every``) [L, C] over its labeled rows."""
        if self._labeled is None or every:
            out, want = self.model(self.data.x, self.g), self.g.num_local_nodes
        else:
            rows = self.g.restricted(self._labeled, "labeled")
            out, want = self.model(self.data.x, self.g, rows=rows), self._labeled.size
        if out.ndim != 2 or out.shape[0] != want:
            raise ValueError(
                f"the model returned shape {tuple(out.shape)}, expected one row per "
                f"{'labeled ' if want != self.g.num_local_nodes else ''}node of rank "
                f"{self.g.rank}: ({want}, classes)"
            )
        return out

    # ---- one step --------------------------------------------------------------------
    def train_step(self) -> dict:
        """One full-graph training step, which never waits for the device (but for the
        gradients' allreduce when P > 1: MPI is not CUDA-aware). Returns its history record
        {"epoch", "loss", "seconds"}; loss and seconds stay None until :meth:`read_losses`
        reads them (fit does where it prints or evaluates, at checkpoints and at its end;
        at the latest after UNREAD_MAX steps). With ``cuda_graph``: a replay of the
        captured step, after its first eager ones."""
        start = self._mark()
        step = self._step_body if self._captured is None else self._captured
        loss = step(self.epoch)
        self.epoch += 1
        if self.check_sync:
            self._check_weights_agree()
        rec = {"epoch": self.epoch, "loss": None, "seconds": None}
        self._unread.append(_Unread(rec, loss, start, self._mark()))
        if len(self._unread) >= UNREAD_MAX:
            self.read_losses()
        return rec

    def _step_body(self, epoch: int) -> torch.Tensor:
        """Forward, loss, backward, gradient sum, optimizer step: the step's loss (0-d)."""
        self.model.train()
        self.g.begin_step(epoch)
        self.opt.zero_grad()
        logits = self._logits()
        loss = self._loss_sum(logits, self._train_rows) / self.train_count
        loss.backward()
        sync_gradients(self.model.parameters(), self.comm)
        self.opt.step()
        return loss.detach()

    def read_losses(self, extra=()) -> np.ndarray:
        """Collective: fill in the loss (summed over the ranks) and seconds of every step
        not read yet, in one host transfer and, when P > 1, one allreduce; DivergedError
        naming the first epoch whose loss is not finite. ``extra``: more 0-d tensors to sum
        over the ranks in the same transfer and allreduce; returns their sums (float64
        [len(extra)])."""
        unread, self._unread = self._unread, []
        parts = [t.to(torch.float64).reshape(1) for t in extra]
        if unread:
            parts.insert(0, torch.stack([u.loss for u in unread]).to(torch.float64))
        if not parts:
            return np.zeros(0)
        total = self._sum(torch.cat(parts).cpu().numpy())
        for u, loss in zip(unread, total, strict=False):
            if not np.isfinite(loss):
                raise DivergedError(self._not_finite(float(loss), u.rec["epoch"]))
            u.rec["loss"], u.rec["seconds"] = float(loss), _seconds(u.start, u.end)
        return total[len(unread) :]

    def _mark(self):
        """Now, on the steps' clock: an event on the device's stream (timed once read,
        without waiting for it here) on a GPU, the host's clock on a CPU."""
        if not self.g.backend.gpu:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _not_finite(self, total: float, epoch: int) -> str:
        """What a NaN/inf loss at ``epoch`` (1-based) means (collective): the features are
        not finite, or too large for float32 arithmetic (beyond sqrt(float32 max) their
        products overflow); the model overflows on its first step (no optimizer step
        before it); else the learning rate made training diverge."""
        x = self.data.x
        if isinstance(x, SparseRows):
            v = torch.as_tensor(to_host(x.m.data))
        else:
            v = x.rows if isinstance(x, ChunkedRows) else x.detach()
        ok = torch.isfinite(v)
        local = [float((~ok).sum()), float(v[ok].abs().max()) if bool(ok.any()) else 0.0]
        if self.comm is not None:
            every = np.array(self.comm.allgather(local))
            local = [every[:, 0].sum(), every[:, 1].max()]
        bad, big = local
        name = self.data.identity.get("dataset")
        what = f"the features of {name!r}" if name else "the input features"
        rows = precision.name(self.g.dtype)
        rows = "" if rows == "float32" else f" ({rows} rows)"
        loss = f"the loss is {total} at epoch {epoch}{rows}"
        if bad:
            return f"{loss}: {what} hold {bad:.0f} NaN/inf values (not a learning-rate problem)"
        if big > FLOAT32_SAFE:
            return (
                f"{loss}: {what} reach {big:.3g} in magnitude, which overflows float32 "
                f"arithmetic (products beyond {np.finfo(np.float32).max:.3g}): scale them "
                "down, e.g. --row-normalize (not a learning-rate problem)"
            )
        if epoch == 1:
            return (
                f"{loss}, before any optimizer step (not a learning-rate problem): the "
                f"model's float32 arithmetic overflows on {what} (up to {big:.3g} in "
                "magnitude) with its initial weights"
            )
        lr = self.opt.param_groups[0].get("lr")
        return f"training diverged: {loss} (learning rate {lr:g}): lower the learning rate"

    def weights_digest(self) -> str:
        h = hashlib.sha1()
        for t in self.model.state_dict().values():
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def _check_weights_agree(self) -> None:
        if self.comm is None:
            return
        digests = self.comm.allgather(self.weights_digest())
        if len(set(digests)) != 1:
            raise RuntimeError(f"weights diverged across ranks after epoch {self.epoch}: {digests}")

    def _loss_sum(self, logits, rows) -> torch.Tensor:
        """The loss summed over ``rows`` (an index tensor; multi-label: averaged over
        tasks), a 0-d tensor on the device."""
        out, y = logits.index_select(0, rows), self._y.index_select(0, rows)
        out = out.float() if out.dtype == torch.bfloat16 else out  # the loss in float32
        if self.multilabel:  # y float32 (prepare)
            return F.binary_cross_entropy_with_logits(out, y, reduction="sum") / y.shape[1]
        return F.cross_entropy(out, y, reduction="sum")

    # ---- evaluation ------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, logits: torch.Tensor | None = None) -> dict:
        """Loss on the train mask and accuracy (multi-label: ROC-AUC) on train, val and test
        (no dropout) of the model's ``logits`` [n, C] (with output_rows "labeled": [L, C]
        over the labeled rows; None: computed here); None for a
        split that is empty (or, ROC-AUC, has no task with both a positive and a negative).
        Collective."""
        if logits is None:
            self.model.eval()
            logits = self._logits()
        local = [self._loss_sum(logits, self._train_rows)]
        masks = self._masks
        if self.multilabel:
            tot = self.read_losses(local)  # with the steps' losses: one read
            acc = self._global_rocauc(logits, masks)
        else:
            right = logits.argmax(1) == self._y
            for mask in masks:
                local += [(right & mask).sum(), mask.sum()]
            tot = self.read_losses(local)
            acc = [tot[i] / tot[i + 1] if tot[i + 1] else None for i in (1, 3, 5)]
        acc = [None if a is None or not np.isfinite(a) else float(a) for a in acc]
        return {
            "loss": float(tot[0] / self.train_count),
            **dict(zip(("train_acc", "val_acc", "test_acc"), acc, strict=True)),
        }

    @torch.no_grad()
    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's predictions by original node id, without dropout (collective: the
        forward pass is): (ids int64 [n], classes int64 [n], or for multi-label targets
        sigmoid scores float32 [n, T]). mgg.infer writes every node's to files."""
        self.model.eval()
        logits = self._logits(every=True)
        out = torch.sigmoid(logits.float()) if self.multilabel else logits.argmax(1)
        return self.data.node_ids, out.cpu().numpy()

    def _global_rocauc(self, logits, masks) -> list[float]:
        """ROC-AUC of each mask's rows over all ranks: rank 0 gathers the scores and
        targets, computes, and broadcasts (collective)."""
        scores = logits.detach().float().cpu().numpy()
        targets = self._y.cpu().numpy().astype(np.int8)
        mine = [(scores[m], targets[m]) for m in (m.cpu().numpy() for m in masks)]
        if self.comm is None:
            return [rocauc(t, s) for s, t in mine]
        parts = self.comm.gather(mine, root=0)
        result = None
        if parts is not None:
            with self.comm.alone():
                result = [
                    rocauc(
                        np.concatenate([p[i][1] for p in parts]),
                        np.concatenate([p[i][0] for p in parts]),
                    )
                    for i in range(len(masks))
                ]
        return self.comm.bcast(result, root=0)

    def summary(self) -> dict:
        """The final evaluation of the selected weights (the model is left at them:
        :meth:`restore_selected`), losses, median epoch time, communication volume and the
        configuration of the run so far (collective). ``metric``: "accuracy", or "rocauc"
        for multi-label targets (then in train_acc / val_acc / test_acc); ``selected_epoch``:
        the epoch whose weights these are; ``stopped_epoch``: where patience stopped fit,
        or None."""
        selected = self.restore_selected()
        final = self.evaluate()
        self.final = {**final, "selected_epoch": selected}
        times = [h["seconds"] for h in self.history]
        if self.run_log is not None:
            self.run_log.close(selected if self.select == "best-val" else None)
        return {
            "losses": [h["loss"] for h in self.history],
            **{k: final[k] for k in ("train_acc", "val_acc", "test_acc")},
            "metric": self.metric,
            "select": self.select,
            "selected_epoch": selected,
            "stopped_epoch": self.stopped,
            "epoch_time_s": float(np.median(times)) if times else None,
            "bytes_per_epoch": self.bytes_per_epoch,
            "history": self.history,
            "config": getattr(self.model, "config", {}),
            "graph_config": self.g.config,
            "tuning": self.tuning,
        }

    def save_model(self, folder) -> Path:
        """Collective: the model at the weights it holds (after :meth:`summary`, the
        selected ones) into ``folder``, which must not exist (mgg.torch.save_model), with
        what uses it again: the rows' dtype, the knobs, the node order, the data it was
        trained on, and the selected epoch and its scores."""
        final = self.final
        info = {
            "dtype": precision.name(self.g.dtype),
            "knobs": self.g.config,
            "order": self.data.order,
            "data": self.data.identity,
            "metric": self.metric,
            "epochs": self.epoch,
            "ranks": self.g.size,
            "select": self.select,
            "selected_epoch": final.get("selected_epoch"),
            "scores": {k: final.get(k) for k in ("train_acc", "val_acc", "test_acc")},
        }
        return save_model(folder, self.model, info, self.comm)

    # ---- the loop --------------------------------------------------------------------
    def fit(self, epochs: int) -> list[dict]:
        """Train until ``epochs`` epochs in total are done (so a resumed run continues);
        with a checkpoint folder, a checkpoint every ``checkpoint_every`` epochs and one
        after the last."""
        if isinstance(epochs, bool) or not isinstance(epochs, int | np.integer) or epochs < 0:
            raise InputError(
                f"epochs (--epochs) must be an integer >= 0 (the total; 0: only evaluate), "
                f"got {epochs!r}"
            )
        if self._resumed_from is not None:
            checkpoint.check_epochs(self._resumed_from, self.epoch, epochs)
            self._resumed_from = None
        start = self.epoch
        self._open_log()
        if self.tune and self.tuning is None and self.epoch < epochs:
            self._search(epochs)
        bar = progress(total=epochs, desc="train", unit="epoch", enable=self.progress_bar)
        bar.update(self.epoch)
        # the losses are read where a line shows them, if any rank shows one: at the same
        # epochs on every rank (a read is collective)
        shown = bool(self._sum([self.log is not None or not bar.disable])[0])
        with bar:
            while self.epoch < epochs:
                before = self.g.stats["remote_bytes"]
                rec = self.train_step()
                self._bytes = self.g.stats["remote_bytes"] - before
                if self.eval_every and (self.epoch % self.eval_every == 0 or self.epoch == epochs):
                    ev = self.evaluate()  # reads the losses too
                    rec.update({k: ev[k] for k in ("train_acc", "val_acc", "test_acc")})
                    self._consider(rec)
                self.history.append(rec)
                self._write_log()
                # every epoch of a short run, about 20 lines of a long one
                line = epochs <= 50 or self.epoch % max(1, epochs // 20) == 0
                if line and shown:
                    self.read_losses()
                bar.update()
                if rec["loss"] is not None:
                    bar.set_postfix(loss=f"{rec['loss']:.4f}", val=metric(rec.get("val_acc")))
                if self.log and line:
                    acc = (
                        ""
                        if "val_acc" not in rec
                        else f"  train {metric(rec['train_acc'])}  val {metric(rec['val_acc'])}"
                    )
                    self.log(
                        f"epoch {self.epoch:4d}  loss {rec['loss']:.4f}{acc}  "
                        f"{rec['seconds'] * 1e3:8.1f} ms"
                    )
                if self.checkpoint_every and self.epoch % self.checkpoint_every == 0:
                    self._checkpoint()
                if self.patience and self.best and self.epoch - self.best["epoch"] >= self.patience:
                    self.stopped = self.epoch
                    if self.log:
                        self.log(
                            f"stopped at epoch {self.epoch}: no better validation "
                            f"{self.metric} in {self.patience} epochs (best: epoch "
                            f"{self.best['epoch']}, {metric(self.best['val_acc'])})"
                        )
                    break
        self.read_losses()
        self._write_log()
        if self.epoch > start and self._saved != self.epoch:
            self._checkpoint()  # after the last epoch (the search's too)
        return self.history

    def _consider(self, rec: dict) -> None:
        """Keep ``rec`` (an evaluated epoch's record) as the best one when its validation
        metric beats the best so far, and under best-val its weights."""
        val = rec.get("val_acc")
        if val is None or (self.best is not None and val <= self.best["val_acc"]):
            return
        self.best = {k: rec[k] for k in ("epoch", "train_acc", "val_acc", "test_acc")}
        if self.select == "best-val":
            self._best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def restore_selected(self) -> int:
        """Load the selected weights into the model (best-val: the best validation epoch's,
        where one was evaluated); returns the selected epoch."""
        if self.select == "best-val" and self._best_state is not None:
            self.model.load_state_dict(self._best_state)
            return self.best["epoch"]
        return self.epoch

    def _open_log(self) -> None:
        """Collective: rank 0 opens the run log of ``log_dir`` (with the history so far,
        after a resume), every rank raising its error."""
        if self.log_dir is None or self.run_log is not None:
            return
        from .curves import RunLog

        self.run_log = on_root(self.comm, lambda: RunLog(self.log_dir, self.metric, self.history),
                               (InputError, OSError), InputError, share=False)  # fmt: skip
        if self.run_log is not None and self.run_log.note and self.log:
            self.log(f"--log-dir: {self.run_log.note}")

    def _write_log(self) -> None:
        if self.run_log is not None:
            self.run_log.add(self.history)

    def _checkpoint(self) -> None:
        if self.checkpoint_dir:
            self.save_checkpoint(self.checkpoint_dir / f"epoch{self.epoch:05d}.pt")
            self._saved = self.epoch

    @property
    def bytes_per_epoch(self) -> float | None:
        """Bytes of peer rows the last training step read, over all ranks (collective)."""
        mine = getattr(self, "_bytes", None)
        if mine is None:
            return None
        return float(self._sum([mine])[0])

    # ---- tuning ----------------------------------------------------------------------
    def _search(self, epochs: int) -> None:
        """The tuner's driver (mgg.tuner.drive), each sample a real training step (the
        slowest rank's time, as every measurement of mgg.harness.timing), within
        ``tune_budget`` epochs; from the model's guess unless ``tune_start`` is given."""

        def measure(cfg):
            self.g.configure(**cfg)
            setup = self.g.stats["setup_seconds"]
            rec = self.train_step()
            self.read_losses()  # the step's whole time, its device work included
            secs = rec["seconds"] - (self.g.stats["setup_seconds"] - setup)  # design allocation
            rec.update(seconds=float(slowest(self.comm, [secs])[0]), config=dict(cfg))
            self.history.append(rec)
            return rec["seconds"]

        be = self.g.backend
        width = getattr(self.model, "config", {}).get("hidden", 16)
        # epochs are dear: fewer samples each (three: the run's first epoch is slow)
        budget = min(self.tune_budget, epochs - self.epoch)
        protocol = Protocol(
            min_samples=3, max_samples=5, max_configs=10, final_rounds=1, budget=budget
        )
        tuned = drive(
            measure,
            device=be.device(),
            work=Workload.of(self.g.plan, width, self.g.dtype.itemsize),
            mode="p2p" if be.gpu else "get",
            knobs=replace(self.g.knobs, **self.g.config),  # threads as numba runs them
            search_space=self.tune_space,
            windows=self.g.window_choices,
            start=self.tune_start or "model",
            protocol=protocol,
        )
        res = tuned.result
        if tuned.window and self.log:
            times = ", ".join(f"{w} {t * 1e3:.1f} ms" for w, t in tuned.window_latency.items())
            self.log(f"window {tuned.window} ({times} a step)")
        self.g.configure(**tuned.best)
        self.tuning = res.to_json()
        if tuned.window:
            self.tuning.update(window=tuned.window, window_latency_s=tuned.window_latency)
        if self.log:
            self.log(
                f"tuned {res.best} in {res.samples} steps over {res.measured} configurations: "
                f"{res.best_latency * 1e3:.1f} ms (start {res.start_latency * 1e3:.1f} ms, "
                f"noise {res.noise:.1%}, confidence {res.confidence:.0%})"
            )

    # ---- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, path) -> Path:
        """Rank 0 writes the model's and the optimizer's state dicts with the trainer's
        state (epoch, history, configuration), atomically (mgg.checkpoint); collective."""
        self.read_losses()  # the history it keeps has every loss
        meta = {
            "epoch": self.epoch,
            "history": self.history,
            "config": getattr(self.model, "config", {}),
            "optimizer": type(self.opt).__name__,
            "graph_config": self.g.config,
            "tuning": self.tuning,
            "ranks": self.g.size,
            "dtype": precision.name(self.g.dtype),
            "order": self.data.order,
            "select": self.select,
            "best": self.best,
            **({"data": self.data.identity} if self.data.identity else {}),
        }
        return checkpoint.save(path, self.model, self.opt, meta, self.comm, self._best_state)

    def load_checkpoint(self, path, epochs: int | None = None) -> None:
        """Collective: rank 0 reads and validates the checkpoint (tensors and plain data
        only, nothing pickled runs; mgg.checkpoint.read), every rank takes its weights,
        optimizer state, epoch and history, and the tuned knobs valid for this job (at any
        rank count; the others are dropped with a note). Refused when it was trained on
        other data or preprocessing flags than ``data.identity`` (a checkpoint that does not
        say: a warning). ``epochs``: the run's total, which the checkpoint's epoch must not
        exceed (else fit() checks it)."""
        meta, best = checkpoint.load(
            path, self.model, self.opt, self.comm, epochs, data=self.data.identity
        )
        self.epoch = meta["epoch"]
        self.best = meta.get("best") if isinstance(meta.get("best"), dict) else None
        self._best_state = best if self.select == "best-val" else None
        if self.select == "best-val" and self.best is not None and best is None:
            self.best = None  # a last-selecting run's: no weights to go back to
        self.history = list(meta.get("history", []))
        self._unread = []  # records of steps the checkpoint replaces
        self.tuning = meta.get("tuning")
        for note in checkpoint.restore_knobs(self.g, meta, self.data.order):
            if self.log:
                self.log(f"checkpoint {path}: {note}")
        self._resumed_from = path if epochs is None else None  # else checked already
        if self._captured is not None:  # a captured step holds the old state and designs
            self._captured = self._captured_step()


SELECT = ("best-val", "last")


def _selection(select, patience, val_count: float, eval_every: int) -> tuple[str, int]:
    """``select`` (None: best-val where a validation split exists and fit evaluates,
    else last) and ``patience``, checked."""
    evaluates = bool(eval_every) and val_count > 0
    if select is None:
        select = "best-val" if evaluates else "last"
    if select not in SELECT:
        raise InputError(f"--select must be one of {', '.join(SELECT)}, got {select!r}")
    if isinstance(patience, bool) or not isinstance(patience, int | np.integer) or patience < 0:
        raise InputError(
            f"--patience must be an integer >= 0 (0: never stop early), got {patience!r}"
        )
    for what, wanted in (
        ("--select best-val", select == "best-val"),
        (f"--patience {patience}", patience),
    ):
        if wanted and not evaluates:
            why = (
                "the validation split is empty on every rank" if eval_every else "--eval-every is 0"
            )
            raise InputError(f"{what} needs validation scores, but {why}")
    return select, int(patience)


def _seconds(start, end) -> float:
    """Seconds between two of Trainer._mark's marks (events: both reached by the device)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


def metric(value) -> str:
    """A metric for people: 3 decimals, '-' where it is undefined (None)."""
    return "-" if value is None else f"{value:.3f}"


def _row_normalize(x):
    sums = np.asarray(abs(x).sum(axis=1)).ravel()
    inv = np.where(sums > 0, 1.0 / np.where(sums > 0, sums, 1.0), 0.0).astype(np.float32)
    if sp.issparse(x):
        return sp.csr_matrix(sp.diags(inv) @ x, dtype=np.float32)
    return x * inv[:, None]


OPTIMIZERS = {"adam": optim.Adam, "sgd": optim.SGD}


def build_optimizer(name: str, model, lr: float, weight_decay: float):
    """An mgg.optim optimizer (torch's fused Adam or SGD) over the model's parameter
    groups (``param_groups`` where the model has them: GCN decays its first layer only)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"the learning rate must be a positive number, got {lr}")
    groups = (
        model.param_groups(weight_decay)
        if hasattr(model, "param_groups")
        else [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    )
    return OPTIMIZERS[name](groups, lr=lr)


def rocauc(y_true, scores) -> float:
    """ROC-AUC as OGB's Evaluator defines it: the mean over tasks (columns) that have both
    a positive and a negative among the rows, ties counted half (average ranks); NaN when
    no task has both. y_true 0/1 [n, T] (or [n]), scores float [n, T] (any monotone scale)."""
    y = np.asarray(y_true)
    s = np.asarray(scores, np.float64)
    if y.ndim == 1:
        y, s = y[:, None], s.reshape(-1, 1)
    pos = (y == 1).sum(axis=0)
    neg = (y == 0).sum(axis=0)
    ok = (pos > 0) & (neg > 0)
    if not ok.any():
        return float("nan")
    pos, neg = pos[ok].astype(np.float64), neg[ok].astype(np.float64)
    rank_sum = np.array([_average_ranks(s[:, j])[y[:, j] == 1].sum() for j in np.flatnonzero(ok)])
    return float(np.mean((rank_sum - pos * (pos + 1) / 2) / (pos * neg)))


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """float64 [n]: 1-based ranks of a [n], tied values sharing their mean rank (as
    scipy.stats.rankdata, whose import costs a second)."""
    order = np.argsort(a, kind="stable")
    v = a[order]
    start = np.ones(a.size, bool)
    start[1:] = v[1:] != v[:-1]
    first = np.flatnonzero(start)
    size = np.diff(np.append(first, a.size))
    ranks = np.empty(a.size)
    ranks[order] = (first + (size + 1) / 2)[np.cumsum(start) - 1]
    return ranks
