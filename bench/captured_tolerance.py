"""How far rounding moves 9 training steps, against how far a wrong replay does: the
tolerances of tests/test_cuda.py::test_a_captured_step_trains_as_the_eager_step_does.

On a GPU the aggregation's atomic sums round in any order, so a captured step and an
eager one agree only up to rounding, amplified by Adam and batch norm. Here, on the CPU
(deterministic kernels), the same 9 steps (planted partition, 3,000 nodes, Adam at 0.01)
run eagerly, then with relative noise of 2**-b on every mgg kernel's output (b = 24 is
float32's rounding), then with a replay's likeliest bug: the dropout masks of step 3
drawn again in every later step. Per case: the largest relative difference of a step's
loss, and of a tensor's update (final minus initial weights, by its norm); and whether the
run passes the test's former tolerances (1e-5 of the loss and of each weight, 1e-7 and
1e-6 absolute).

    python bench/captured_tolerance.py [--models gcn,sage,gin,gat] [--noise 24,16]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import mgg.distgraph
import mgg.torch as mt
import mgg.torch.aggregation
import mgg.torch.collectives
import mgg.torch.dropouts
import mgg.torch.gat_softmax
import mgg.torch.inputs
import mgg.torch.interop
import mgg.torch.message
from mgg.graph.generators import planted_partition
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer

from common import RESULTS, csv_list, write_results

LOSS_RTOL, UPDATE_RTOL = 1e-3, 2e-2  # the test's
BEFORE = dict(loss_rtol=1e-5, loss_atol=1e-7, rtol=1e-5, atol=1e-6)  # its former ones
# the modules where kernels' outputs become tensors
KERNELS = (mgg.torch.aggregation, mgg.torch.gat_softmax, mgg.torch.collectives,
           mgg.torch.dropouts, mgg.torch.inputs, mgg.torch.message)  # fmt: skip
STEPS, STALE_FROM = 9, 3  # WARMUP eager steps, then the captured one


def run(ds, model: str, noise: int | None, stale: bool, seed: int = 1):
    """(losses [STEPS], initial and final weights) of eager CPU steps, perturbed as asked."""
    rng = np.random.default_rng(seed)
    as_tensor, key64 = mgg.torch.interop.as_tensor, mgg.distgraph.key64
    kernels = KERNELS

    def noisy(a):
        t = as_tensor(a)
        if t.is_floating_point() and t.numel() > 1:
            eps = torch.from_numpy(rng.standard_normal(tuple(t.shape)).astype(np.float32))
            t = t + t * eps.to(t.dtype) * 2.0**-noise
        return t

    def stale_key(s, step, k):
        return key64(s, min(step, STALE_FROM), k)

    if noise is not None:
        for mod in kernels:
            mod.as_tensor = noisy
    if stale:
        mgg.distgraph.key64 = stale_key
    try:
        torch.manual_seed(0)
        dg, data = prepare(ds, None, model, backend="cpu")
        m = mt.build_model(model, data.num_features, data.num_classes)
        w0 = [p.detach().clone() for p in m.parameters()]
        t = Trainer(dg, data, m, build_optimizer("adam", m, 0.01, 5e-4), eval_every=0)
        losses = [t.train_step() for _ in range(STEPS)]
        t.read_losses()
        losses = np.array([float(s["loss"]) for s in losses])
        return losses, w0, [p.detach() for p in m.parameters()]
    finally:
        for mod in kernels:
            mod.as_tensor = as_tensor
        mgg.distgraph.key64 = key64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gcn,sage,gin,gat")
    ap.add_argument("--noise", default="24,16", help="exponents b of the noise 2**-b")
    args = ap.parse_args()
    models = csv_list(args.models, list(mt.MODELS))
    exps = csv_list(args.noise, cast=int)
    ds = planted_partition(3000, 4, avg_degree=8, num_features=24, seed=0)
    rows = []
    for model in models:
        base, w0, want = run(ds, model, None, False)
        cases = [(f"noise 2^-{b}", b, False) for b in exps] + [("stale masks", None, True)]
        for case, b, stale in cases:
            losses, _, got = run(ds, model, b, stale)
            loss = float(np.max(np.abs(losses - base) / np.abs(base)))
            moved = max(  # |a - w| over the eager update |w - w0|
                float((a - w).norm() / (w - w_0).norm().clamp_min(1e-12))
                for a, w, w_0 in zip(got, want, w0, strict=True)
            )
            before = np.allclose(
                losses, base, rtol=BEFORE["loss_rtol"], atol=BEFORE["loss_atol"]
            ) and all(
                torch.allclose(a, w, rtol=BEFORE["rtol"], atol=BEFORE["atol"])
                for a, w in zip(got, want, strict=True)
            )
            rows.append({"model": model, "case": case, "loss_rel": loss, "update_rel": moved,
                         "passes": loss < LOSS_RTOL and moved < UPDATE_RTOL,
                         "passed_before": bool(before)})  # fmt: skip
            print(f"{model:5s} {case:12s} loss {loss:.1e}  update {moved:.1e}", flush=True)
    notes = (
        f"{STEPS} Adam steps on the CPU, eager, against the same steps perturbed. The test "
        f"passes a run within {LOSS_RTOL:g} of every loss and {UPDATE_RTOL:g} of each "
        "tensor's update: noise must pass, stale masks must not. passed_before: within its "
        "former tolerances, 1e-5 of the loss and of each weight (1e-7 and 1e-6 absolute)."
    )
    cols = ["model", "case", "loss_rel", "update_rel", "passes", "passed_before"]
    write_results("captured_tolerance", {"loss_rtol": LOSS_RTOL, "update_rtol": UPDATE_RTOL},
                  rows, cols, notes)  # fmt: skip
    plot(rows)


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    models = list(dict.fromkeys(r["model"] for r in rows))
    for ax, key, tol in zip(
        axes, ("loss_rel", "update_rel"), (LOSS_RTOL, UPDATE_RTOL), strict=True
    ):
        for case in dict.fromkeys(r["case"] for r in rows):
            ys = [next(r[key] for r in rows if r["model"] == m and r["case"] == case)
                  for m in models]  # fmt: skip
            ax.plot(models, ys, "o-", label=case)
        ax.axhline(tol, color="k", ls="--", lw=1, label="the test's tolerance")
        ax.set_yscale("log")
        ax.set_title(key.replace("_", " ") + "ative difference, largest")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "captured_tolerance.png", dpi=110)


if __name__ == "__main__":
    main()
