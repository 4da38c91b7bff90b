"""The paths a command writes to: an empty path, two outputs on one path (or one inside
the other), an output on or inside an input, or under a file, each refused before any
work in one line naming the flags (mgg.atomic.check_paths)."""

import os

import pytest

from mgg.atomic import PathError, check_paths

from conftest import mpirun, shared_dataset


def refused(capsys, argv: list, *words: str) -> None:
    from mgg.cli import main

    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], (w, err[0])


def test_empty_and_clashing_outputs_of_train_are_refused_before_any_work(
    tmp_path, capsys, monkeypatch
):
    cora = shared_dataset("cora")
    monkeypatch.chdir(tmp_path)  # an empty folder: nothing may land in it
    train = ["train", "--dataset", cora, "--epochs", "1"]
    d, ck = tmp_path / "d", tmp_path / "ck"
    cases = [
        (["--save", ""], "--save '': an empty path"),
        (["--log-dir", ""], "--log-dir '': an empty path"),
        (["--checkpoint-dir", ""], "--checkpoint-dir '': an empty path"),
        (["--save", " "], "--save ' ': an empty path"),
        (["--log-dir", d, "--save", d], f"--log-dir {d} is the same path as --save {d}"),
        (["--save", d, "--log-dir", d / "logs"], f"--log-dir {d}/logs is inside --save {d}"),
        (
            ["--checkpoint-dir", ck, "--log-dir", f"{ck}/."],
            f"--checkpoint-dir {ck} is the same path as --log-dir {ck}/.",
        ),
        (["--save", cora], f"--save {cora} is the same path as --dataset {cora}"),
        (["--log-dir", f"{cora}/logs"], f"--log-dir {cora}/logs is inside --dataset {cora}"),
    ]
    for extra, message in cases:
        refused(capsys, [*train, *extra], f"mgg train: error: {message}")
    assert os.listdir(tmp_path) == []  # refused before a folder was made


def test_an_output_under_a_file_or_in_a_read_only_folder_is_refused_before_training(
    tmp_path, capsys
):
    cora = shared_dataset("cora")
    (tmp_path / "f").write_text("x")
    train = ["train", "--dataset", cora, "--epochs", "1"]
    refused(
        capsys,
        [*train, "--save", tmp_path / "f/m"],
        f"{tmp_path}/f/m: cannot write it",
        "is a file",
    )
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        refused(capsys, [*train, "--save", ro / "m"], f"{ro}/m: cannot write it", "not writable")


def test_predict_out_empty_or_inside_its_model_or_data_is_refused(tmp_path, capsys, monkeypatch):
    cora = shared_dataset("cora")
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    for command in ("predict", "embed"):
        run = [command, "--model", model, "--dataset", cora]
        refused(capsys, [*run, "--out", ""], f"mgg {command}: error: --out '': an empty path")
        refused(capsys, [*run, "--out", model / "p"], f"--out {model}/p is inside --model {model}")
        refused(capsys, [*run, "--out", cora], f"--out {cora} is the same path as --dataset")
    assert os.listdir(tmp_path) == ["model"] and os.listdir(model) == []


def test_check_paths_allows_what_is_fine():
    check_paths({"--save": None, "--log-dir": None})  # nothing given
    # a checkpoint to resume from inside the checkpoint folder; logs beside a new model
    check_paths(
        {"--checkpoint-dir": "ck", "--log-dir": "logs", "--save": "m"},
        {"--resume": "ck/epoch00005.pt", "--dataset": "cora"},
        new=("--save",),
    )
    check_paths({"--log-dir": ".", "--save": "m"}, new=("--save",))  # new one inside an old
    with pytest.raises(PathError, match="--save m is inside --log-dir m/.."):
        check_paths({"--log-dir": "m/..", "--save": "m"}, new=("--log-dir", "--save"))


@pytest.mark.mpi
def test_clashing_outputs_end_a_two_rank_job_in_one_line(tmp_path):
    d = tmp_path / "d"
    r = mpirun(2, "mgg", "train", "--dataset", shared_dataset("cora"), "--log-dir", d, "--save", d)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert lines == [
        f"mgg train: error: --log-dir {d} is the same path as --save {d}: give "
        "--log-dir a path of its own"
    ], r.stderr
    assert not d.exists()


def test_convert_to_an_empty_path_is_refused_naming_it(capsys):
    refused(capsys, ["convert", "planted:nodes=50,classes=2", ""], "the output '': an empty path")


def test_partition_and_tune_outputs_empty_or_on_their_input_are_refused(
    tmp_path, capsys, monkeypatch
):
    cora = shared_dataset("cora")
    monkeypatch.chdir(tmp_path)  # tune's --out '' wrote its report into the current folder
    part = ["partition", cora, "--np", "2"]
    cases = [
        ([*part, "--out", ""], "mgg partition: error: --out '': an empty path"),
        ([*part, "--order", "rcm", "--save-order", ""], "--save-order '': an empty path"),
        ([*part, "--out", cora], f"--out {cora} is the same path as graph {cora}"),
        (
            [*part, "--order", "rcm", "--save-order", "o.npy", "--out", "o.npy"],
            "--save-order o.npy is the same path as --out o.npy",
        ),
        (["tune", cora, "--budget", "1", "--out", ""], "mgg tune: error: --out '': an empty"),
        (["tune", cora, "--budget", "1", "--out", cora], f"--out {cora} is the same path as"),
    ]
    for argv, message in cases:
        refused(capsys, argv, message)
    assert os.listdir(tmp_path) == []
