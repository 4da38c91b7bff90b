"""The Trainer: full-graph training of a torch model over a job's data (mgg.prepare),
evaluation, best-val selection, checkpoints, the saved model."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import checkpoint, precision
from .comm import on_root
from .distgraph import DistGraph
from .errors import DivergedError, InputError
from .harness.timing import slowest
from .harness.tune import in_training
from .job import Job
from .knobs import Knobs, space
from .metrics import global_rocauc, metric, not_finite, selection
from .prepare import LocalData
from .progress import progress
from .torch import save_model, sync_gradients
from .torch.graphs import CapturedStep
from .torch.models import check_rows_of

UNREAD_MAX = 100  # steps whose losses wait on the device at most (then read_losses runs)


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
        output_rows: str = Job.output_rows,
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
        self.select, self.patience = selection(select, patience, val_count, eval_every)
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
        """Forward, loss, backward, gradient average, optimizer step: the step's loss (0-d)."""
        self.opt.zero_grad()
        loss = self._forward_loss(epoch)
        # sync_gradients averages the ranks' gradients: each backpropagates P x its share
        (loss if self.comm is None else loss * self.g.size).backward()
        sync_gradients(self.model.parameters(), self.comm)
        self.opt.step()
        return loss.detach()

    def _forward_loss(self, epoch: int) -> torch.Tensor:
        """The training loss (0-d, this rank's share of the mean) of a forward pass in
        training mode at ``epoch``, its autograd graph kept."""
        self.model.train()
        self.g.begin_step(epoch)
        return self._loss_sum(self._logits(), self._train_rows) / self.train_count

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
                raise DivergedError(
                    not_finite(
                        self.data, self.g.dtype, self.opt, self.comm, float(loss), u.rec["epoch"]
                    )
                )
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
            acc = global_rocauc(self.comm, logits, self._y, masks)
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
        """The tuner's driver over real training steps (mgg.harness.tune.in_training), each
        sample a step timed on the slowest rank, within ``tune_budget`` epochs."""

        def measure(cfg):
            self.g.configure(**cfg)
            setup = self.g.stats["setup_seconds"]
            rec = self.train_step()
            self.read_losses()  # the step's whole time, its device work included
            secs = rec["seconds"] - (self.g.stats["setup_seconds"] - setup)  # design allocation
            rec.update(seconds=float(slowest(self.comm, [secs])[0]), config=dict(cfg))
            self.history.append(rec)
            return rec["seconds"]

        width = getattr(self.model, "config", {}).get("hidden", 16)
        budget = min(self.tune_budget, epochs - self.epoch)
        self.tuning = in_training(
            self.g, measure, width, budget, self.tune_space, self.tune_start, self.log
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


def _seconds(start, end) -> float:
    """Seconds between two of Trainer._mark's marks (events: both reached by the device)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3
