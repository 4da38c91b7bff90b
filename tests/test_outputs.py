"""The output folder of `mgg partition --out D`: one writer at a time, nothing temporary
left after an error, a Ctrl-C, a SIGTERM or (after the next run) a SIGKILL, and errors
that name the user's path (a full disk, a read-only folder)."""

import errno
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mgg.atomic import hold, is_temporary
from mgg.cli import main
from mgg.graph.dataset import Dataset
from mgg.graph.formats import write_graph
from mgg.partition.shards import ShardedDataset, lock_path

from conftest import ROOT, mpirun, random_graph

# `mgg ARGS`, with rank 0's shard writer pausing after its first shard: it writes the
# file $MARK (its pid) and waits until $MARK.go exists. The phase a test kills it in.
PAUSED = """
import faulthandler, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal: a shell
# starts its background jobs (make test &) with SIGINT ignored, and children inherit it
import mgg.partition.distributed as dist
import mgg.partition.shards as shards
from mgg.cli import main

real, mark = shards.write_shard, os.environ["MARK"]

def paused(target, plan, rows):
    table = real(target, plan, rows)
    # _ended's stacks of a hang (here: mgg's own handler of SIGUSR1 is set by now)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if plan.rank == 0:
        with open(mark + ".part", "w") as f:
            f.write(str(os.getpid()))
        os.replace(mark + ".part", mark)
        end = time.time() + 120
        while not os.path.exists(mark + ".go") and time.time() < end:
            time.sleep(0.02)
    return table

shards.write_shard = dist.write_shard = paused
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def graph(tmp_path):
    rng = np.random.default_rng(0)
    n = 2000
    g = random_graph(rng, n, 20000)
    x = rng.standard_normal((n, 64)).astype(np.float32)  # 256 KiB per 500 nodes
    path = tmp_path / "g.npz"
    write_graph(Dataset("g", g, x, rng.integers(0, 5, n)), path)
    return path


def _paused(tmp_path, *args, launcher=()):
    """Start ``mgg ARGS`` (under ``launcher``, e.g. mggrun) paused after rank 0's first
    shard; returns (process, mark) once the pause is reached."""
    script = tmp_path / "paused.py"
    script.write_text(PAUSED)
    mark = tmp_path / "mark"
    env = dict(os.environ, MARK=str(mark), MGG_PROGRESS="0")
    python = ["python"] if launcher else [sys.executable]  # mggrun runs python as its own
    cmd = [*launcher, *python, *map(str, [script, *args])]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.time() + 120
    while not mark.exists():
        if proc.poll() is not None or time.time() > end:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the writer never reached its first shard: {err.decode()[-2000:]}")
        time.sleep(0.05)
    return proc, mark


def _ended(proc, timeout: float) -> int:
    """proc's exit code once it ends within ``timeout`` s; else fail with the stacks of
    its threads (SIGUSR1: the PAUSED script's faulthandler) and its stderr."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running {timeout} s on; its stacks:\n{err.decode()[-6000:]}")


def _temporaries(folder):
    return [p.name for p in folder.iterdir() if is_temporary(p)]


def _cli(capsys, *args):
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


# ---- case 1: concurrent writers -----------------------------------------------------------
def test_a_second_writer_is_refused_while_the_first_writes(tmp_path, graph, capsys):
    out = tmp_path / "d"
    first, mark = _paused(tmp_path, "partition", graph, "--np", "2", "--out", out)
    pid = mark.read_text()
    for force in ([], ["--force"]):
        code, err = _cli(capsys, "partition", graph, "--np", "4", "--out", out, *force)
        assert code == 2 and f"error: {out} is in use by another job (pid {pid} on " in err, err
        assert "wait until it ends, or write to another --out" in err
    (tmp_path / "mark.go").touch()
    assert _ended(first, 120) == 0, first.stderr.read().decode()[-2000:]
    assert ShardedDataset(out).np == 2  # the first job's output, whole
    code, err = _cli(capsys, "partition", graph, "--np", "4", "--out", out)
    assert code == 2 and f"{out}: already exists (pass --force" in err
    assert _cli(capsys, "partition", graph, "--np", "4", "--out", out, "--force")[0] == 0
    assert ShardedDataset(out).np == 4 and _temporaries(tmp_path) == []


def test_commit_checks_again_that_the_output_is_absent(tmp_path, graph, monkeypatch, capsys):
    """A folder that appeared at D while the shards were written (by something that does
    not take the lock) is not replaced without --force."""
    import mgg.partition.shards as shards

    out, real = tmp_path / "d", shards.write_shard

    def and_someone_writes_out(target, plan, rows):
        out.mkdir(exist_ok=True)
        (out / "theirs.txt").write_text("keep me")
        return real(target, plan, rows)

    monkeypatch.setattr(shards, "write_shard", and_someone_writes_out)
    code, err = _cli(capsys, "partition", graph, "--np", "2", "--out", out)
    assert code == 2 and f"{out}: already exists" in err, err
    assert [p.name for p in out.iterdir()] == ["theirs.txt"] and _temporaries(tmp_path) == []


@pytest.mark.mpi
def test_every_rank_of_a_distributed_writer_gets_the_lock_error(tmp_path, graph):
    out = tmp_path / "d"
    lock = hold(lock_path(out), "test")
    r = mpirun(2, "mgg", "partition", graph, "--out", out, "--distributed", timeout=120)
    lock.release()
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"error: {out} is in use by another job (pid {os.getpid()} on " in r.stderr
    assert r.stderr.count("error:") == 1, r.stderr
    assert not out.exists() and _temporaries(tmp_path) == []
    out.mkdir()  # checked before the work, on every rank: one error, from rank 0
    r = mpirun(2, "mgg", "partition", graph, "--out", out, "--distributed", timeout=120)
    assert r.returncode == 2 and r.stderr.count("error:") == 1, r.stderr[-2000:]
    assert f"error: {out}: already exists (pass --force" in r.stderr


# ---- case 3: killed writers ---------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_ctrl_c_or_sigterm_while_writing_leaves_nothing(tmp_path, graph, sig):
    out = tmp_path / "d"
    proc, _ = _paused(tmp_path, "partition", graph, "--np", "2", "--out", out)
    assert len(_temporaries(tmp_path)) == 1  # the write has started
    proc.send_signal(sig)
    assert _ended(proc, 60) == 128 + sig
    word = "interrupted" if sig == signal.SIGINT else "terminated"
    assert proc.stderr.read().decode().strip().splitlines() == [f"mgg partition: {word}"]
    assert not out.exists() and _temporaries(tmp_path) == []


def test_a_killed_writers_leftovers_are_swept_by_the_next_run(tmp_path, graph, capsys):
    out = tmp_path / "d"
    proc, _ = _paused(tmp_path, "partition", graph, "--np", "2", "--out", out)
    proc.kill()
    proc.wait(60)
    left = _temporaries(tmp_path)
    assert len(left) == 1 and (tmp_path / left[0] / "rank-0000").is_dir() and not out.exists()
    assert _cli(capsys, "partition", graph, "--np", "2", "--out", out)[0] == 0
    assert _temporaries(tmp_path) == [] and ShardedDataset(out).np == 2


@pytest.mark.mpi
def test_a_ctrl_c_of_a_distributed_writer_leaves_nothing(tmp_path, graph):
    out = tmp_path / "d"
    mggrun = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", "2"]
    args = ("partition", graph, "--out", out, "--distributed")
    proc, _ = _paused(tmp_path, *args, launcher=mggrun)
    assert len(_temporaries(tmp_path)) == 1
    proc.send_signal(signal.SIGINT)
    assert _ended(proc, 60) == 130, proc.stderr.read().decode()[-2000:]
    assert not out.exists() and _temporaries(tmp_path) == []


# ---- cases 4 and 6: a full disk, a read-only folder ---------------------------------------
def _mount_tmpfs(folder, options):
    """Mount a tmpfs on ``folder`` (root only, with the capability), else skip."""
    folder.mkdir()
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True
        )
    except OSError as e:
        pytest.skip(f"cannot mount a tmpfs: {e}")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")


@pytest.fixture
def small_disk(tmp_path):
    """A 192 KiB file system: the shards of ``graph`` do not fit."""
    disk = tmp_path / "small"
    _mount_tmpfs(disk, "size=192k")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


FULL = r"{out}/rank-000[01]/[\w.]+\.npy: cannot write it: No space left on device$"


def test_a_full_disk_names_the_file_and_leaves_nothing(small_disk, graph, capsys):
    out = small_disk / "d"
    code, err = _cli(capsys, "partition", graph, "--np", "2", "--out", out)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("mgg partition: error: ")
    assert re.search(FULL.format(out=re.escape(str(out))), line), line
    assert [p.name for p in small_disk.iterdir()] == [".d.lock"]  # no out, no temporary


@pytest.mark.mpi
def test_a_full_disk_under_a_distributed_writer_ends_every_rank(small_disk, graph):
    out = small_disk / "d"
    r = mpirun(2, "mgg", "partition", graph, "--out", out, "--distributed", timeout=120)
    assert r.returncode == 2 and r.stderr.count("error:") == 1, r.stderr[-2000:]
    assert re.search(FULL.format(out=re.escape(str(out))), r.stderr.strip(), re.M), r.stderr
    assert [p.name for p in small_disk.iterdir()] == [".d.lock"]


def test_a_full_disk_simulated(tmp_path, graph, monkeypatch, capsys):
    """Where no small file system can be mounted: ENOSPC simulated in the lowest write of a
    shard's file (after half of it is written), as a real full disk raises it."""
    import mgg.partition.shards as shards

    real = shards._write_npy

    def full_at_x(path, a):
        if path.name == "x.npy" and "rank-0001" in str(path):
            path.write_bytes(b"\x93NUMPY half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, a)

    monkeypatch.setattr(shards, "_write_npy", full_at_x)
    out = tmp_path / "d"
    code, err = _cli(capsys, "partition", graph, "--np", "2", "--out", out)
    assert code == 2
    assert err.strip().endswith(f"{out}/rank-0001/x.npy: cannot write it: No space left on device")
    assert not out.exists() and _temporaries(tmp_path) == []


# ---- the other writers: a full disk, a read-only folder, named as the user wrote them ----
@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A small model of ``SMALL`` (mgg train --save) for predict and embed."""
    model = tmp_path_factory.mktemp("model") / "m"
    assert main(["train", "--dataset", SMALL, "--epochs", "1", "--save", str(model)]) == 0
    return model


SMALL = "planted:nodes=1000,classes=4,features=16"


def test_every_writer_names_the_user_s_path_on_a_full_disk(tmp_path, saved_model, capsys):
    """A 4 KiB disk under each writer: torch's "unexpected pos N vs M" (--save), a
    library's write without a file name (metrics.jsonl, curves.png, convert's .npz) and
    a SIGBUS in a memory-mapped store (predict, embed: now allocated before they are
    mapped) each were what a full disk gave; now one line names the file under the
    user's path, and nothing temporary is left."""
    disk = tmp_path / "small"
    _mount_tmpfs(disk, "size=4k")
    d = re.escape(str(disk))
    try:
        train = ["train", "--dataset", SMALL, "--epochs", "1"]
        infer = ["--model", saved_model, "--dataset", SMALL, "--out", disk / "p"]
        cases = [
            ([*train, "--save", disk / "m"], f"{d}/m/model.(pt|json)"),
            ([*train, "--log-dir", disk / "log"], f"{d}/log/(metrics.jsonl|curves.png)"),
            (["convert", SMALL, disk / "c.npz"], f"{d}/c.npz"),
            (["predict", *infer], f"{d}/p/pred.npy"),
            (["embed", *infer], f"{d}/p/emb.npy"),
        ]
        for argv, named in cases:
            code, err = _cli(capsys, *argv)
            line = (err.strip().splitlines() or [""])[-1]
            assert code == 2 and re.fullmatch(
                f"mgg \\w+: error: {named}: cannot write it: No space left on device", line
            ), (argv, err)
            left = [p.name for p in disk.rglob("*")]
            assert not [p for p in left if is_temporary(p) or p.endswith(".npy")], left
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_every_writer_names_the_user_s_path_in_a_read_only_folder(tmp_path, graph, capsys):
    """Removing a temporary that was never made raised EROFS, which named the temporary."""
    ro = tmp_path / "ro"
    if os.geteuid() == 0:
        _mount_tmpfs(ro, "ro,size=64k")
    else:
        ro.mkdir()
        ro.chmod(0o555)
    train = ["train", "--dataset", SMALL, "--epochs", "1"]
    cases = [
        ([*train, "--log-dir", ro], f"{ro}: cannot write it: the folder is not writable"),
        ([*train, "--save", ro / "m"], f"{ro}/m: cannot write it: {ro} is not writable"),
        (["convert", graph, ro / "c.npz"], f"{ro}/c.npz: cannot write it: "),
        (["partition", graph, "--np", "2", "--out", ro / "d"], f"{ro}/d: cannot write it: "),
        (
            ["partition", graph, "--np", "2", "--order", "rcm", "--save-order", ro / "o.npy"],
            f"{ro}/o.npy: cannot write it: ",
        ),  # fmt: skip
    ]
    try:
        for argv, message in cases:
            code, err = _cli(capsys, *argv)
            line = (err.strip().splitlines() or [""])[-1]
            assert code == 2 and message in line and ".tmp-" not in err, (argv, err)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], check=False)
        else:
            ro.chmod(0o755)
