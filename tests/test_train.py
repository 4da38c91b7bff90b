"""Training with torch models: P-invariance, accuracy, checkpoints, determinism, failure
modes."""

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mgg.torch as mt
from mgg.errors import DivergedError, InputError
from mgg.graph import Dataset, Graph
from mgg.graph.core import job_graph
from mgg.graph.formats import read_npz
from mgg.graph.generators import planted_partition
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.partition import build_plan
from mgg.prepare import prepare
from mgg.train import Trainer

from conftest import last_json, mpirun, shared_dataset

PLANTED = "planted:nodes=1500,classes=4,degree=8,features=24"


def train_json(nprocs, *args, timeout=240):
    r = mpirun(nprocs, "mgg", "train", "--json", *args, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return last_json(r.stdout)


def trainer(ds, name="gcn", *, seed=0, lr=None, wd=None, row_normalize=False, **kw):
    spec = mt.MODELS[name]
    dg, data = prepare(ds, None, name, seed=seed, row_normalize=row_normalize)
    model = mt.build_model(name, data.num_features, data.num_classes, seed=seed, **kw)
    opt = build_optimizer(
        "adam", model, spec.lr if lr is None else lr, spec.weight_decay if wd is None else wd
    )
    return Trainer(dg, data, model, opt, eval_every=0)


CURVES_JOB = """
import json
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer

comm = get_comm()
ds = resolve("%s")
out = {}
for name, spec in mt.MODELS.items():
    dg, data = prepare(ds, comm, name)
    model = mt.build_model(name, data.num_features, data.num_classes)
    opt = build_optimizer("adam", model, spec.lr, spec.weight_decay)
    t = Trainer(dg, data, model, opt, eval_every=0, check_sync=True)
    out[name] = {"losses": [h["loss"] for h in t.fit(30)], **t.evaluate()}
    dg.free()
if comm.rank == 0:
    print(json.dumps(out))
"""


@pytest.mark.mpi
def test_one_and_three_ranks_give_the_same_loss_curves(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(CURVES_JOB % PLANTED)
    runs = {}
    for p in (1, 3):  # 3: a middle rank with two peers (4 oversubscribes 2 cores)
        r = mpirun(p, "python", job, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[p] = last_json(r.stdout)
    assert set(runs[1]) == {"gcn", "sage", "gin", "gat"}
    for name, one in runs[1].items():
        three = runs[3][name]
        assert len(one["losses"]) == len(three["losses"]) == 30
        np.testing.assert_allclose(one["losses"], three["losses"], rtol=0, atol=1e-4)
        assert one["losses"][-1] < 0.8 * one["losses"][0], name  # it learned something
        assert abs(one["test_acc"] - three["test_acc"]) <= 0.002, name


@pytest.mark.mpi
def test_mgg_train_json_keeps_its_keys_and_trains_from_shards(tmp_path):
    """Two ranks each open their shard of a dataset partitioned beforehand, and train as a
    single process does on the whole dataset."""
    from mgg.cli import main

    shards = str(tmp_path / "shards")
    assert main(["partition", PLANTED, "--np", "2", "--model", "gat", "--out", shards]) == 0
    res = train_json(2, "--dataset", shards, "--model", "gat", "--epochs", "3")
    for k in ("losses", "train_acc", "val_acc", "test_acc", "epoch_time_s", "bytes_per_epoch"):
        assert k in res, k
    assert res["np"] == 2 and len(res["losses"]) == 3 and res["config"]["model"] == "gat"
    one = [h["loss"] for h in trainer(resolve(PLANTED), "gat").fit(3)]
    np.testing.assert_allclose(res["losses"], one, rtol=0, atol=1e-5)


@pytest.mark.mpi
def test_mixed_split_trains_as_one_process_and_shards_refuse_it(tmp_path):
    """--split mixed cuts the ranks elsewhere (node and edge shares) and still trains as a
    single process does; a sharded dataset, cut when written, refuses --split."""
    from mgg.partition import node_split

    g = resolve(PLANTED).graph
    assert node_split(g.indptr, 3, "mixed").tolist() != node_split(g.indptr, 3).tolist()
    res = train_json(3, "--dataset", PLANTED, "--model", "gin", "--epochs", "3", "--split", "mixed")
    one = [h["loss"] for h in trainer(resolve(PLANTED), "gin").fit(3)]
    np.testing.assert_allclose(res["losses"], one, rtol=0, atol=1e-5)
    from mgg.cli import main

    shards = str(tmp_path / "shards")
    assert main(["partition", PLANTED, "--np", "2", "--model", "gcn", "--out", shards]) == 0
    r = mpirun(2, "mgg", "train", "--dataset", shards, "--split", "mixed", "--epochs", "1")
    assert r.returncode != 0 and "--split does not apply" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "model,seeds,goal",
    [
        ("gcn", 5, 0.80),  # Kipf & Welling 81.5%: hidden 16, dropout 0.5, lr 0.01, wd 5e-4
        ("gat", 3, 0.81),  # Velickovic et al. 83.0% (early stopping): 8 x 8, dropout 0.6
        ("gin", 3, 0.74),
    ],
)
def test_cora_reaches_the_published_accuracy(model, seeds, goal):
    ds = read_npz(shared_dataset("cora"))
    accs = []
    for seed in range(seeds):  # the model's defaults, 200 epochs
        t = trainer(ds, model, seed=seed, row_normalize=model != "gin")
        t.fit(200)
        accs.append(t.evaluate()["test_acc"])
    assert np.mean(accs) >= goal, accs


@pytest.mark.mpi
def test_checkpoint_resume_gives_the_same_losses(tmp_path):
    base = ["--dataset", PLANTED, "--epochs", "20", "--eval-every", "0", "--model", "gin"]
    full = train_json(2, *base)
    ck = tmp_path / "ck"
    first = train_json(2, *base, "--checkpoint-dir", ck, "--checkpoint-every", "10")
    assert first["losses"] == full["losses"]  # checkpointing changes nothing
    resumed = train_json(2, *base, "--resume", ck / "epoch00010.pt")
    assert resumed["losses"][10:] == full["losses"][10:]  # bit for bit (BN, Adam, dropout)
    assert resumed["test_acc"] == full["test_acc"]


def test_training_is_deterministic_and_seeded():
    ds = planted_partition(800, 3, avg_degree=6, num_features=12, seed=1)

    def run(seed):
        return [h["loss"] for h in trainer(ds, "gat", seed=seed).fit(10)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_wide_features_are_transformed_before_aggregating():
    ds = read_npz(shared_dataset("amazon_photo"))  # 745 bag-of-words features
    t = trainer(ds, "gcn")
    dg, data, first = t.g, t.data, t.model.convs[0]
    widths = []
    aggregate = dg.aggregate
    dg.aggregate = lambda x, *a, **k: widths.append(x.shape[1]) or aggregate(x, *a, **k)
    got = first(data.x, dg)
    assert widths == [16]  # Â (x Wᵀ) at the hidden width, not (Â x) Wᵀ at 745
    got.sum().backward()
    assert widths == [16, 16]  # and the backward at the hidden width too
    a = ds.graph.gcn_norm().to_scipy().astype(np.float64)
    w = first.lin.weight.detach().numpy().astype(np.float64)
    x = data.x.m if isinstance(data.x, mt.SparseRows) else data.x.numpy()
    want = a @ (x.astype(np.float64) @ w.T) + first.bias.detach().numpy()
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.mpi
def test_bytes_per_epoch_counts_every_peer_row_read():
    spec = "planted:nodes=2000,classes=3,degree=6,features=300"
    res = train_json(2, "--dataset", spec, "--epochs", "2", "--hidden", "8")
    from mgg.graph.specs import resolve

    g = job_graph(resolve(spec).graph, "gcn_norm")
    halo = sum(p.num_halo + p.transposed.num_halo for p in build_plan(g, 2, 16))
    # forward: layer 1 at 8 (transform first), layer 2 at 3 classes; backward the same
    assert res["bytes_per_epoch"] == halo * (8 + 3) * 4


@pytest.mark.mpi
def test_diverging_weights_are_caught(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(f"""
import torch
import torch.nn.functional as F
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer
comm = get_comm()
dg, data = prepare(resolve("{PLANTED}"), comm, "gcn")
model = mt.build_model("gcn", data.num_features, data.num_classes)
t = Trainer(dg, data, model, build_optimizer("adam", model, 0.01, 0), check_sync=True)
t.fit(2)
if comm.rank == 1:
    with torch.no_grad():
        model.convs[0].lin.weight[0, 0] += 1.0  # a silent corruption on one rank
t.fit(3)
""")
    r = mpirun(2, "python", job, timeout=120)
    assert r.returncode != 0 and "weights diverged across ranks" in r.stderr


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the diverging run overflows
def test_clear_errors(tmp_path):
    g = Graph.from_edges([0, 1], [1, 2], 3)
    with pytest.raises(ValueError, match="no labels"):
        prepare(Dataset("nolabels", g), None, "gcn")
    with pytest.raises(ValueError, match="unknown model"):
        prepare(Dataset("d", g, y=np.zeros(3, int)), None, "transformer")
    x = np.ones((3, 2), np.float32)
    x[1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        prepare(Dataset("d", g, x=x, y=np.zeros(3, int)), None, "gcn")
    ds = planted_partition(200, 2, seed=0)
    t = trainer(ds, "gcn", lr=1e30, wd=0)
    t.opt = torch.optim.SGD(t.model.parameters(), lr=1e30)
    with pytest.raises(FloatingPointError, match=r"loss is .*: lower the learning rate"):
        t.fit(5)
    with pytest.raises(ValueError, match="learning rate"):
        build_optimizer("adam", t.model, float("nan"), 0)
    with pytest.raises(ValueError, match="e: the train mask selects no node"):
        Dataset("e", ds.graph, ds.x, ds.y, np.zeros(200, bool), ds.val_mask, ds.test_mask)
    dg, data = prepare(ds, None, "gcn")  # a LocalData built by hand is checked too
    data.train_mask[:] = False
    model = mt.build_model("gcn", data.num_features, data.num_classes)
    with pytest.raises(ValueError, match="train mask is empty"):
        Trainer(dg, data, model, build_optimizer("adam", model, 0.01, 0))
    t = trainer(ds, "gcn")
    t.model = torch.nn.Sequential()  # returns the features: 200 rows but not classes wide
    t.model.forward = lambda x, g: x.to_dense()[:-1] if hasattr(x, "to_dense") else x[:-1]
    with pytest.raises(ValueError, match="expected one row per node"):
        t.fit(1)
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="bad.pt cannot be read"):
        trainer(ds, "gcn").load_checkpoint(bad)


def test_checkpoint_of_another_model_is_rejected(tmp_path):
    ds = planted_partition(200, 2, seed=0)
    t = trainer(ds, "gcn", hidden=16)
    t.fit(1)
    path = t.save_checkpoint(tmp_path / "c.pt")
    with pytest.raises(ValueError, match="checkpoint"):
        trainer(ds, "gcn", hidden=8).load_checkpoint(path)
    fresh = trainer(ds, "gcn", hidden=16)
    fresh.load_checkpoint(path)
    assert fresh.epoch == 1 and fresh.weights_digest() == t.weights_digest()


def test_a_negative_epoch_count_is_refused():
    t = trainer(planted_partition(200, 2, seed=0))
    for bad in (-1, 2.5, True):
        with pytest.raises(InputError, match=r"^epochs \(--epochs\) must be an integer >= 0"):
            t.fit(bad)
    assert t.epoch == 0 and t.history == []


def _scaled(ds, name, top):
    x = ds.x / np.abs(ds.x).max() * np.float32(top)
    return Dataset(name, ds.graph, x, ds.y, ds.train_mask, ds.val_mask, ds.test_mask)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_loss_names_its_cause():
    """Features beyond float32's reach are named, not the learning rate; so are the model's
    initial weights, before any step; a learning rate that diverges keeps its advice
    (test_clear_errors)."""
    ds = planted_partition(200, 2, seed=0)
    with pytest.raises(DivergedError) as info:
        trainer(_scaled(ds, "huge", 3e38), "gat").fit(5)
    msg = str(info.value)
    assert re.match(
        r"the loss is (nan|inf) at epoch 1: the features of 'huge' reach 3e\+38 in magnitude, "
        r"which overflows float32 arithmetic .*: scale them down",
        msg,
    ), msg
    assert "lower the learning rate" not in msg
    t = trainer(ds, "gcn")
    with torch.no_grad():
        for p in t.model.parameters():
            p.fill_(1e30)
    with pytest.raises(DivergedError, match=r"at epoch 1, before any optimizer step \(not a"):
        t.fit(5)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gat_on_cora_features_of_1e30_names_the_features():
    ds = read_npz(shared_dataset("cora"))  # NaN at epoch 21
    with pytest.raises(DivergedError, match=r"the features of 'cora' reach 1e\+30 in magnitude"):
        trainer(_scaled(ds, "cora", 1e30), "gat").fit(60)


def test_tune_holds_the_knobs_this_job_sets(capsys):
    """--tune searches only the knobs --config (or a flag) leaves free; a --config that sets
    them all is refused naming both flags."""
    from mgg.cli import main

    ds = planted_partition(600, 3, seed=0)
    dg, data = prepare(ds, None, "gcn")
    model = mt.build_model("gcn", data.num_features, data.num_classes)
    opt = build_optimizer("adam", model, 0.01, 5e-4)
    t = Trainer(dg, data, model, opt, tune=True, config={"ps": 8}, tune_budget=14, eval_every=0)
    t.fit(14)
    assert {h["config"]["ps"] for h in t.history if "config" in h} == {8}
    assert t.tuning["measured"] >= 2 and dg.config["ps"] == 8
    every = json.dumps({"ps": 8, "dist": 2, "threads": 1})
    argv = ["train", "--dataset", PLANTED, "--epochs", "2", "--tune", "--config", every]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "mgg train: error: --tune searches ps, dist, threads, and --config (or their flags) "
        "sets every one: nothing to tune; drop --tune, or the knobs it should search\n"
    )


def losses_read_every_step(ds, name, epochs, lr=None):
    """The oracle: a plain loop over the same model, data and optimizer (SGD at ``lr`` if
    given) that reads the loss after every step, until it is not finite."""
    spec = mt.MODELS[name]
    dg, data = prepare(ds, None, name)
    model = mt.build_model(name, data.num_features, data.num_classes)
    opt = (
        build_optimizer("adam", model, spec.lr, spec.weight_decay)
        if lr is None
        else torch.optim.SGD(model.parameters(), lr=lr)
    )
    mask, count = data.train_mask, float(data.train_mask.sum())
    losses = []
    for epoch in range(epochs):
        model.train()
        dg.begin_step(epoch)
        opt.zero_grad()
        out = model(data.x, dg)
        loss = F.cross_entropy(out[mask], data.y[mask], reduction="sum") / count
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if not np.isfinite(losses[-1]):
            break
    return losses


def count_reads(t: Trainer) -> list:
    """Filled as t runs: how many losses each of t's reads found unread (empty reads are
    left out)."""
    reads, read = [], t.read_losses

    def spy(extra=()):
        if t._unread:
            reads.append(len(t._unread))
        return read(extra)

    t.read_losses = spy
    return reads


def test_losses_are_read_late_and_equal_a_loop_that_reads_every_step():
    """A step leaves its loss on the device: read_losses fills in every record not read
    yet, at once, and fit's history is the plain loop's, for every model. fit reads where
    a line is printed (a long run: every epochs // 20), else once at its end."""
    ds = planted_partition(300, 3, avg_degree=6, num_features=12, seed=2)
    for name in mt.MODELS:
        want = losses_read_every_step(ds, name, 5)
        t = trainer(ds, name)
        steps = [t.train_step() for _ in range(3)]
        assert all(s["loss"] is None and s["seconds"] is None for s in steps)
        t.read_losses()
        assert [s["loss"] for s in steps] == want[:3], name
        assert all(s["seconds"] > 0 for s in steps)
        assert [h["loss"] for h in trainer(ds, name).fit(5)] == want, name
    want = losses_read_every_step(ds, "gcn", 60)
    for log in (None, []):
        t = trainer(ds, "gcn")
        t.log = None if log is None else log.append
        reads = count_reads(t)
        history = t.fit(60)
        assert [h["loss"] for h in history] == want, log
        assert all(h["seconds"] > 0 for h in history)
        # one read of all 60 steps, or one per printed line (epochs 3, 6, ..., 60)
        assert reads == ([60] if log is None else [3] * 20), reads
        if log is not None:
            assert len(log) == 20 and f"loss {want[5]:.4f}" in log[1], log[:2]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the diverging run overflows
def test_a_loss_read_late_names_the_epoch_it_first_went_non_finite():
    """Losses are read after the steps (here once, at the end of fit), yet the error names
    the first epoch whose loss was NaN/inf, as a loop reading every step finds it; the
    losses before it are kept."""
    ds = planted_partition(200, 2, seed=0)
    want = losses_read_every_step(ds, "gcn", 10, lr=1e6)
    bad = len(want)  # the first non-finite epoch (1-based)
    assert 2 < bad < 10 and not np.isfinite(want[-1]), want
    t = trainer(ds, "gcn")
    t.opt = torch.optim.SGD(t.model.parameters(), lr=1e6)
    with pytest.raises(
        DivergedError,
        match=rf"^training diverged: the loss is (nan|inf) at epoch {bad} \(learning rate "
        r"1e\+06\): lower the learning rate$",
    ):
        t.fit(10)
    assert [h["loss"] for h in t.history[: bad - 1]] == want[:-1]
