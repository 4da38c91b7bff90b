"""Full-graph inference (`mgg predict`, `mgg embed`): throughput at P = 1, 2, 4 on the
products stand-in, peak memory per rank against training's at the same P, and whether
`predict` reproduces the test accuracy `train` reported, at the rank count of training
and at others.

A model is trained at each of ``--train-nps`` rank counts (saved with --save); then, for
each P, a short training run gives training's peak (its memory does not depend on the
epochs), `predict` runs on every saved model (its test accuracy against the one its
training reported) and `embed` on the first. Every number is one mggrun job's own
JSON: the forward pass's seconds and nodes/s (the slowest rank's wall time of the
collective forward), the files' write, the peak RSS of the largest rank. On this
machine's 2 cores, P = 4 is oversubscribed: its time is not a speed-up measure.

    python bench/inference.py [--scale 0.1] [--nps 1,2,4] [--train-nps 1,4] [--epochs 20]
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
    ap.add_argument("--train-nps", default="1,4")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--model", default="gcn")
    args = ap.parse_args()
    spec = f"products:scale={args.scale:g}"
    tmp = Path(tempfile.mkdtemp(prefix="mgg-inference-"))
    try:
        trained = {}
        for p in map(int, args.train_nps.split(",")):
            trained[p] = mgg_json(p, "train", "--dataset", spec, "--model", args.model,
                                  "--epochs", args.epochs, "--save", tmp / f"model{p}")  # fmt: skip
            print(f"trained at {p}: test {trained[p]['test_acc']:.4f} "
                  f"(epoch {trained[p]['selected_epoch']})", flush=True)  # fmt: skip
        first = next(iter(trained))
        rows = []
        for p in map(int, args.nps.split(",")):
            train = mgg_json(p, "train", "--dataset", spec, "--model", args.model,
                             "--epochs", 2, "--eval-every", 0)  # fmt: skip
            preds = {
                t: mgg_json(
                    p,
                    "predict",
                    "--model",
                    tmp / f"model{t}",
                    "--dataset",
                    spec,
                    "--out",
                    tmp / f"pred{t}-{p}",
                )  # fmt: skip
                for t in trained
            }
            pred = preds[first]
            emb = mgg_json(p, "embed", "--model", tmp / f"model{first}", "--dataset", spec,
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
            }
            for t in trained:
                row[f"test_acc_trained_at_{t}"] = trained[t]["test_acc"]
                row[f"test_acc_predict_{t}"] = preds[t]["test_acc"]
                row[f"same_as_trained_at_{t}"] = preds[t]["test_acc"] == trained[t]["test_acc"]
            rows.append(row)
            print(row, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cols = ["np", "nodes", "forward_s", "predict_nodes_per_s", "embed_nodes_per_s", "write_s",
            "train_peak_mb", "predict_peak_mb", "predict_vs_train_peak"]  # fmt: skip
    per_model = ("test_acc_trained_at_", "test_acc_predict_", "same_as_trained_at_")
    cols += [f"{k}{t}" for t in trained for k in per_model]
    notes = (
        f"`mgg predict`/`embed` of a {args.model.upper()} trained {args.epochs} epochs at "
        f"{args.train_nps} ranks on `{spec}` (--select best-val), at each P (throughput "
        f"and peaks: the model trained at {first}). Peaks are the "
        "largest rank's VmHWM; training's from a 2-epoch run at the same P. 2 cores: P = 4 "
        "is oversubscribed, its seconds are not a speed-up."
    )
    keys = ("test_acc", "val_acc", "selected_epoch", "epoch_time_s")
    kept = {t: {k: v[k] for k in keys} for t, v in trained.items()}
    payload = {"spec": spec, "model": args.model, "trained": kept}
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
