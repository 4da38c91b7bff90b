"""A run's curves, for people: each epoch's record as a line of JSON and as TensorBoard
scalars while it trains, and at the end a PNG of the loss and the metric against epochs
and against training time.

Layout of a log folder (``mgg train --log-dir DIR``)::

    metrics.jsonl             one JSON object per epoch: epoch, loss, seconds, time_s (the
                              steps' seconds so far), and where evaluated train_acc,
                              val_acc, test_acc (the metric: accuracy or ROC-AUC)
    events.out.tfevents.*     TensorBoard's (when the tensorboard package is installed)
    curves.png                written last, atomically
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .atomic import atomic_write, make_folder, naming
from .errors import InputError

METRICS = "metrics.jsonl"
PNG = "curves.png"
SPLITS = ("train", "val", "test")
TENSORBOARD = "tensorboard is not installed (pip install 'mgg[tensorboard]'): no event file"


class RunLog:
    """The log of one run in ``folder`` (made if missing), written by one process.

    ``history``: the records of the run so far (a resumed run's): metrics.jsonl is
    written anew from them, and the event file gets only the epochs after them. A folder
    that already holds a metrics.jsonl is refused unless the run is resumed (so no
    run's curves are overwritten by another's). ``note``: what was left out, or None."""

    def __init__(self, folder, metric: str = "accuracy", history=()):
        folder = make_folder(folder, "the run's curves (--log-dir)")
        self.path, self.png, self.metric = folder / METRICS, folder / PNG, metric
        history = [h for h in history if h.get("loss") is not None]
        if self.path.exists() and not history:
            raise InputError(
                f"{self.path}: holds another run's metrics: give --log-dir a new folder, "
                "or remove it (a resumed run continues its own)"
            )
        self.done, self.time = 0, 0.0
        lines = [self._line(h) for h in history]
        with atomic_write(self.path) as tmp:
            Path(tmp).write_text("".join(lines))
        self.file = open(self.path, "a")  # open for the run's life
        self.note = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.note, self.writer = TENSORBOARD, None
        else:
            self.writer = SummaryWriter(log_dir=str(folder))

    def _line(self, rec: dict) -> str:
        self.done += 1
        self.time += rec.get("seconds") or 0.0
        row = {k: rec[k] for k in ("epoch", "loss", "seconds") if k in rec}
        row["time_s"] = self.time
        row.update({f"{s}_acc": rec[f"{s}_acc"] for s in SPLITS if f"{s}_acc" in rec})
        if "config" in rec:
            row["config"] = rec["config"]  # a tuner's sample
        return json.dumps(row) + "\n"

    def add(self, history: list[dict]) -> None:
        """Write the records of ``history`` not written yet, up to the first whose loss is
        not read yet (mgg.train.Trainer.read_losses)."""
        while self.done < len(history) and history[self.done].get("loss") is not None:
            rec = history[self.done]
            with naming(self.path):
                self.file.write(self._line(rec))
            if self.writer is not None:
                step = rec["epoch"]
                with naming(self.path.parent / "events.out.tfevents.*"):
                    self.writer.add_scalar("loss/train", rec["loss"], step)
                    self.writer.add_scalar("seconds/step", rec["seconds"], step)
                    for s in SPLITS:
                        if rec.get(f"{s}_acc") is not None:
                            self.writer.add_scalar(f"{self.metric}/{s}", rec[f"{s}_acc"], step)
        with naming(self.path):
            self.file.flush()

    def close(self, selected: int | None = None) -> Path | None:
        """Close the files and draw the PNG of every epoch in metrics.jsonl (``selected``:
        the epoch marked as the one kept); returns its path (None without matplotlib)."""
        if self.file.closed:
            return self.png
        with naming(self.path):
            self.file.close()
        if self.writer is not None:
            with naming(self.path.parent / "events.out.tfevents.*"):
                self.writer.close()
        rows = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        try:
            plot(rows, self.png, self.metric, selected)
        except ImportError:
            return None
        return self.png


def plot(rows: list[dict], path, metric: str = "accuracy", selected: int | None = None) -> None:
    """A 2 x 2 PNG at ``path`` (atomically): loss and ``metric`` (train, val, test)
    against epochs (top) and against the steps' seconds so far (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey="col")
    for row, x, label in ((0, "epoch", "epoch"), (1, "time_s", "training time (s)")):
        loss, score = axes[row]
        loss.plot([r[x] for r in rows], [r["loss"] for r in rows], color="k", lw=1)
        loss.set_ylabel("train loss")
        loss.set_yscale("log" if rows and min(r["loss"] for r in rows) > 0 else "linear")
        for s in SPLITS:
            pts = [(r[x], r[f"{s}_acc"]) for r in rows if _finite(r.get(f"{s}_acc"))]
            if pts:
                score.plot(*zip(*pts, strict=True), lw=1, label=s)
        score.set_ylabel(metric)
        for ax in (loss, score):
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            mark = [r[x] for r in rows if r["epoch"] == selected]
            if mark:
                ax.axvline(mark[0], color="gray", ls="--", lw=1)
        if score.lines:
            score.legend(loc="lower right")
    title = f"{len(rows)} epochs"
    if selected is not None:
        title += f"; dashed: epoch {selected}, the best validation {metric}"
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def _finite(v) -> bool:
    return v is not None and math.isfinite(v)
