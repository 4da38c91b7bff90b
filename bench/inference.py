"""Full-graph inference (`mgg predict`, `mgg embed`): throughput at P = 1, 2, 4 on the
products stand-in, peak memory per rank against training's at the same P, and whether
`predict` reproduces the test accuracy `train` reported, at the rank count of training
and at others.

One model is trained (at ``--train-np`` ranks, saved with --save); then, for each P,
a short training run gives training's peak (its memory does not depend on the epochs),
and `predict` and `embed` run on the saved model. Every number is one mggrun job's own
JSON: the forward pass's seconds and nodes/s (the slowest rank's wall time of the
collective forward), the files' write, the peak RSS of the largest rank. On this
machine's 2 cores, P = 4 is oversubscribed: its time is not a speed-up measure.

    python bench/inference.py [--scale 0.1] [--nps 1,2,4] [--train-np 2] [--epochs 20]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, mgg_json, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--nps", default="1,2,4")
    ap.add_argument("--train-np", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--model", default="gcn")
    args = ap.parse_args()
    spec = f"products:scale={args.scale:g}"
    tmp = Path(tempfile.mkdtemp(prefix="mgg-inference-"))
    try:
        model = tmp / "model"
        trained = mgg_json(args.train_np, "train", "--dataset", spec, "--model", args.model,
                           "--epochs", args.epochs, "--save", model)  # fmt: skip
        print(f"trained at {args.train_np}: test {trained['test_acc']:.4f} "
              f"(epoch {trained['selected_epoch']})", flush=True)  # fmt: skip
        rows = []
        for p in map(int, args.nps.split(",")):
            train = mgg_json(p, "train", "--dataset", spec, "--model", args.model,
                             "--epochs", 2, "--eval-every", 0)  # fmt: skip
            pred = mgg_json(p, "predict", "--model", model, "--dataset", spec,
                            "--out", tmp / f"pred{p}")  # fmt: skip
            emb = mgg_json(p, "embed", "--model", model, "--dataset", spec,
                           "--out", tmp / f"emb{p}")  # fmt: skip
            row = {
                "np": p,
                "nodes": pred["num_nodes"],
                "train_peak_mb": max(train["peak_rss_mb"]),
                "predict_peak_mb": max(pred["peak_rss_mb"]),
                "embed_peak_mb": max(emb["peak_rss_mb"]),
                "predict_vs_train_peak": max(pred["peak_rss_mb"]) / max(train["peak_rss_mb"]),
                "train_epoch_s": train["epoch_time_s"],
                "forward_s": pred["forward_s"],
                "predict_nodes_per_s": pred["nodes_per_s"],
                "embed_nodes_per_s": emb["nodes_per_s"],
                "write_s": pred["write_s"],
                "predict_total_s": pred["seconds"],
                "test_acc_train": trained["test_acc"],
                "test_acc_predict": pred["test_acc"],
                "same_test_acc": pred["test_acc"] == trained["test_acc"],
            }
            rows.append(row)
            print(row, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cols = ["np", "nodes", "forward_s", "predict_nodes_per_s", "embed_nodes_per_s", "write_s",
            "train_peak_mb", "predict_peak_mb", "predict_vs_train_peak", "test_acc_train",
            "test_acc_predict", "same_test_acc"]  # fmt: skip
    notes = (
        f"`mgg predict`/`embed` of a {args.model.upper()} trained {args.epochs} epochs at "
        f"{args.train_np} ranks on `{spec}` (--select best-val), at each P. Peaks are the "
        "largest rank's VmHWM; training's from a 2-epoch run at the same P. 2 cores: P = 4 "
        "is oversubscribed, its seconds are not a speed-up."
    )
    kept = {k: trained[k] for k in ("test_acc", "val_acc", "selected_epoch")}
    payload = {"spec": spec, "model": args.model, "train_np": args.train_np, "trained": kept}
    write_results("inference", payload, rows, cols, notes)
    plot(rows, RESULTS / "inference.png", spec)


def plot(rows, path, spec) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = [r["np"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ps, [r["predict_nodes_per_s"] / 1e6 for r in rows], "o-", label="predict")
    a.plot(ps, [r["embed_nodes_per_s"] / 1e6 for r in rows], "s--", label="embed")
    a.set(xlabel="ranks P", ylabel="million nodes / s (forward)", xticks=ps)
    a.legend()
    w = 0.38
    b.bar([p - w / 2 for p in range(len(ps))], [r["train_peak_mb"] for r in rows], w,
          label="train")  # fmt: skip
    b.bar([p + w / 2 for p in range(len(ps))], [r["predict_peak_mb"] for r in rows], w,
          label="predict")  # fmt: skip
    b.set(xticks=range(len(ps)), xticklabels=[f"P={p}" for p in ps], ylabel="peak MB per rank")
    b.legend()
    fig.suptitle(f"full-graph inference on {spec} (2 cores: P=4 oversubscribed)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
