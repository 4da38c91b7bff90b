"""Full-graph training: data on each rank, the Trainer loop, metrics and checkpoints."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .backend import Backend, assign, backend_of, to_host
from .distgraph import DistGraph
from .graph.dataset import Dataset, make_split, random_features
from .nn import MODELS, OPTIMIZERS, GCNConv, GINConv, softmax_cross_entropy
from .nn.loss import accuracy
from .progress import progress

FEATURELESS_IDENTITY_MAX = 200_000  # up to this many nodes, featureless graphs get one-hot ids
SPARSE_FEATURES_DENSITY = 0.1  # dense features at most this full (and >= 256 wide) go CSR


@dataclass
class LocalData:
    """This rank's rows of the node data (n = ub - lb).

    x  float32 [n, F] dense or scipy CSR;  y int64 [n];  masks bool [n]
    """

    x: np.ndarray | sp.csr_matrix
    y: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_features: int
    num_classes: int
    notes: str = ""


def prepare(
    dataset: Dataset,
    comm=None,
    model: str = "gcn",
    *,
    ps: int = 16,
    seed: int = 0,
    row_normalize: bool = False,
    design: str = "pipelined",
    backend: str | Backend = "cpu",
    **knobs,
) -> tuple[DistGraph, LocalData]:
    """Partition ``dataset`` for the job of ``comm`` and slice this rank's node data.

    GCN trains on the graph with self loops and symmetric normalization; GIN on the graph
    without self loops (its (1+eps)·x term is the self contribution). Datasets without a
    split get 20 training and 30 validation nodes per class (seeded); datasets without
    features get one-hot node ids (sparse) or, beyond 200,000 nodes, seeded random ones.
    Wide dense features that are mostly zeros (bag-of-words) are stored sparse.
    ``row_normalize`` scales each feature row to sum 1 (Kipf & Welling's preprocessing).
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if dataset.y is None:
        raise ValueError(f"dataset {dataset.name!r} has no labels: node classification needs them")
    g = dataset.graph.gcn_norm() if model == "gcn" else dataset.graph.remove_self_loops()
    dg = DistGraph.build(g, comm, ps, design=design, backend=backend, **knobs)
    lb, ub, n = dg.lb, dg.ub, dataset.graph.num_nodes
    c = int(dataset.num_classes)
    notes = ""
    if dataset.train_mask is None:
        masks = make_split(dataset.y, c, 20, 30, seed=seed)
        notes = "split: 20 train / 30 val per class (seeded), the rest test"
    else:
        masks = (dataset.train_mask, dataset.val_mask, dataset.test_mask)
    if dataset.x is None:
        if n <= FEATURELESS_IDENTITY_MAX:
            x = sp.identity(n, np.float32, format="csr")[lb:ub]
            notes += "; features: one-hot node ids"
        else:
            x = random_features(seed, lb, ub, 64)
            notes += "; features: 64 seeded random"
    else:
        x = dataset.x[lb:ub]
        x = sp.csr_matrix(x) if sp.issparse(x) else np.array(x, np.float32)
        if (
            not sp.issparse(x)
            and x.shape[1] >= 256
            and x.size
            and np.count_nonzero(x) <= SPARSE_FEATURES_DENSITY * x.size
        ):
            x = sp.csr_matrix(x)  # bag-of-words: the first layer multiplies it sparse
        if row_normalize:
            x = _row_normalize(x)
            notes += "; features: rows normalized to sum 1"
    data = LocalData(
        x,
        dataset.y[lb:ub],
        *(np.asarray(m[lb:ub], bool) for m in masks),
        num_features=int(x.shape[1]),
        num_classes=c,
        notes=notes.strip("; "),
    )
    up = dg.backend.to_device
    data.x, data.y = up(data.x), up(data.y)
    data.train_mask, data.val_mask, data.test_mask = (
        up(m) for m in (data.train_mask, data.val_mask, data.test_mask)
    )
    return dg, data


class Trainer:
    """Full-graph training of ``model`` on this rank's share of the graph.

    Every rank runs the same steps (SPMD): forward, loss over the global train mask,
    backward (aggregations over the transposed plan), one allreduce of all weight
    gradients, and the same optimizer step, so the weights stay identical on every rank;
    ``check_sync`` verifies that with a hash after each step.
    """

    def __init__(
        self,
        graph: DistGraph,
        data: LocalData,
        model,
        optimizer,
        *,
        tune: bool = False,
        config: dict | None = None,
        tune_space: dict | None = None,
        tune_start: dict | None = None,
        tune_budget: int = 12,
        check_sync: bool = False,
        checkpoint_dir=None,
        checkpoint_every: int = 0,
        eval_every: int = 1,
        log=None,
        progress_bar=None,
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
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.checkpoint_every = checkpoint_every
        self.eval_every = eval_every
        self.log = log if self.lead else None
        self.progress_bar = progress_bar
        self.epoch = 0
        self.history: list[dict] = []
        self.tune, self.tune_space, self.tune_start = tune, tune_space, tune_start
        self.tune_budget = tune_budget
        self.tuning: dict | None = None  # the search's result once it ran
        if config:
            graph.configure(**config)

    # ---- one step --------------------------------------------------------------------
    def train_step(self) -> tuple[float, float]:
        """One full-graph training step; returns (loss, seconds)."""
        t0 = time.perf_counter()
        m, d = self.model, self.data
        m.train()
        m.set_epoch(self.epoch)
        m.zero_grad()
        logits = m.forward(d.x, self.g)
        loss, dlogits, _, _ = softmax_cross_entropy(logits, d.y, d.train_mask, self.comm)
        if not np.isfinite(loss):
            raise FloatingPointError(
                f"the loss is {loss} at epoch {self.epoch}: lower the "
                "learning rate, or check the features for NaN/inf"
            )
        m.backward(dlogits)
        self._sum_gradients()
        self.opt.step()
        self.epoch += 1
        if self.check_sync:
            self._check_weights_agree()
        return loss, time.perf_counter() - t0

    def _sum_gradients(self) -> None:
        if self.comm is None:
            return
        params = self.model.parameters()
        flat = to_host(np.concatenate([p.grad.ravel() for p in params]))
        flat = self.comm.allreduce(flat)  # on the host: the MPI wheel is not CUDA-aware
        flat = backend_of(params[0].grad).to_device(flat)
        i = 0
        for p in params:
            p.grad[...] = flat[i : i + p.grad.size].reshape(p.grad.shape)
            i += p.grad.size

    def weights_digest(self) -> str:
        h = hashlib.sha1()
        for p in self.model.parameters():
            h.update(np.ascontiguousarray(to_host(p.value)).tobytes())
        return h.hexdigest()

    def _check_weights_agree(self) -> None:
        if self.comm is None:
            return
        digests = self.comm.allgather(self.weights_digest())
        if len(set(digests)) != 1:
            raise RuntimeError(f"weights diverged across ranks after epoch {self.epoch}: {digests}")

    # ---- evaluation ------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Loss on the train mask and accuracy on train, val and test (no dropout)."""
        m, d = self.model, self.data
        m.eval()
        logits = m.forward(d.x, self.g)
        loss = softmax_cross_entropy(logits, d.y, d.train_mask, self.comm)[0]
        return {
            "loss": loss,
            **{
                f"{k}_acc": accuracy(logits, d.y, getattr(d, f"{k}_mask"), self.comm)
                for k in ("train", "val", "test")
            },
        }

    def summary(self) -> dict:
        """The final evaluation, losses, median epoch time, communication volume and the
        configuration of the run so far (collective)."""
        final = self.evaluate()
        times = [h["seconds"] for h in self.history]
        return {
            "losses": [h["loss"] for h in self.history],
            **{k: final[k] for k in ("train_acc", "val_acc", "test_acc")},
            "epoch_time_s": float(np.median(times)) if times else None,
            "bytes_per_epoch": self.bytes_per_epoch(),
            "history": self.history,
            "config": getattr(self.model, "config", {}),
            "graph_config": self.g.config,
            "tuning": self.tuning,
        }

    # ---- the loop --------------------------------------------------------------------
    def fit(self, epochs: int) -> list[dict]:
        """Train until ``epochs`` epochs in total are done (so a resumed run continues)."""
        if self.tune and self.tuning is None and self.epoch < epochs:
            self._search(epochs)
        bar = progress(total=epochs, desc="train", unit="epoch", enable=self.progress_bar)
        bar.update(self.epoch)
        with bar:
            while self.epoch < epochs:
                loss, secs = self.train_step()
                rec = {"epoch": self.epoch, "loss": loss, "seconds": secs}
                if self.eval_every and (self.epoch % self.eval_every == 0 or self.epoch == epochs):
                    ev = self.evaluate()
                    rec.update({k: ev[k] for k in ("train_acc", "val_acc", "test_acc")})
                self.history.append(rec)
                bar.update()
                bar.set_postfix(loss=f"{loss:.4f}", val=f"{rec.get('val_acc', float('nan')):.3f}")
                # every epoch of a short run, about 20 lines of a long one
                if self.log and (epochs <= 50 or self.epoch % max(1, epochs // 20) == 0):
                    acc = (
                        ""
                        if "val_acc" not in rec
                        else f"  train {rec['train_acc']:.3f}  val {rec['val_acc']:.3f}"
                    )
                    self.log(f"epoch {self.epoch:4d}  loss {loss:.4f}{acc}  {secs * 1e3:8.1f} ms")
                if (
                    self.checkpoint_dir
                    and self.checkpoint_every
                    and self.epoch % self.checkpoint_every == 0
                ):
                    self.save_checkpoint(self.checkpoint_dir / f"epoch{self.epoch:05d}.npz")
        return self.history

    # ---- tuning ----------------------------------------------------------------------
    def _search(self, epochs: int) -> None:
        """MGG's cross-iteration search, each measurement a real training step (the
        slowest rank's time, as every measurement in mgg.designs.check)."""
        from .designs.check import slowest
        from .tuner import default_space, search

        space = self.tune_space or default_space(self.g.backend.device())

        def measure(cfg):
            self.g.configure(**cfg)
            setup = self.g.stats["setup_seconds"]
            loss, secs = self.train_step()
            secs -= self.g.stats["setup_seconds"] - setup  # design allocation
            secs = float(slowest(self.comm, [secs])[0])
            self.history.append(
                {"epoch": self.epoch, "loss": loss, "seconds": secs, "config": dict(cfg)}
            )
            return secs

        res = search(
            space,
            measure,
            start=self.tune_start,
            max_measurements=min(self.tune_budget, epochs - self.epoch),
        )
        self.g.configure(**res.best)
        self.tuning = res.to_json()
        if self.log:
            self.log(
                f"tuned {res.best} in {res.measured} measured steps: "
                f"{res.best_latency * 1e3:.1f} ms (start {res.start_latency * 1e3:.1f} ms)"
            )

    # ---- checkpoints -----------------------------------------------------------------
    def save_checkpoint(self, path) -> Path:
        """Rank 0 writes weights, optimizer state, epoch and history (weights are the same
        on every rank); collective."""
        path = Path(path)
        if self.lead:
            path.parent.mkdir(parents=True, exist_ok=True)
            arrays = {
                f"param/{k}": to_host(p.value) for k, p in self.model.named_parameters().items()
            }
            arrays.update(
                {f"opt/{k}": np.asarray(to_host(v)) for k, v in self.opt.state_dict().items()}
            )
            meta = {
                "epoch": self.epoch,
                "history": self.history,
                "config": getattr(self.model, "config", {}),
                "graph_config": self.g.config,
                "tuning": self.tuning,
            }
            tmp = path.with_suffix(".tmp.npz")
            np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
            tmp.replace(path)
        if self.comm is not None:
            self.comm.barrier()
        return path

    def load_checkpoint(self, path) -> None:
        """Collective: rank 0 reads the checkpoint and every rank takes its state."""
        state = None
        if self.lead:
            with np.load(path, allow_pickle=False) as z:
                state = {k: z[k] for k in z.files}
        if self.comm is not None:
            state = self.comm.bcast(state)
        meta = json.loads(str(state["meta"]))
        cfg = getattr(self.model, "config", {})
        if meta.get("config") and cfg and meta["config"] != cfg:
            raise ValueError(f"checkpoint {path} is for model {meta['config']}, not {cfg}")
        params = self.model.named_parameters()
        for k, p in params.items():
            v = state.get(f"param/{k}")
            if v is None or v.shape != p.value.shape:
                raise ValueError(
                    f"checkpoint {path}: parameter {k} missing or of shape "
                    f"{None if v is None else v.shape}, expected {p.value.shape}"
                )
            assign(p.value, v)
        self.opt.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("opt/")})
        self.epoch = int(meta["epoch"])
        self.history = list(meta["history"])
        if meta.get("graph_config"):
            self.g.configure(**meta["graph_config"])
        self.tuning = meta.get("tuning")

    # ---- communication volume --------------------------------------------------------
    def bytes_per_epoch(self) -> dict:
        """Bytes of peer rows one training epoch reads, aggregating at the smaller width
        (what mgg does) and at the layer's input width (the naive order); all ranks."""
        rows = np.array([self.g.halo_rows(False), self.g.halo_rows(True)], np.float64)
        if self.comm is not None:
            rows = self.comm.allreduce(rows)
        item = self.g.dtype.itemsize
        out = {}
        for name, smaller in (("smaller_width", True), ("input_width", False)):
            total = 0.0
            for layer in self.model.layers:
                if isinstance(layer, (GCNConv, GINConv)):
                    fwd, bwd = _aggregation_widths(layer, smaller)
                    total += rows[0] * fwd + rows[1] * bwd
            out[name] = total * item
        return out


def _aggregation_widths(layer, smaller: bool) -> tuple[int, int]:
    """(forward width, total backward width) of one conv layer's aggregations."""
    narrow = layer.out_dim if isinstance(layer, GCNConv) else layer.hidden
    if smaller and narrow < layer.in_dim:
        return narrow, narrow  # transform first: the backward one is needed for dW
    return layer.in_dim, layer.in_dim if layer.input_grad else 0


def _row_normalize(x):
    sums = np.asarray(abs(x).sum(axis=1)).ravel()
    inv = np.where(sums > 0, 1.0 / np.where(sums > 0, sums, 1.0), 0.0).astype(np.float32)
    if sp.issparse(x):
        return sp.csr_matrix(sp.diags(inv) @ x, dtype=np.float32)
    return x * inv[:, None]


def build_model(
    name: str,
    data: LocalData,
    *,
    hidden: int | None = None,
    layers: int | None = None,
    dropout: float = 0.5,
    seed: int = 0,
    **kw,
):
    """GCN (default 2 x 16, MGG §5) or GIN (default 5 x 64)."""
    cls = MODELS[name]
    defaults = {"gcn": (16, 2), "gin": (64, 5)}[name]
    return cls(
        data.num_features,
        hidden or defaults[0],
        data.num_classes,
        num_layers=layers or defaults[1],
        dropout=dropout,
        seed=seed,
        **kw,
    )


def build_optimizer(name: str, model, lr: float, weight_decay: float):
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](model.parameters(), lr=lr, weight_decay=weight_decay)
