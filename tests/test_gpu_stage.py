"""The GPU machine's entry point (bench/gpu/stage.py) and what the GPU benchmarks decide
on the host: step limits and process-group kills, results written as they come, the
wheel set and the MPICH recipe, bringing results home, the peers' memory budget."""

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import gpu_env  # noqa: E402
import stage  # noqa: E402

SHARED_WHEELS = ROOT.parent / "shared" / "wheels" / "gpu-py312"
PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


def test_a_stage_runs_its_steps_within_their_limits_and_records_each(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    out = tmp_path / "out" / "fake"
    steps = [
        stage.Step("ok", py("print('hello from ok'); print('{\"np\": 2}')"), 30),
        stage.Step(
            "reads-summary",
            py(f"""
                import json
                s = json.load(open({str(out / "stage.json")!r}))
                print("steps so far:", [x["step"] for x in s["steps"]], s["ok"])
                print("in flight:", s["steps"][-1]["why"])
            """),
            30,
        ),
        stage.Step("fails", py("import sys; print('about to fail'); sys.exit(3)"), 30),
        stage.Step(
            "hangs",
            py(f"""
                import subprocess, time
                p = subprocess.Popen(["sleep", "300"])
                open({str(pidfile)!r}, "w").write(str(p.pid))
                print("started", flush=True)
                time.sleep(300)
            """),
            3,
        ),
        stage.Step(
            "wrong-json", py("print('{\"np\": 1}')"), 30, lambda res: f"np is {res['np']}, not 2"
        ),
        stage.Step("last", py("print('last')"), 30),
    ]
    t0 = time.monotonic()
    summary = stage.run_stage(
        stage.Stage("fake", "a fake stage", steps),
        out,
        dict(os.environ),
        {"stage": "fake", "t0": t0},
        budget=40,
    )
    took = time.monotonic() - t0
    by = {s["step"]: s for s in summary["steps"]}
    assert by["ok"]["ok"] and by["ok"]["rc"] == 0
    assert by["fails"]["ok"] is False and by["fails"]["why"] == "exit status 3"
    assert by["hangs"]["timed_out"] and by["hangs"]["seconds"] < 15
    assert by["wrong-json"]["ok"] is False and by["wrong-json"]["why"] == "np is 1, not 2"
    assert by["wrong-json"]["result"] == {"np": 1}
    assert summary["ok"] is False
    # the step's whole process group went down with it, grandchild included
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    # stage.json was rewritten after each step (the second step read the first's record),
    # and says of the step in flight that a command killed now cut it
    log = (out / "stage.log").read_text()
    assert "steps so far: ['ok', 'reads-summary'] False" in log
    assert "in flight: cut: the command ended during this step" in log
    assert "hello from ok" in log and "about to fail" in log and "started" in log
    on_disk = json.loads((out / "stage.json").read_text())
    assert [s["step"] for s in on_disk["steps"]] == [s.name for s in steps]
    assert took < 40


def test_steps_that_no_longer_fit_the_budget_are_not_started(tmp_path):
    steps = [stage.Step(f"s{i}", py("import time; time.sleep(0.1)"), 30) for i in range(2)]
    summary = stage.run_stage(
        stage.Stage("late", "", steps),
        tmp_path,
        dict(os.environ),
        {"t0": time.monotonic() - 100},
        budget=100 + stage.MIN_STEP / 2,
    )
    assert [s["ok"] for s in summary["steps"]] == [False, False]
    assert all(s["why"].startswith("not started") for s in summary["steps"])


def test_every_stage_is_planned_to_end_inside_its_budget():
    """A device command has 600 s; a stage plans for STAGE_BUDGET, setup included, and
    its steps' limits add up to less."""
    for quick in (False, True):
        for name, st in stage.stages(quick).items():
            assert st.steps, name
            assert sum(s.timeout for s in st.steps) <= stage.STAGE_BUDGET - 20, name
    assert stage.STAGE_BUDGET <= 600 - 60
    # the order the GPU issues run them in
    assert list(stage.stages())[:4] == ["probe", "tests", "pes", "check"]


def test_a_stage_step_says_each_failure_as_it_happens(capfd, monkeypatch):
    """Under MGG_TEST_REPORT a failed test's name, time and traceback are printed when it
    ends (a step killed at its limit prints pytest's summary never); a pass, one line."""
    import conftest

    fail = pytest.TestReport("t.py::bad", ("t.py", 1, "bad"), {}, "failed", "E  planted", "call",
                             duration=2.5)  # fmt: skip
    ok = pytest.TestReport("t.py::ok", ("t.py", 1, "ok"), {}, "passed", None, "setup")
    conftest.pytest_runtest_logreport(fail)
    assert capfd.readouterr().out == ""
    monkeypatch.setenv("MGG_TEST_REPORT", "1")
    conftest.pytest_runtest_logreport(fail)
    conftest.pytest_runtest_logreport(ok)
    monkeypatch.undo()  # before this test's own report
    assert capfd.readouterr().out == "\n[failed call 2.5 s] t.py::bad\nE  planted\n"


def test_check_steps_reject_a_job_of_singletons_or_the_wrong_remote_path():
    expect = stage._check_json(4, "get")
    run = {"design": "pipelined", "op": "sum", "ok": True, "remote_path": {"mode": "get"}}
    assert expect({"np": 4, "runs": [run]}) is None
    assert "1 ranks, not 4" in expect({"np": 1, "runs": [run]})
    p2p = {**run, "remote_path": {"mode": "p2p"}}
    assert "not get" in expect({"np": 4, "runs": [p2p]})
    assert "differs" in expect({"np": 4, "runs": [{**run, "ok": False}]})
    assert expect(None) == "no JSON result printed"


def test_a_stage_followed_by_another_is_packed_before_the_next_starts(tmp_path):
    """A command killed during its last stage still returns the earlier ones whole: each
    stage but the last is one tarball. Both scripts fail at once here (no GPU; --args
    hands them an unknown option), which still writes their stage files."""
    argv = ["kernel", "e2e", "--out", str(tmp_path), "--no-setup", "--quick"]
    argv += ["--args", "kernel=--no-such-option", "--args", "e2e=--no-such-option"]
    assert stage.main(argv) == 1
    assert not (tmp_path / "kernel").exists()
    with tarfile.open(tmp_path / "kernel.tar.gz") as t:
        assert "kernel/stage.json" in t.getnames()
    last = json.loads((tmp_path / "e2e" / "stage.json").read_text())
    assert "--no-such-option" in last["steps"][0]["command"] and not last["ok"]


def test_results_beyond_what_a_command_returns_are_packed(tmp_path):
    d = tmp_path / "tests"
    d.mkdir()
    for i in range(3):
        (d / f"f{i}.txt").write_text(str(i))
    assert stage.pack_if_needed(tmp_path, d) is None  # 3 files: they come back as they are
    for i in range(3, 10):
        (d / f"f{i}.txt").write_text(str(i))
    tar = stage.pack_if_needed(tmp_path, d)
    assert tar is not None and not d.exists()
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) <= stage.MAX_FILES
    with tarfile.open(tar) as t:
        assert sorted(t.getnames())[-1] == "tests/f9.txt"


def _wheel(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, (data, mode) in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def test_the_wheel_set_is_exactly_nvshmem4py_mpi4py_and_mpich(tmp_path):
    names = [
        "nvshmem4py_cu13-0.4.1-cp312-cp312-manylinux2014_x86_64.whl",
        "mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.whl",
        "mpich-5.0.2-py3-none-manylinux_2_28_x86_64.whl",
    ]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    found = gpu_env.find_wheels(tmp_path)
    assert {k: v.name for k, v in found.items()} == dict(
        zip(["nvshmem4py", "mpi4py", "mpich"], names, strict=True)
    )
    (tmp_path / "mpi4py-4.0.0-cp312-cp312-manylinux1_x86_64.whl").write_bytes(b"")
    with pytest.raises(gpu_env.SetupError, match="exactly one mpi4py wheel, found 2"):
        gpu_env.find_wheels(tmp_path)
    (tmp_path / "mpi4py-4.0.0-cp312-cp312-manylinux1_x86_64.whl").unlink()
    (tmp_path / names[2]).unlink()
    with pytest.raises(gpu_env.SetupError, match="exactly one mpich wheel, found 0"):
        gpu_env.find_wheels(tmp_path)
    with pytest.raises(gpu_env.SetupError, match="fetch_wheels.sh"):
        gpu_env.find_wheels(tmp_path / "absent")
    if SHARED_WHEELS.is_dir():  # the wheels the GPU machine gets
        assert set(gpu_env.find_wheels(SHARED_WHEELS)) == {"nvshmem4py", "mpi4py", "mpich"}


@pytest.mark.mpi
def test_unzipping_keeps_mpiexec_executable_and_the_environment_puts_it_first(tmp_path):
    wheel = _wheel(
        tmp_path / "mpich-9.9-py3-none-any.whl",
        {
            "mpich-9.9.data/data/bin/mpiexec": (b"#!/bin/sh\necho launched\n", 0o755),
            "mpich-9.9.data/data/lib/libmpi.so.12": (b"", 0o644),
        },
    )
    gpu_env.unzip_keeping_modes(wheel, tmp_path / "mp")
    prefix = gpu_env.mpich_prefix(tmp_path / "mp")
    assert subprocess.run([prefix / "bin" / "mpiexec"], capture_output=True).stdout == b"launched\n"
    env = gpu_env.environment(
        {"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere"}, tmp_path / "site", prefix, tmp_path
    )
    assert env["PYTHONPATH"].split(os.pathsep)[:3] == [
        str(tmp_path / "site"),
        str(stage.ROOT),
        "/elsewhere",
    ]
    assert env["PATH"].startswith(str(prefix / "bin")) and env["LD_LIBRARY_PATH"] == str(
        prefix / "lib"
    )
    assert env["MGG_TEST_REPORT"] == "1"  # each test's outcome as it ends (conftest)
    assert env["MGG_MPIEXEC"] == str(prefix / "bin" / "mpiexec")
    assert env["NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"] == "lo"
    with pytest.raises(gpu_env.SetupError, match="no mpich"):
        gpu_env.mpich_prefix(tmp_path / "nothing")


@pytest.mark.mpi
def test_the_mpich_recipe_gives_a_real_two_rank_world(tmp_path):
    """gpu.md's recipe on this machine: the mpich wheel unzipped (not pip --target), its
    lib/ on LD_LIBRARY_PATH, its mpiexec launching two ranks that see each other."""
    wheels = sorted(SHARED_WHEELS.glob("mpich-*.whl"))
    if not wheels:
        pytest.skip(f"no mpich wheel in {SHARED_WHEELS}")
    gpu_env.unzip_keeping_modes(wheels[0], tmp_path / "mp")
    prefix = gpu_env.mpich_prefix(tmp_path / "mp")
    env = gpu_env.environment(dict(os.environ), tmp_path / "site", prefix, tmp_path)
    r = subprocess.run(
        [env["MGG_MPIEXEC"], "-n", "2", PY, "-c", gpu_env.PREFLIGHT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MPICH" in r.stdout


def test_collect_brings_results_home_and_writes_the_notes(tmp_path, monkeypatch):
    home, notes = tmp_path / "home", tmp_path / "gpu-notes.md"
    notes.write_text("# GPU notes\n\nHand-written part.\n")
    monkeypatch.setattr(stage, "HOME", home)
    monkeypatch.setattr(stage, "NOTES", notes)
    returned = tmp_path / "files_at"
    probe = returned / "probe"
    probe.mkdir(parents=True)
    summary = {
        "stage": "probe",
        "ok": False,
        "device": "NVIDIA H100 80GB HBM3",
        "commit": "abc123",
        "date": "2026-11-23",
        "versions": {"cupy": "14.2.0"},
        "steps": [
            {"step": "probe-np2", "ok": True, "why": None},
            {"step": "probe-np4", "ok": False, "why": "killed at its limit of 160 s"},
        ],
    }
    (probe / "stage.json").write_text(json.dumps(summary))
    recs = [
        {"step": "1. init", "ok": True, "detail": {"n_pes": 2}, "rank": r, "np": 2}
        for r in range(2)
    ] + [
        {"step": "3. peers", "ok": r == 0, "error": "NvshmemError: no peer", "rank": r, "np": 2}
        for r in range(2)
    ]
    (probe / "probe-np2.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    # a second stage, returned as a tarball
    check = tmp_path / "check"
    check.mkdir()
    (check / "stage.json").write_text(json.dumps({**summary, "stage": "check", "ok": True}))
    with tarfile.open(returned / "check.tar.gz", "w:gz") as t:
        t.add(check, arcname="check")
    assert stage.main(["collect", str(returned)]) == 0
    assert (home / "probe" / "probe-np2.jsonl").exists()
    assert (home / "check" / "stage.json").exists()
    text = notes.read_text()
    assert "Hand-written part." in text
    assert "| probe | FAILED | NVIDIA H100 80GB HBM3 | `abc123` |" in text
    assert "probe-np4 FAIL (killed at its limit of 160 s)" in text
    assert "| 2 | 1. init | 2/2 |" in text and "| 2 | 3. peers | 1/2 | NvshmemError" in text
    stage.render_notes(home, notes)  # again: the generated block is replaced, not added
    assert notes.read_text().count(stage.BEGIN) == 1


def test_peers_that_do_not_fit_in_gpu_memory_are_skipped_not_run():
    from aggregation import fit_peers, peer_bytes

    n, e = 232_965, 114_615_892
    wide = peer_bytes(n, e, 128, weighted=True)
    assert wide["pyg"] > 2 * e * 128 * 4  # two E x D matrices: about 117 GB
    run, skipped = fit_peers(wide, int(0.9 * 80e9))
    assert run == ["mgg", "cusparse"] and "pyg" in skipped and "GB" in skipped["pyg"]
    narrow = peer_bytes(n, e, 16, weighted=False)
    assert narrow["pyg"] < wide["pyg"] / 8
    assert fit_peers(narrow, int(0.9 * 80e9)) == (["mgg", "cusparse", "pyg"], {})
    run, skipped = fit_peers(narrow, 1)  # the subject always runs; peers only if they fit
    assert run == ["mgg"] and set(skipped) == {"cusparse", "pyg"}


def test_the_sampled_oracle_equals_the_whole_one_on_its_rows(rng):
    from mgg.kernels import reference

    from conftest import random_graph

    g = random_graph(rng, 500, 4000, hub_dst=True, isolated=20).gcn_norm()
    x = rng.standard_normal((500, 7)).astype(np.float32)
    rows = np.sort(rng.choice(500, 60, replace=False))
    for op in ("sum", "mean", "gcn", "gin"):
        whole = reference.aggregate(g, x, op, eps=0.4)
        np.testing.assert_allclose(reference.aggregate(g, x, op, eps=0.4, rows=rows), whole[rows])


def test_benchmark_rows_are_on_disk_as_soon_as_they_are_measured(tmp_path, monkeypatch):
    import common_gpu

    monkeypatch.setattr(common_gpu, "GPU_RESULTS", tmp_path)
    monkeypatch.setattr(common_gpu, "device", lambda: {"device": "NVIDIA H100 80GB HBM3"})
    drawn = []
    res = common_gpu.Results(
        "fake", {"np": 4}, ["graph", "ms", "uvm_advice_verified"], plot=lambda r, p: drawn.append(p)
    )
    res.add({"graph": "reddit", "ms": 1.5, "uvm_advice_verified": True})
    first = json.loads((tmp_path / "fake.json").read_text())
    assert first["partial"] is True and first["table"][0]["graph"] == "reddit"
    assert first["meta"]["device"] == "NVIDIA H100 80GB HBM3" and first["meta"]["command"]
    assert "| reddit | 1.5 | yes |" in (tmp_path / "fake.md").read_text()
    res.add({"graph": "orkut", "ms": 2.0, "uvm_advice_verified": False})
    assert res.finish(mean=1.75) == 3  # a UVM row whose placement did not take effect
    final = json.loads((tmp_path / "fake.json").read_text())
    assert final["partial"] is False and final["mean"] == 1.75 and len(final["table"]) == 2
    assert drawn == [tmp_path / "fake.png"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_stage_ended_by_a_signal_kills_its_step_first(tmp_path):
    """A device command's `timeout` signals stage.py, not the step's own session: the
    step (and what it started) must not run on into the next command."""
    pids = tmp_path / "pids"
    step = py(f"""
        import os, subprocess, time
        p = subprocess.Popen(["sleep", "300"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{p.pid}}")
        time.sleep(300)
    """)
    parent = py(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "bench" / "gpu")!r})
        import runner
        runner.end_steps_on_signals()
        try:
            runner.run_step(runner.Step("long", {step!r}, 300), 300, None, sys.stdout)
        except runner.Ended as e:
            print("ended by", e, flush=True)
            sys.exit(124)
    """)
    proc = subprocess.Popen(parent, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    child, grandchild = map(int, pids.read_text().split())
    t0 = time.monotonic()
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 124 and "ended by SIGTERM" in out
    assert time.monotonic() - t0 < 15
    time.sleep(0.2)
    for pid in (child, grandchild):
        gone = not Path(f"/proc/{pid}").exists()
        assert gone or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid
