"""The output layer for the labeled rows only (--output-rows labeled): a plan restricted
to some rows aggregates exactly their in-edges, training on it is the full run (the loss
and the metrics read only those rows), across ranks too, with fewer halo rows."""

import dataclasses

import numpy as np
import pytest

from mgg.footprint import estimate, plan
from mgg.graph.facts import facts
from mgg.graph.generators import planted_partition
from mgg.job import build_optimizer
from mgg.kernels import aggregate
from mgg.memory import budget_for
from mgg.partition import build_plan
from mgg.prepare import prepare
from mgg.torch import MODELS, build_model
from mgg.train import Trainer

from conftest import gpu, mpi_runs, mpirun, random_graph


def _kept(rng, n, share=0.2):
    return np.sort(rng.choice(n, int(share * n), replace=False))


@pytest.mark.parametrize("ps", [2, 16])
def test_a_restricted_plan_holds_the_in_edges_of_its_rows_alone(rng, ps):
    g = random_graph(rng, 400, 3000, hub_dst=True).gcn_norm()
    for rank in range(3):
        full = build_plan(g, 3, ps, rank=rank)
        rows = _kept(rng, full.num_local_nodes)
        cut = full.restricted(rows)
        keep = np.isin(np.arange(full.num_local_nodes), rows)
        lsrc, ldst, rsrc, rdst = full.global_edges()
        want_l = keep[ldst - full.lb]
        want_r = keep[rdst - full.lb]
        got = cut.global_edges()
        for a, b in zip(got, (lsrc[want_l], ldst[want_l], rsrc[want_r], rdst[want_r]), strict=True):
            assert np.array_equal(a, b)  # the same edges, in the same order
        (lw, rw), (cut_lw, cut_rw) = full.edge_weights(), cut.edge_weights()  # from the norms
        assert np.array_equal(cut_lw, lw[want_l]) and np.array_equal(cut_rw, rw[want_r])
        # the halo: the remote sources read, each once, in order of first use
        _, first = np.unique(rsrc[want_r], return_index=True)
        assert np.array_equal(cut.halo_nodes, rsrc[want_r][np.sort(first)])
        assert cut.num_halo < full.num_halo or full.num_halo == 0
        # each kept row cut into the same neighbor partitions as in the full plan
        for ptr, node, fptr, fnode in (
            (cut.lnp_ptr, cut.lnp_node, full.lnp_ptr, full.lnp_node),
            (cut.rnp_ptr, cut.rnp_node, full.rnp_ptr, full.rnp_node),
        ):
            assert np.array_equal(np.diff(ptr), np.diff(fptr)[keep[fnode]])
            assert set(node.tolist()) <= set(rows.tolist())
        assert cut.transposed is full.transposed


@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_a_restricted_aggregation_is_the_full_one_on_its_rows(rng, op):
    g = random_graph(rng, 300, 2500, hub_dst=True).gcn_norm()
    full = build_plan(g, 1, 4, rank=0)
    rows = _kept(rng, 300)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    want = aggregate(full, x, op, eps=0.25)
    got = aggregate(full.restricted(rows), x, op, eps=0.25)
    # the same sums (the kernel's chunks cut the fewer partitions elsewhere: float order)
    tol = 2e-6 * float(np.abs(want).max())
    np.testing.assert_allclose(got[rows], want[rows], rtol=0, atol=tol)
    others = np.setdiff1d(np.arange(300), rows)
    rest = 1.25 * x[others] if op == "gin" else 0 * x[others]  # no in-edge left
    assert np.array_equal(got[others], rest)


def _partly_labeled(n=3000, test=300):
    ds = planted_partition(n, 4, num_features=24, seed=2)
    rng = np.random.default_rng(0)
    mask = np.zeros(n, bool)
    mask[rng.choice(n, test, replace=False)] = True
    return dataclasses.replace(ds, test_mask=mask & ~(ds.train_mask | ds.val_mask))


def _trained(ds, name, rows, dtype, epochs, backend="cpu", eval_every=0) -> Trainer:
    """``name`` with its defaults trained ``epochs`` epochs with ``output_rows`` ``rows``."""
    dg, data = prepare(ds, None, name, dtype=dtype, backend=backend)
    spec = MODELS[name]
    net = build_model(name, data.num_features, data.num_classes, seed=1).to(data.y.device)
    opt = build_optimizer("adam", net, spec.lr, spec.weight_decay)
    t = Trainer(dg, data, net, opt, eval_every=eval_every, output_rows=rows)
    t.fit(epochs)
    return t


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_training_on_the_labeled_rows_alone_is_the_full_run(name, dtype):
    ds = _partly_labeled()
    runs = {}
    for rows in ("all", "labeled"):
        t = _trained(ds, name, rows, dtype, 4, eval_every=2)
        runs[rows] = (t.summary(), t.predict()[1], t._logits().shape[0])
    (full, pred, n), (cut, cut_pred, labeled) = runs["all"], runs["labeled"]
    assert labeled < n / 4  # the run computed fewer rows
    np.testing.assert_allclose(cut["losses"], full["losses"], rtol=1e-6)
    assert [h.get("val_acc") for h in cut["history"]] == [h.get("val_acc") for h in full["history"]]
    assert (cut["train_acc"], cut["test_acc"]) == (full["train_acc"], full["test_acc"])
    assert np.array_equal(cut_pred, pred)  # predictions cover every row either way


def test_models_whose_last_layer_computes_every_row_are_refused(capsys):
    from mgg.cli import main

    ds = _partly_labeled(600, 60)
    for name in ("gin", "gat"):
        dg, data = prepare(ds, None, name)
        net = build_model(name, data.num_features, data.num_classes)
        with pytest.raises(ValueError, match="computes every row"):
            Trainer(dg, data, net, build_optimizer("adam", net, 0.01, 0), output_rows="labeled")
    dg, data = prepare(ds, None, "gcn")
    net = build_model("gcn", data.num_features, data.num_classes)
    with pytest.raises(ValueError, match="restricted"):
        net(data.x, dg, rows=dg)  # not a restricted graph
    args = ["train", "--dataset", "planted:nodes=300,classes=3", "--model", "gat"]
    assert main([*args, "--output-rows", "labeled"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--output-rows labeled" in err[0] and "gat" in err[0]


def test_the_plan_counts_the_output_rows_it_computes():
    # sparse features: none stream, so only the output rows can make the job fit
    few = facts(1_000_000, 16_000_000, features=128, classes=172, labeled=15_000,
                feature_nnz=2_000_000)  # fmt: skip
    kw = dict(hidden=128, layers=2, classes=172, features=128, labeled=15_000, dtype="bfloat16")
    full = estimate(1_000_000, 16_000_000, **kw)["activations"]
    cut = estimate(1_000_000, 16_000_000, output_rows="labeled", **kw)["activations"]
    assert cut < full
    every = estimate(1_000_000, 16_000_000, **{**kw, "labeled": None}, output_rows="labeled")
    assert every["activations"] >= cut  # labeled rows only save where few rows are labeled
    budget = {"host": 2**62, "device": 0}
    need = plan(few, 1, "train", budget=budget, device=True, model=MODELS["gcn"], hidden=128)
    total = need["per_rank"][0]["device"]["total_bytes"]
    cut_plan = plan(few, 1, "train", budget=budget, device=True, model=MODELS["gcn"],
                    hidden=128, output_rows="labeled")  # fmt: skip
    between = budget_for((total + cut_plan["per_rank"][0]["device"]["total_bytes"]) // 2)
    out = plan(few, 1, "train", budget={"host": 2**62, "device": between}, device=True,
               model=MODELS["gcn"], hidden=128)  # fmt: skip
    assert not out["fits"] and "--output-rows labeled" in out["fixes"]
    gin = plan(few, 1, "train", budget={"host": 2**62, "device": between}, device=True,
               model=MODELS["gin"], hidden=128)  # fmt: skip
    assert "--output-rows labeled" not in gin["fixes"]


@pytest.mark.mpi
def test_ranks_compute_their_labeled_rows_alone_with_fewer_halo_rows():
    args = ["train", "--dataset", "papers100m:scale=0.0002", "--model", "sage", "--epochs", "3",
            "--eval-every", "3", "--json"]  # fmt: skip
    labeled = ["--output-rows", "labeled"]
    # the shm window (peers read in place), and msg (owners send)
    runs = mpi_runs(2, args, [[], labeled, [*labeled, "--window", "msg"]])
    full, *cuts = runs
    assert full["np"] == 2 and len(cuts) == 2
    for cut in cuts:
        assert cut["output_rows"] == "labeled"
        assert np.allclose(cut["losses"], full["losses"], rtol=1e-6)
        assert cut["test_acc"] == pytest.approx(full["test_acc"], abs=1e-9)
        assert cut["bytes_per_epoch"] < full["bytes_per_epoch"]  # the output layer's halo
    assert cuts[1]["graph_config"]["window"] == "msg"


# ---- on a GPU (the GPU stage 'tests' runs these) ---------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_a_gpu_trains_the_labeled_rows_alone_as_the_full_run(name, dtype):
    """One PE: the restricted design reads the full graph's buffers in its turn."""
    ds = _partly_labeled()
    losses = {}
    for rows in ("all", "labeled"):
        t = _trained(ds, name, rows, dtype, 6, backend="cuda")
        losses[rows] = [h["loss"] for h in t.history]
        t.g.free()
    np.testing.assert_allclose(losses["labeled"], losses["all"], rtol=1e-4)


@gpu
@pytest.mark.gpu
@pytest.mark.mpi
def test_two_pes_train_the_labeled_rows_alone_as_the_full_run():
    pytest.importorskip("nvshmem.core")
    from conftest import last_json

    args = ["mgg", "train", "--dataset", "papers100m:scale=0.0002", "--model", "gcn"]
    args += ["--epochs", "6", "--backend", "cuda", "--json"]
    runs = {}
    for rows in ("all", "labeled"):
        r = mpirun(2, *args, "--output-rows", rows, timeout=150)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[rows] = last_json(r.stdout)
    assert runs["labeled"]["np"] == 2
    np.testing.assert_allclose(runs["labeled"]["losses"], runs["all"]["losses"], rtol=1e-4)
    assert runs["labeled"]["bytes_per_epoch"] < runs["all"]["bytes_per_epoch"]
