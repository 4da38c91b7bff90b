"""What a user keeps from a run: best-validation selection and early stopping, the run's
curves (--log-dir), the saved model (--save, mgg.torch.load_model), and full-graph
predictions and embeddings by original node id (mgg predict / embed, mgg.infer) at
other rank counts, orders and sharded datasets; each bad input refused naming its file."""

import json
import os
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import mgg.torch as mt
from mgg import infer
from mgg.errors import CheckpointError, InputError, ModelError
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer

from conftest import kill_when_stalled, last_json, mpirun, run_mgg, shared_dataset

SPEC = "planted:nodes=400,classes=4"


@pytest.fixture(scope="module")
def ds():
    return resolve(SPEC)


def make(ds, model="gcn", **kw):
    spec = mt.MODELS[model]
    dg, data = prepare(ds, None, model, seed=0)
    net = mt.build_model(model, data.num_features, data.num_classes, seed=0)
    opt = build_optimizer("adam", net, spec.lr, spec.weight_decay)
    return Trainer(dg, data, net, opt, **kw)


def best_epoch(history):
    """The oracle of best-val: the earliest epoch of the highest validation score."""
    scored = [(h["val_acc"], -h["epoch"]) for h in history if h.get("val_acc") is not None]
    return -max(scored)[1]


# ---- selection -----------------------------------------------------------------------------
def test_best_val_reports_and_keeps_the_best_validation_epoch(ds):
    t = make(ds)
    assert t.select == "best-val"  # the default where a validation split exists
    t.fit(40)
    weights_last = {k: v.clone() for k, v in t.model.state_dict().items()}
    s = t.summary()
    want = best_epoch(t.history)
    assert s["selected_epoch"] == want < 40
    rec = t.history[want - 1]
    assert (s["val_acc"], s["test_acc"], s["train_acc"]) == (
        rec["val_acc"],
        rec["test_acc"],
        rec["train_acc"],
    )
    # the model holds other weights than the last epoch's: the selected ones
    assert any(not torch.equal(v, weights_last[k]) for k, v in t.model.state_dict().items())

    last = make(ds, select="last")
    last.fit(40)
    s_last = last.summary()
    assert s_last["selected_epoch"] == 40 and s_last["test_acc"] == last.history[-1]["test_acc"]


def test_patience_stops_that_many_epochs_after_the_best(ds):
    t = make(ds, patience=5)
    t.fit(300)
    stop = len(t.history)
    assert stop < 300 and t.stopped == stop
    best = best_epoch(t.history)
    assert stop - best == 5
    assert all(h["val_acc"] <= t.history[best - 1]["val_acc"] for h in t.history[best:])
    assert t.summary()["stopped_epoch"] == stop


def test_selection_arguments_are_checked(ds):
    with pytest.raises(InputError, match="--select must be one of best-val, last"):
        make(ds, select="best")
    with pytest.raises(InputError, match="--select best-val needs validation scores.*--eval-every"):
        make(ds, select="best-val", eval_every=0)
    with pytest.raises(InputError, match="--patience 3 needs validation scores"):
        make(ds, patience=3, eval_every=0)
    assert make(ds, eval_every=0).select == "last"


def test_a_resumed_best_val_run_selects_as_one_that_ran_through(ds, tmp_path):
    whole = make(ds)
    whole.fit(30)
    one = whole.summary()
    first = make(ds, checkpoint_dir=tmp_path / "a")
    first.fit(15)
    second = make(ds, checkpoint_dir=tmp_path / "b")
    second.load_checkpoint(tmp_path / "a" / "epoch00015.pt")
    second.fit(30)
    two = second.summary()
    assert (two["selected_epoch"], two["test_acc"]) == (one["selected_epoch"], one["test_acc"])
    for k, v in whole.model.state_dict().items():
        assert torch.equal(v, second.model.state_dict()[k])


def test_a_checkpoints_best_weights_are_under_its_digest(ds, tmp_path):
    from mgg import checkpoint

    t = make(ds, checkpoint_dir=tmp_path)
    t.fit(3)
    path = tmp_path / "epoch00003.pt"
    raw = torch.load(path, weights_only=True)
    assert set(raw["best"]) == set(raw["model"])
    raw["best"]["convs.0.bias"] += 1.0
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match="does not match the digest"):
        checkpoint.read(path)


# ---- curves --------------------------------------------------------------------------------
def test_log_dir_holds_each_epoch_as_json_tensorboard_and_a_png(ds, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t = make(ds, log_dir=tmp_path / "log", eval_every=2)
    t.fit(12)
    s = t.summary()
    rows = [json.loads(x) for x in (tmp_path / "log" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 13))
    assert [r["loss"] for r in rows] == [h["loss"] for h in t.history]
    assert np.allclose([r["time_s"] for r in rows], np.cumsum([h["seconds"] for h in t.history]))
    assert [r["epoch"] for r in rows if "val_acc" in r] == list(range(2, 13, 2))
    events = EventAccumulator(str(tmp_path / "log"))
    events.Reload()
    tb = events.Scalars("loss/train")
    assert [e.step for e in tb] == list(range(1, 13))
    assert np.allclose([e.value for e in tb], [h["loss"] for h in t.history], rtol=1e-6)
    val = {e.step: e.value for e in events.Scalars("accuracy/val")}
    assert np.isclose(val[s["selected_epoch"]], s["val_acc"])
    png = (tmp_path / "log" / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_log_dir_of_another_run_is_refused_and_a_resume_continues_it(ds, tmp_path):
    log = tmp_path / "log"
    t = make(ds, log_dir=log, checkpoint_dir=tmp_path / "ck")
    t.fit(4)
    t.summary()
    with pytest.raises(InputError, match="metrics.jsonl: holds another run's metrics"):
        make(ds, log_dir=log).fit(2)
    r = make(ds, log_dir=log)
    r.load_checkpoint(tmp_path / "ck" / "epoch00004.pt")
    r.fit(7)
    r.summary()
    rows = [json.loads(x) for x in (log / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in rows] == list(range(1, 8))


def test_without_tensorboard_the_log_says_so_and_keeps_the_rest(ds, tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_tensorboard(name, *a, **kw):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    said = []
    t = make(ds, log_dir=tmp_path, log=said.append)
    t.fit(3)
    t.summary()
    assert any("tensorboard is not installed" in line for line in said)
    assert not list(tmp_path.glob("events.out.tfevents*"))
    assert (tmp_path / "curves.png").exists() and (tmp_path / "metrics.jsonl").exists()


# ---- the saved model -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(ds, tmp_path_factory):
    """A GAT trained 10 epochs and saved (with its trainer)."""
    t = make(ds, "gat")
    t.fit(10)
    t.summary()
    folder = tmp_path_factory.mktemp("m") / "model"
    t.save_model(folder)
    return folder, t


def test_a_saved_model_loads_to_the_same_weights_and_outputs(saved):
    folder, t = saved
    model = mt.load_model(folder)
    assert model.saved["config"] == t.model.config and not model.training
    for k, v in t.model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v)
    assert model.saved["selected_epoch"] == best_epoch(t.history)
    assert (
        model.saved["scores"]["test_acc"]
        == t.history[model.saved["selected_epoch"] - 1]["test_acc"]
    )
    t.model.eval()
    with torch.no_grad():
        assert torch.equal(model(t.data.x, t.g), t.model(t.data.x, t.g))
    # torch alone reads the weights
    state = torch.load(folder / "model.pt", weights_only=True)
    assert set(state) == set(t.model.state_dict())


def test_a_damaged_model_folder_is_refused_naming_the_file(saved, tmp_path):
    import shutil

    folder, t = saved
    with pytest.raises(ModelError, match="already exists"):
        t.save_model(folder)
    cases = {
        "edited": (
            "model.json",
            lambda p: p.write_text(p.read_text().replace('"hidden": 8', '"hidden": 9')),
        ),
        "truncated": ("model.pt", lambda p: p.write_bytes(p.read_bytes()[:-100])),
        "flipped": ("model.pt", lambda p: p.write_bytes(_flip(p.read_bytes()))),
        "gone": ("model.json", lambda p: p.unlink()),
    }
    expect = {"edited": "edited after it was written", "truncated": "truncated",
              "flipped": "changed since", "gone": "missing"}  # fmt: skip
    for case, (name, damage) in cases.items():
        bad = tmp_path / case
        shutil.copytree(folder, bad)
        damage(bad / name)
        with pytest.raises(ModelError, match=expect[case]) as e:
            mt.load_model(bad)
        assert str(bad / name) in str(e.value)
    with pytest.raises(ModelError, match="does not exist"):
        mt.load_model(tmp_path / "none")


def _flip(b: bytes) -> bytes:
    a = bytearray(b)
    a[len(a) // 2] ^= 1
    return bytes(a)


def test_a_failed_save_leaves_nothing(saved, tmp_path, monkeypatch):
    _, t = saved
    out = tmp_path / "m"

    def full(*a, **kw):
        raise OSError(28, "No space left on device", "x")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(ModelError, match="No space left on device"):
        t.save_model(out)
    assert os.listdir(tmp_path) == []


# ---- outputs -------------------------------------------------------------------------------
def test_outputs_are_written_by_original_id_and_read_back(tmp_path, rng):
    n = 50
    ids = rng.permutation(n)
    rows = {"pred": rng.integers(0, 5, n), "prob": rng.random((n, 3), dtype=np.float32)}
    m = infer.write_output(tmp_path / "o", rows, ids, n, {"what": "test"})
    got = infer.read_output(tmp_path / "o")
    assert m["files"]["prob.npy"]["shape"] == [n, 3]
    for k, v in rows.items():
        assert np.array_equal(got[k][ids], v)
        assert np.array_equal(np.load(tmp_path / "o" / f"{k}.npy")[ids], v)  # plain numpy
    with pytest.raises(FileExistsError, match="already exists"):
        infer.write_output(tmp_path / "o", rows, ids, n, {})
    with pytest.raises(InputError, match="ranks hold 49 rows of a 50-node graph"):
        infer.write_output(tmp_path / "p", {"pred": rows["pred"][1:]}, ids[1:], n, {})
    os.remove(tmp_path / "o" / "manifest.json")
    with pytest.raises(InputError, match="no manifest.json: .*did not finish"):
        infer.read_output(tmp_path / "o")
    assert sorted(os.listdir(tmp_path)) == ["o"]  # nothing temporary left
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError, match="cannot write it") as e:
        infer.write_output(tmp_path / "file" / "out", rows, ids, n, {})
    assert e.value.filename == str(tmp_path / "file" / "out")


def test_unwritable_save_and_log_folders_are_named(saved, ds, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ModelError, match=f"{tmp_path / 'file' / 'm'}: cannot write it"):
        saved[1].save_model(tmp_path / "file" / "m")
    with pytest.raises(InputError, match=f"{tmp_path / 'file'}: is a file, not a folder"):
        make(ds, log_dir=tmp_path / "file").fit(1)


def test_bf16_embeddings_are_stored_as_their_words_and_read_as_bf16(tmp_path):
    rows = torch.randn(6, 4).to(torch.bfloat16)
    out = infer.embeddings(rows)
    infer.write_output(tmp_path / "e", out, np.arange(6), 6, {"dtypes": {"emb": "bfloat16"}})
    emb = infer.read_output(tmp_path / "e")["emb"]
    assert emb.dtype.name == "bfloat16"
    assert torch.equal(torch.from_numpy(np.asarray(emb, np.float32)), rows.float())


def test_a_predict_killed_midway_leaves_no_output_and_the_next_one_sweeps_it(saved, tmp_path):
    """SIGKILL `mgg predict` once its rows are written but not its manifest (stopped there
    by the test-only infer.STALL): OUT does not exist, the temporary folder is not an
    output, and the next write beside it removes it."""
    folder, _ = saved
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "mgg", "predict", "--model", folder, "--dataset", SPEC]
    tmp = kill_when_stalled([*argv, "--out", out], {infer.STALL: "out"}, "its manifest")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == [tmp.name]
    assert (tmp / "pred.npy").stat().st_size > 0
    with pytest.raises(InputError, match="no manifest.json"):
        infer.read_output(tmp)
    r = run_mgg(*argv[3:], "--out", out, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the dead job's folder swept
    assert last_json(r.stdout)["test_acc"] == saved[1].final["test_acc"]


# ---- end to end, at other rank counts -------------------------------------------------------
def _gcn_oracle(path, state):
    """Layer 1 of a GCN (ReLU(Â X W₁ᵀ + b₁)) and the logits, in float64 scipy/numpy, from
    the npz file and the state dict: Â = D^-1/2 (A + I) D^-1/2, D the in-degrees with
    the loop (PyG's gcn_norm)."""
    z = np.load(path)
    n = z["indptr"].size - 1
    a = sp.csr_matrix((np.ones(z["indices"].size), z["indices"], z["indptr"]), shape=(n, n))
    a = (a + sp.eye(n)).tocsr()
    a.data[:] = 1.0  # a loop already there counts once
    d = np.asarray(a.sum(axis=1)).ravel() ** -0.5
    norm = sp.diags(d) @ a @ sp.diags(d)
    w = {k: v.double().numpy() for k, v in state.items()}
    h = np.maximum(norm @ (z["x"] @ w["convs.0.lin.weight"].T) + w["convs.0.bias"], 0)
    return h, norm @ (h @ w["convs.1.lin.weight"].T) + w["convs.1.bias"], z


@pytest.mark.mpi
def test_predict_and_embed_match_training_at_other_rank_counts_orders_and_shards(tmp_path):
    from mgg.cli import main

    cora = shared_dataset("cora")
    model, shards = tmp_path / "model", tmp_path / "shards"
    r = mpirun(2, "mgg", "train", "--dataset", cora, "--epochs", "40", "--save", model, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    trained = last_json(r.stdout)
    assert trained["select"] == "best-val" and trained["saved"] == str(model)
    assert main(["partition", str(cora), "--np", "3", "--order", "rcm", "--out", str(shards)]) == 0
    state = torch.load(model / "model.pt", weights_only=True)
    hidden, logits, z = _gcn_oracle(cora, state)
    # trained at 2 ranks; predicted at 3 from shards in rcm order
    out = tmp_path / "pred"
    r = mpirun(3, "mgg", "predict", "--model", model, "--dataset", shards, "--out", out,
               "--json", env={"MGG_PROGRESS": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "predict:" not in r.stderr  # no progress under --json
    assert last_json(r.stdout)["test_acc"] == trained["test_acc"]  # the score train reported
    pred, prob = np.load(out / "pred.npy"), np.load(out / "prob.npy")
    # the oracle's score from the files alone, by original id
    test = z["test_mask"]
    assert np.isclose((pred[test] == z["y"][test]).mean(), trained["test_acc"])
    assert (pred == logits.argmax(1)).mean() > 0.998  # float32 vs float64 ties
    np.testing.assert_allclose(prob.sum(1), 1, rtol=1e-5)
    assert json.loads((out / "manifest.json").read_text())["ranks"] == 3
    # and embedded at 1
    r = run_mgg("embed", "--model", model, "--dataset", cora, "--out", tmp_path / "e",
                env={"MGG_PROGRESS": "1"})  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "embed: " in r.stderr  # its progress bar, without --json
    emb = np.load(tmp_path / "e" / "emb.npy")
    np.testing.assert_allclose(emb, hidden, rtol=1e-4, atol=1e-5)


@pytest.mark.mpi
def test_predict_refuses_another_datasets_model_and_leaves_nothing(saved, tmp_path):
    model = saved[0]
    out = tmp_path / "out"
    other = "planted:nodes=300,classes=4"
    r = mpirun(2, "mgg", "predict", "--model", model, "--dataset", other, "--out", out)
    assert r.returncode == 2
    line = r.stderr.strip().splitlines()[-1]
    assert f"model {model}/model.json was trained on other data" in line
    assert "num_nodes 400 (this job: 300)" in line
    assert os.listdir(tmp_path) == []  # no output, nothing temporary
    r = run_mgg("embed", "--model", model, "--dataset", SPEC, "--out", out, "--layer", "3")
    assert r.returncode == 2 and "--layer 3: the model has layers 1..2" in r.stderr
    r = run_mgg("train", "--dataset", SPEC, "--epochs", "2", "--save", model)
    assert r.returncode == 2 and f"{model}: already exists" in r.stderr
