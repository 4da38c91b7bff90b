"""Checkpoints (mgg.checkpoint): a corpus of corrupt files each refused with a CheckpointError
naming the file and the problem, epochs, atomic writes, the folder lock, and resuming at
another rank count."""

import gc
import io
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

import mgg.torch as mt
from mgg import atomic, checkpoint
from mgg.errors import CheckpointError, InputError
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer

from conftest import kill_when_stalled, last_json, mpirun

SPEC = "planted:nodes=300,classes=3"


@pytest.fixture(scope="module")
def ds():
    return resolve(SPEC)


def make(ds, *, hidden=None, optimizer="adam", source=None, row_normalize=False, **kw):
    """A GCN trainer as `mgg train --dataset SPEC --eval-every 0` builds it on one rank."""
    spec = mt.MODELS["gcn"]
    dg, data = prepare(ds, None, "gcn", seed=0, source=source, row_normalize=row_normalize)
    model = mt.build_model("gcn", data.num_features, data.num_classes, hidden=hidden, seed=0)
    opt = build_optimizer(optimizer, model, spec.lr, spec.weight_decay)
    return Trainer(dg, data, model, opt, eval_every=0, **kw)


@pytest.fixture(scope="module")
def good(ds, tmp_path_factory):
    """A real checkpoint at epoch 2 and its raw contents."""
    path = tmp_path_factory.mktemp("good") / "epoch00002.pt"
    t = make(ds)
    t.fit(2)
    t.save_checkpoint(path)
    raw = torch.load(path, weights_only=True)
    return path, raw, json.loads(raw["meta"])


@pytest.fixture(scope="module")
def target(ds):
    """A fresh trainer that the corrupt files are loaded into (and refused)."""
    return make(ds)


# ---- the corpus ------------------------------------------------------------------------------
def _member_data_offset(data: bytes, name: str) -> int:
    with zipfile.ZipFile(_bytes_file(data)) as zf:
        info = zf.getinfo(name)
    h = info.header_offset
    n, e = struct.unpack("<HH", data[h + 26 : h + 30])
    return h + 30 + n + e


def _bytes_file(data):
    return io.BytesIO(data)


def flip_tensor_bit(good, out):
    data = bytearray(good[0].read_bytes())
    with zipfile.ZipFile(good[0]) as zf:
        name = next(n for n in zf.namelist() if n.endswith("/data/0"))
    data[_member_data_offset(bytes(data), name) + 2] ^= 0x08
    out.write_bytes(bytes(data))


def truncate(good, out):
    data = good[0].read_bytes()
    out.write_bytes(data[: len(data) * 3 // 5])


def folder(good, out):
    out.mkdir()
    shutil.copy(good[0], out / "epoch00002.pt")


def without(key):
    def corrupt(good, out):
        torch.save({k: v for k, v in good[1].items() if k != key}, out)

    return corrupt


def rewrite(model_fn=None, opt_fn=None, **meta):
    """A checkpoint with a valid digest over changed contents (as a buggy writer would)."""

    def corrupt(good, out):
        _, raw, old = good
        m = {k: v.clone() for k, v in raw["model"].items()}
        o = pickle.loads(pickle.dumps(raw["optimizer"]))
        if model_fn:
            model_fn(m)
        if opt_fn:
            opt_fn(o)
        checkpoint.write(out, m, o, {**old, **meta})

    return corrupt


def drop_state(key):
    def change(o):
        for s in o["state"].values():
            del s[key]

    return change


def nan_weight(m):
    k = next(iter(m))
    m[k].view(-1)[:3] = float("nan")


def changed_weight_same_meta(good, out):
    raw = good[1]
    m = {k: v.clone() for k, v in raw["model"].items()}
    next(iter(m.values())).view(-1)[0] += 1.0
    torch.save({**raw, "model": m}, out)


def other_width(good, out):
    dg, data = prepare(resolve(SPEC), None, "gcn", seed=0)
    model = mt.build_model("gcn", data.num_features, data.num_classes, hidden=8, seed=0)
    opt = build_optimizer("adam", model, 0.01, 0)
    checkpoint.write(out, model.state_dict(), opt.state_dict(), {**good[2], "config": {}})


class Foreign:  # pickled by reference: weights_only refuses to build it
    pass


CORPUS = [
    ("truncated", truncate, r"cannot be read: it is truncated or corrupt"),
    ("bit flipped in a tensor", flip_tensor_bit, r"is corrupt: its member .*data/0 fails its CRC"),
    ("empty", lambda g, out: out.write_bytes(b""), r"it is empty \(0 bytes\)"),
    ("a folder", folder, r"is a folder, not a checkpoint file; its newest .*epoch00002\.pt"),
    ("missing", lambda g, out: None, r"does not exist"),
    ("random bytes", lambda g, out: out.write_bytes(os.urandom(999)), r"not a torch zip file"),
    (
        "a pickle payload",
        lambda g, out: out.write_bytes(pickle.dumps(g[1]["meta"])),
        r"not a torch zip file but a bare pickle",
    ),
    (
        "pickled objects in a torch file",
        lambda g, out: torch.save({**g[1], "meta": Foreign()}, out),
        r"holds pickled Python objects \(.*Foreign\)",
    ),
    ("no meta", without("meta"), r"has no 'meta' \(the trainer's epoch"),
    ("no optimizer", without("optimizer"), r"has no 'optimizer' \(the optimizer's state\)"),
    ("no model", without("model"), r"has no 'model'"),
    (
        "a meta that is not JSON",
        lambda g, out: torch.save({**g[1], "meta": "{epoch: 2"}, out),
        r"has a 'meta' that is not JSON",
    ),
    (
        "a weight changed after the write",
        changed_weight_same_meta,
        r"does not match the digest in its meta",
    ),
    ("NaN weights", rewrite(nan_weight), r"holds NaN/inf in .* \(3 of \d+ values\)"),
    (
        "Adam state without exp_avg",
        rewrite(opt_fn=drop_state("exp_avg")),
        r"optimizer state that does not fit Adam: parameter 0 \(.*\) lacks 'exp_avg'",
    ),
    (
        "Adam state without its step",
        rewrite(opt_fn=drop_state("step")),
        r"does not fit Adam: parameter 0 .* lacks 'step'",
    ),
    (
        "no optimizer state at epoch 2",
        rewrite(opt_fn=lambda o: o["state"].clear()),
        r"has no optimizer state at epoch 2: Adam keeps exp_avg, exp_avg_sq, step",
    ),
    (
        "an SGD state",
        rewrite(optimizer="SGD"),
        r"holds the state of a SGD optimizer; this job uses Adam",
    ),
    (
        "another width (config)",
        rewrite(config={"model": "gcn", "hidden": 8}),
        r"is of another model: .*hidden 8 \(this job: 16\)",
    ),
    (
        "another width (weights)",
        other_width,
        r"does not fit this model: weight '.*' is \[8\] in it, \[16\] here",
    ),
    ("a negative epoch", rewrite(epoch=-1), r"has epoch -1 in its meta: expected an integer"),
    ("a fractional epoch", rewrite(epoch=2.5), r"has epoch 2\.5 in its meta"),
]


@pytest.mark.parametrize("name,corrupt,problem", CORPUS, ids=[c[0] for c in CORPUS])
def test_a_corrupt_checkpoint_is_refused_naming_file_and_problem(
    name, corrupt, problem, good, target, tmp_path
):
    bad = tmp_path / "bad.pt"
    corrupt(good, bad)
    before = target.weights_digest()
    with pytest.raises(CheckpointError) as info:
        target.load_checkpoint(bad)
    msg = str(info.value)
    assert msg.startswith(f"checkpoint {bad} ") and "\n" not in msg, msg
    assert re.search(problem, msg), msg
    assert target.epoch == 0 and target.weights_digest() == before  # nothing was taken


def test_a_newer_format_is_refused(good, target, tmp_path):
    raw, meta = good[1], {**good[2], "format": 99}
    meta["digest"] = checkpoint.digest(raw["model"], raw["optimizer"], meta)
    bad = tmp_path / "new.pt"
    torch.save({**raw, "meta": json.dumps(meta)}, bad)
    with pytest.raises(CheckpointError, match=f"checkpoint {bad} has format 99, newer"):
        target.load_checkpoint(bad)


def test_a_good_checkpoint_round_trips_and_is_plain_torch(good, ds, tmp_path):
    path, raw, meta = good
    assert set(raw) == {"model", "optimizer", "meta"}  # torch.load(weights_only=True) reads it
    assert meta["format"] == checkpoint.FORMAT and meta["epoch"] == 2 and meta["ranks"] == 1
    t = make(ds)
    t.load_checkpoint(path)
    assert t.epoch == 2 and len(t.history) == 2
    assert [h["loss"] for h in t.fit(3)][:2] == [h["loss"] for h in meta["history"]]
    old = tmp_path / "format0.pt"  # as mgg wrote them before meta had a format and digest
    keep = ("epoch", "history", "config", "graph_config", "tuning")
    torch.save({**raw, "meta": json.dumps({k: meta[k] for k in keep})}, old)
    t = make(ds)
    with pytest.warns(UserWarning, match=f"checkpoint {old} does not record the data it was"):
        t.load_checkpoint(old)
    assert t.epoch == 2


def test_an_epoch_beyond_the_runs_epochs_is_refused(good, ds):
    path = good[0]
    t = make(ds)
    t.load_checkpoint(path)
    with pytest.raises(
        CheckpointError,
        match=f"checkpoint {path} is at epoch 2 but --epochs is 1: nothing to train; raise",
    ):
        t.fit(1)
    with pytest.raises(CheckpointError, match="is at epoch 2 but --epochs is 0"):
        make(ds).load_checkpoint(path, epochs=0)
    t = make(ds)
    t.load_checkpoint(path)
    assert len(t.fit(2)) == 2 and t.epoch == 2  # == epochs: only evaluates


def test_tuned_knobs_invalid_here_are_dropped_with_a_note(good, ds, tmp_path):
    _, raw, meta = good
    path = tmp_path / "tuned.pt"
    tuned = {"ps": 8, "dist": 2, "threads": 999, "window": "msg"}  # window: across nodes
    checkpoint.write(
        path, raw["model"], raw["optimizer"], {**meta, "graph_config": tuned, "tuning": {"x": 1}}
    )
    notes = []
    t = make(ds, log=notes.append)
    threads = t.g.config["threads"]
    t.load_checkpoint(path)
    assert t.g.config == {"ps": 8, "dist": 2, "threads": threads}
    assert len(notes) == 2 and "tuned threads=999 (at 1 rank(s)) not restored" in notes[0]
    assert "tuned window 'msg' (at 1 rank(s)) not restored" in notes[1]
    untuned = make(ds)  # knobs the run did not tune were its flags: not restored
    untuned.load_checkpoint(good[0])
    assert untuned.g.config["ps"] == 16


# ---- the trainer's checkpoint arguments and atomic writes ------------------------------------
def test_checkpoint_arguments_are_checked(ds, tmp_path):
    for every in (-1, 1.5, True):
        with pytest.raises(InputError, match="--checkpoint-every must be an integer >= 0"):
            make(ds, checkpoint_dir=tmp_path, checkpoint_every=every)
    with pytest.raises(InputError, match="--checkpoint-every 3 needs --checkpoint-dir"):
        make(ds, checkpoint_every=3)
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=f"checkpoint folder {tmp_path / 'file'} is a file"):
        make(ds, checkpoint_dir=tmp_path / "file")


def test_a_failed_write_leaves_the_old_checkpoint_whole(good, ds, tmp_path, monkeypatch):
    """A full disk as torch's writer meets it (simulated here; for real on a tmpfs in
    test_a_full_disk_is_named_and_leaves_nothing): the write into the file fails with
    ENOSPC, which torch's zip writer wraps in a RuntimeError saying "unexpected pos"."""
    path = tmp_path / "c.pt"
    shutil.copy(good[0], path)
    t = make(ds)

    def disk_full(obj, f):
        f.write(b"PK\x03\x04 half")
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError(  # noqa: B904 - chained as torch chains it
                "[enforce fail at inline_container.cc:672] . unexpected pos 96576 vs 96468"
            )

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError) as info:
        t.save_checkpoint(path)
    assert str(info.value) == f"checkpoint {path} cannot be written: no space left on device"
    assert os.listdir(tmp_path) == ["c.pt"] and path.read_bytes() == good[0].read_bytes()


FULL_DISK = """
set -e
mount -t tmpfs -o size=64k tmpfs "$1"
cd "$2"
set +e
"$3" -m mgg train --dataset {spec} --epochs 2 --hidden 512 --checkpoint-dir "$1/ck"
echo "rc=$?"
ls -A "$1/ck"
"""


def test_a_full_disk_is_named_and_leaves_nothing(tmp_path):
    """A real ENOSPC: `mgg train` checkpoints (about 200 kB) into a 64 kB tmpfs, mounted in
    a user and mount namespace of its own (skipped where that is not permitted)."""
    from conftest import ROOT

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "full.sh"
    script.write_text(FULL_DISK.format(spec=SPEC))
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", str(script)]
    try:
        r = subprocess.run(
            [*cmd, str(mnt), str(ROOT), sys.executable], capture_output=True, text=True,
            timeout=300, env=dict(os.environ, MGG_PROGRESS="0"),
        )  # fmt: skip
    except FileNotFoundError:
        pytest.skip("no unshare")
    if "rc=" not in r.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()[-300:]}")
    ck = mnt / "ck"
    assert "rc=2" in r.stdout, r.stdout + r.stderr[-3000:]
    err = r.stderr.strip().splitlines()
    assert err[-1] == (
        f"mgg train: error: checkpoint {ck / 'epoch00002.pt'} cannot be written: "
        "no space left on device"
    ), r.stderr[-3000:]
    assert r.stdout.split("rc=2")[1].split() == [".lock"]  # nothing half written, no temporary


# ---- one job per checkpoint folder -----------------------------------------------------------
def test_a_second_trainer_on_a_held_folder_is_refused(ds, tmp_path):
    ck = tmp_path / "ck"
    first = make(ds, checkpoint_dir=ck, checkpoint_every=1)
    with pytest.raises(CheckpointError) as info:
        make(ds, checkpoint_dir=ck)
    msg = str(info.value)
    assert f"checkpoint folder {ck} is in use by another job (pid {os.getpid()} on " in msg, msg
    del first
    gc.collect()
    make(ds, checkpoint_dir=ck)  # released with its trainer


def test_the_lock_dies_with_its_holder(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(ck / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, b'pid %d on elsewhere' % os.getpid())\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=f"in use by another job \\(pid {holder.pid} "):
            checkpoint.lock(ck)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    checkpoint.lock(ck).release()  # the kernel dropped the dead holder's lock


# ---- real jobs: resume at another rank count, a held folder ----------------------------------
@pytest.mark.mpi
def test_resume_at_another_rank_count_continues_the_same_curve(ds, tmp_path):
    """Two epochs at P=1 (checkpointed), resumed at P=2 to epoch 4: epochs 3..4 are those of
    an uninterrupted P=1 run up to float reduction order (P=1 and P=2 compute the same
    numbers), although the P=1 run's tuned threads (2) are invalid at P=2 (1 per rank)."""
    ck = tmp_path / "ck"
    t = make(ds, checkpoint_dir=ck, checkpoint_every=2)
    t.tuning = {"best": t.g.config}  # as if tuned: its threads are restored where valid
    oracle = [h["loss"] for h in t.fit(4)]
    del t
    base = ["--dataset", SPEC, "--epochs", "4", "--eval-every", "0", "--json"]
    r = mpirun(2, "mgg", "train", *base, "--resume", ck / "epoch00002.pt", "--checkpoint-dir", ck)
    assert r.returncode == 0, r.stderr[-3000:]
    res = last_json(r.stdout)
    assert res["np"] == 2 and res["losses"][:2] == oracle[:2]
    np.testing.assert_allclose(res["losses"][2:], oracle[2:], rtol=0, atol=1e-5)


@pytest.mark.mpi
def test_a_job_on_a_held_folder_is_refused_on_every_rank(tmp_path):
    ck = tmp_path / "ck"
    held = checkpoint.lock(ck)
    try:
        args = f"--dataset {SPEC} --epochs 2 --checkpoint-every 1".split()
        r = mpirun(2, "mgg", "train", *args, "--checkpoint-dir", ck, timeout=120)
    finally:
        held.release()
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"error: checkpoint folder {ck} is in use by another job (pid {os.getpid()}" in r.stderr
    assert not list(ck.glob("*.pt"))


# ---- a job killed while it writes a checkpoint -----------------------------------------------
def test_a_write_killed_midway_leaves_no_newest_and_the_next_job_sweeps_it(ds, tmp_path):
    """SIGKILL `mgg train` while it writes its second checkpoint (stopped there by the
    test-only checkpoint.STALL, its temporary file whole but not renamed): the temporary is
    never the folder's newest checkpoint, and the next job on the folder removes it and
    resumes from the last whole checkpoint."""
    ck = tmp_path / "ck"
    base = [sys.executable, "-m", "mgg", "train", "--dataset", SPEC, "--eval-every", "0"]
    base += ["--checkpoint-dir", str(ck), "--checkpoint-every", "2", "--epochs", "6"]
    tmp = kill_when_stalled(base, {checkpoint.STALL: "epoch00004.pt"}, "its second checkpoint")
    assert sorted(p.name for p in ck.iterdir()) == sorted([".lock", "epoch00002.pt", tmp.name])
    assert tmp.stat().st_size > 0 and atomic.is_temporary(tmp)
    assert checkpoint.latest(ck) == ck / "epoch00002.pt"
    with pytest.raises(CheckpointError, match=f"its newest checkpoint is {ck / 'epoch00002.pt'}$"):
        make(ds).load_checkpoint(ck)
    r = subprocess.run(
        [*base, "--resume", str(ck / "epoch00002.pt"), "--json"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, MGG_PROGRESS="0"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    oracle = [h["loss"] for h in make(ds).fit(6)]
    np.testing.assert_allclose(last_json(r.stdout)["losses"], oracle, rtol=0, atol=1e-6)
    assert sorted(p.name for p in ck.iterdir()) == [
        ".lock", "epoch00002.pt", "epoch00004.pt", "epoch00006.pt"
    ]  # fmt: skip


# ---- the folder alone; the data a checkpoint was trained on ----------------------------------
def test_a_checkpoint_folder_alone_checkpoints_after_the_last_epoch(ds, tmp_path):
    make(ds, checkpoint_dir=tmp_path / "a").fit(3)
    assert sorted(os.listdir(tmp_path / "a")) == [".lock", "epoch00003.pt"]
    t = make(ds, checkpoint_dir=tmp_path / "b", checkpoint_every=2)
    t.fit(5)
    t.fit(5)  # nothing trained: nothing written
    assert sorted(os.listdir(tmp_path / "b")) == [
        ".lock", "epoch00002.pt", "epoch00004.pt", "epoch00005.pt"
    ]  # fmt: skip


def test_a_checkpoint_resumes_only_on_its_data_and_flags(tmp_path, capsys):
    """`mgg train` (in-process, one rank) checkpoints; resuming it on another dataset of the
    same sizes (a generator's other seed), of another size, or with --row-normalize
    toggled, is refused naming the checkpoint, what differs and both values; on its own
    data it continues; a checkpoint that does not record its data resumes with a warning."""
    from mgg.cli import main

    ck = tmp_path / "ck"
    base = ["train", "--eval-every", "0", "--epochs", "3"]
    assert main(["train", "--dataset", SPEC, "--epochs", "2", "--checkpoint-dir", str(ck)]) == 0
    path = ck / "epoch00002.pt"
    other = "planted:nodes=300,classes=3,seed=1"  # the same name, sizes and width
    cases = [
        (other, [], f"source (spec {SPEC}, scale None, seed 0) (this job: (spec {other}, "),
        ("planted:nodes=400,classes=3", [], "num_nodes 300 (this job: 400)"),
        (SPEC, ["--row-normalize"], "--row-normalize False (this job: True)"),
        (SPEC, ["--seed", "1"], "source (spec planted:nodes=300,classes=3, scale None, seed 0) "),
    ]
    capsys.readouterr()
    for spec, flags, diff in cases:
        assert main([*base, "--dataset", spec, *flags, "--resume", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"mgg train: error: checkpoint {path} was trained on other data")
        assert diff in err and "\n" not in err, err
    assert main([*base, "--dataset", SPEC, "--resume", str(path)]) == 0
    assert capsys.readouterr().err == ""
    raw = checkpoint.read(path)
    old = tmp_path / "old.pt"  # as mgg wrote them before checkpoints recorded their data
    meta = {k: v for k, v in raw["meta"].items() if k != "data"}
    checkpoint.write(old, raw["model"], raw["optimizer"], meta)
    assert main([*base, "--dataset", other, "--resume", str(old)]) == 0
    assert capsys.readouterr().err == (
        f"mgg train: warning: checkpoint {old} does not record the data it was trained on (an "
        "older mgg wrote it): resuming it on 'planted-n300-c3' unchecked\n"
    )


@pytest.mark.mpi
def test_a_checkpoint_of_a_file_resumes_on_its_shards_at_two_ranks(ds, tmp_path):
    """The data's identity is the same for a file at one rank and for its sharded dataset
    at two; another file of the same sizes is refused, named by its path and checksum."""
    from mgg.cli import main
    from mgg.graph.formats import write_graph
    from mgg.graph.generators import planted_partition
    from mgg.graph.specs import dataset_source

    f, g = tmp_path / "f.npz", tmp_path / "g.npz"
    write_graph(ds, f)
    write_graph(planted_partition(300, 3, seed=1), g)
    ck = tmp_path / "ck"
    t = make(resolve(str(f)), source=dataset_source(str(f)), checkpoint_dir=ck)
    oracle = [h["loss"] for h in t.fit(2)]
    del t
    with pytest.raises(
        CheckpointError,
        match=rf"other data: source {f} \(bytes \d+, blake2b_head_tail [0-9a-f]{{12}}\) "
        rf"\(this job: {g} \(bytes",
    ):
        make(resolve(str(g)), source=dataset_source(str(g))).load_checkpoint(ck / "epoch00002.pt")
    shards = tmp_path / "shards"
    assert main(["partition", str(f), "--np", "2", "--model", "gcn", "--out", str(shards)]) == 0
    r = mpirun(2, "mgg", "train", "--dataset", shards, "--epochs", "3", "--eval-every", "0",
               "--json", "--resume", ck / "epoch00002.pt")  # fmt: skip
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr[-3000:]
    assert last_json(r.stdout)["losses"][:2] == oracle
