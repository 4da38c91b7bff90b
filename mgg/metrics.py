"""What a run reports: its metrics (accuracy, OGB's ROC-AUC), how people read them, and
which epoch's weights a run ends with (best-val or last, patience)."""

from __future__ import annotations

import numpy as np
import torch

from . import precision
from .arrays import to_host
from .errors import InputError
from .torch import ChunkedRows, SparseRows

FLOAT32_SAFE = float(np.sqrt(np.finfo(np.float32).max))  # larger values' products overflow


def metric(value) -> str:
    """A metric for people: 3 decimals, '-' where it is undefined (None)."""
    return "-" if value is None else f"{value:.3f}"


SELECT = ("best-val", "last")


def selection(select, patience, val_count: float, eval_every: int) -> tuple[str, int]:
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
    rank_sum = np.array([average_ranks(s[:, j])[y[:, j] == 1].sum() for j in np.flatnonzero(ok)])
    return float(np.mean((rank_sum - pos * (pos + 1) / 2) / (pos * neg)))


def average_ranks(a: np.ndarray) -> np.ndarray:
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


def global_rocauc(comm, logits, y, masks) -> list[float]:
    """ROC-AUC of each mask's rows over all ranks: rank 0 gathers the scores and
    targets, computes, and broadcasts (collective)."""
    scores = logits.detach().float().cpu().numpy()
    targets = y.cpu().numpy().astype(np.int8)
    mine = [(scores[m], targets[m]) for m in (m.cpu().numpy() for m in masks)]
    if comm is None:
        return [rocauc(t, s) for s, t in mine]
    parts = comm.gather(mine, root=0)
    result = None
    if parts is not None:
        with comm.alone():
            result = [
                rocauc(
                    np.concatenate([p[i][1] for p in parts]),
                    np.concatenate([p[i][0] for p in parts]),
                )
                for i in range(len(masks))
            ]
    return comm.bcast(result, root=0)


def not_finite(data, dtype, opt, comm, total: float, epoch: int) -> str:
    """What a NaN/inf loss at ``epoch`` (1-based) means (collective): the features are
    not finite, or too large for float32 arithmetic (beyond sqrt(float32 max) their
    products overflow); the model overflows on its first step (no optimizer step
    before it); else the learning rate made training diverge."""
    x = data.x
    if isinstance(x, SparseRows):
        v = torch.as_tensor(to_host(x.m.data))
    else:
        v = x.rows if isinstance(x, ChunkedRows) else x.detach()
    ok = torch.isfinite(v)
    local = [float((~ok).sum()), float(v[ok].abs().max()) if bool(ok.any()) else 0.0]
    if comm is not None:
        every = np.array(comm.allgather(local))
        local = [every[:, 0].sum(), every[:, 1].max()]
    bad, big = local
    name = data.identity.get("dataset")
    what = f"the features of {name!r}" if name else "the input features"
    rows = precision.name(dtype)
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
    lr = opt.param_groups[0].get("lr")
    return f"training diverged: {loss} (learning rate {lr:g}): lower the learning rate"
