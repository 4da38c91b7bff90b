"""One device window, one command (bench/gpu/window.py, bench/gpu/plan.py): the plan's
steps in order until a deadline, each packed as it ends, the done ones remembered from
the committed results, and the whole plan's dry run on CPUs."""

import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT

sys.path[:0] = [str(ROOT / "bench" / "gpu"), str(ROOT / "bench")]
import plan  # noqa: E402
import window  # noqa: E402

PY = sys.executable
STAGE = ROOT / "bench" / "gpu" / "stage.py"


def py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


def item(name, code, estimate=1.0, timeout=30.0, files=()):
    return plan.Item(name, f"about {name}", py(code), [], estimate, timeout, files)


def writes(name: str, then: str = "") -> str:
    """A step that writes a file into its output folder, then does ``then``."""
    return f"""
        import os, pathlib, time
        pathlib.Path(os.environ["MGG_GPU_OUT"], "{name}.json").write_text("{{}}")
        print("{name}", "wrote", flush=True)
        {then}
    """


def env_for(_item):
    return dict(os.environ)


def members(out: Path) -> dict[str, set[str]]:
    got = {}
    for tar in sorted(out.glob("steps*.tar.gz")):
        with tarfile.open(tar) as t:
            got[tar.name] = set(t.getnames())
    return got


def test_a_window_runs_what_fits_in_order_and_packs_each_step_as_it_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(window, "PACK_SECONDS", 2.0)
    out, home = tmp_path / "out", tmp_path / "home"
    steps = [
        item("first", writes("first")),
        item("too-long", writes("too-long"), estimate=500, timeout=600),  # passed over
        item("fails", "import sys; print('about to fail'); sys.exit(3)"),
        item("overruns", writes("overruns", "time.sleep(300)"), estimate=1, timeout=300),
        item("after", writes("after")),  # nothing is left for it
    ]
    t0 = time.monotonic()
    s = window.run_window(steps, out, 14, env_for, home=home)
    took = time.monotonic() - t0
    by = {r["step"]: r for r in s["steps"]}
    assert by["first"]["ok"] and by["first"]["completed"]
    assert not by["too-long"]["started"] and "expected 500 s" in by["too-long"]["why"]
    assert by["fails"]["why"] == "exit status 3" and by["fails"]["completed"]
    # the deadline, not the step's own 300 s, ended it; what it wrote still came back
    assert by["overruns"]["timed_out"] and not by["overruns"]["completed"]
    assert by["overruns"]["seconds"] < 14 and "after" in by and not by["after"]["started"]
    assert took < 14 + 10
    assert len([p for p in out.iterdir()]) <= window.MAX_FILES
    got = set().union(*members(out).values())
    for name in ("first", "fails", "overruns"):
        assert f"{name}/step.json" in got and f"{name}/step.log" in got
    assert "overruns/overruns.json" in got and "too-long" not in {n.split("/")[0] for n in got}
    on_disk = json.loads((out / "window.json").read_text())
    assert [r["step"] for r in on_disk["steps"]] == [x.name for x in steps]
    assert on_disk["ok"] is False and on_disk["device"]
    log = (out / "window.log").read_text()
    assert "first wrote" in log and "about to fail" in log and "overruns wrote" in log


def test_volumes_split_so_that_no_returned_file_passes_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(window, "MAX_BYTES", 40_000)
    big = "pathlib.Path(os.environ['MGG_GPU_OUT'], 'big.bin').write_bytes(os.urandom(30_000))"
    steps = [item(f"s{i}", writes(f"s{i}", big)) for i in range(4)]
    window.run_window(steps, tmp_path, 120, env_for, home=tmp_path / "home")
    vols = members(tmp_path)
    assert len(vols) >= 2 and all(p.stat().st_size <= 40_000 for p in tmp_path.glob("*.tar.gz"))
    tops = [{n.split("/")[0] for n in names} for names in vols.values()]
    assert sorted(set().union(*tops)) == ["s0", "s1", "s2", "s3"]
    assert sum(len(t) for t in tops) == 4  # each step whole, in one volume


def test_done_steps_are_remembered_at_the_same_code_and_run_again_when_it_changes(
    tmp_path, monkeypatch
):
    root = tmp_path / "root"
    (root / "mgg").mkdir(parents=True)
    (root / "mgg" / "core.py").write_text("x = 1\n")
    (root / "bench.py").write_text("y = 1\n")
    monkeypatch.setattr(window, "ROOT", root)
    home, steps = tmp_path / "home", [item("a", writes("a"), files=("bench.py",))]
    first = window.run_window(steps, tmp_path / "w1", 60, env_for, home=home)
    assert first["steps"][0]["ok"]
    (tmp_path / "w1" / "window.json").write_text(
        json.dumps({**first, "date": "2026-11-28 10:00:00"})
    )
    assert window.collect_window(tmp_path / "w1", home) == [home / "a"]
    assert (home / "a" / "a.json").exists() and list((home / "runs").glob("*.json"))
    done, expected, why = window.status(steps[0], home)
    assert done and "ok at" in why and expected < 30  # its last run's time, not the estimate
    again = window.run_window(steps, tmp_path / "w2", 60, env_for, home=home)
    assert again["steps"] == []  # nothing to do at the same code
    assert window.run_window(steps, tmp_path / "w3", 60, env_for, home=home, redo={"a"})["steps"][
        0
    ]["ok"]
    for path in (root / "bench.py", root / "mgg" / "core.py"):
        path.write_text(path.read_text() + "# changed\n")
        done, _, why = window.status(steps[0], home)
        assert not done and why.startswith("code changed")
        window.run_window(steps, tmp_path / "w4", 60, env_for, home=home)
        window.collect_window(tmp_path / "w4", home)
        assert window.status(steps[0], home)[0]
    cut = {**json.loads((home / "a" / "step.json").read_text()), "completed": False}
    (home / "a" / "step.json").write_text(json.dumps(cut))
    assert not window.status(steps[0], home)[0]  # a step cut short is not done


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_window_ended_by_a_signal_kills_its_steps_and_returns_what_they_wrote(tmp_path, jobs):
    """One at a time (a GPU window) or side by side (a dry run: the steps wait in worker
    threads, which no signal reaches): every step in flight is killed, recorded as cut
    and packed with what it wrote."""
    out, names = tmp_path / "out", [f"long{i}" for i in range(jobs)]
    steps = [(n, py(writes(n, "time.sleep(300)"))) for n in names]
    parent = py(f"""
        import os, pathlib, sys
        sys.path.insert(0, {str(ROOT / "bench" / "gpu")!r})
        import plan, runner, window
        runner.end_steps_on_signals()
        steps = [plan.Item(n, "", argv, [], 1, 300) for n, argv in {steps!r}]
        try:
            window.run_window(steps, pathlib.Path({str(out)!r}), 300, lambda i: dict(os.environ),
                              home=pathlib.Path({str(tmp_path / "home")!r}), jobs={jobs})
        except runner.Ended:
            sys.exit(124)
    """)
    proc = subprocess.Popen(parent, stdout=subprocess.PIPE, text=True)
    deadline, seen = time.monotonic() + 60, set()
    for line in proc.stdout:
        seen |= {n for n in names if f"{n} wrote" in line}
        if seen == set(names):
            break
        assert time.monotonic() < deadline
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 124
    summary = json.loads((out / "window.json").read_text())
    assert summary["ended_by"] == "SIGTERM"
    assert [r["step"] for r in summary["steps"]] == names
    for rec in summary["steps"]:
        assert not rec["completed"] and "ended" in rec["why"], rec
    packed = set().union(*members(out).values())
    assert {f"{n}/{f}" for n in names for f in (f"{n}.json", "step.json")} <= packed
    assert not window_processes(names)


def window_processes(names) -> list[str]:
    """Command lines of processes still running one of the steps ``names``."""
    found = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmd.read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(f'"{n}", "wrote"' in text for n in names):
            found.append(text)
    return found


def test_test_steps_pass_only_when_every_named_test_passed():
    assert plan.all_passed("....\n5 passed in 3.20s\n") is None
    assert "skipped" in plan.all_passed("4 passed, 1 skipped in 2.0s")
    assert "failed" in plan.all_passed("===== 1 failed, 3 passed in 9.1s =====")
    assert plan.all_passed("no tests ran in 0.01s") is not None  # all deselected, or none
    ids = ["tests/test_a.py::test_x", "tests/test_a.py::test_y[gat]"]
    check = plan.collected(ids)
    assert (
        check("tests/test_a.py::test_x\ntests/test_a.py::test_y[gat]\n\n2 tests collected") is None
    )
    assert "test_y" in check("tests/test_a.py::test_x[1]\n\n1 test collected")


def test_the_plan_is_the_issues_order_and_each_step_can_run_in_a_window():
    steps = plan.plan()
    names = [s.name for s in steps]
    assert len(set(names)) == len(names)
    assert names[:6] == ["api", "fixes", "pes-rows", "pes-fp32", "pes-bf16", "e2e-0.05"]
    assert names.index("kernel") < names.index("papers") < names.index("papers-80g")
    assert names.index("papers-80g") < names.index("locality")
    for s in steps:
        assert s.estimate <= s.timeout <= 560 - 30, s.name  # fits a window after its setup
        assert window.fingerprint(s.files)  # every file it depends on exists
        assert s.dry and s.dry[0] == s.argv[0], s.name
        # the dry run runs the same script, or collects the same tests
        script = next(w for a in s.argv for w in a.split() if w.endswith(".py") or w == "pytest")
        assert script in " ".join(s.dry) and set(s.tests) <= set(s.dry), s.name
        if "--backend" in s.dry:
            assert s.dry_argv("cuda")[s.dry.index("--backend") + 1] == "cuda"
    for s in steps:
        for t in s.tests:
            assert (ROOT / t.split("::")[0]).exists()


def test_window_flags_are_checked_before_anything_runs(tmp_path):
    def run(*args):
        return subprocess.run([PY, str(STAGE), "window", *args], capture_output=True, text=True)

    r = run("--out", str(tmp_path), "--only", "fixes,nope")
    assert r.returncode == 2 and "--only: no step nope" in r.stderr
    assert run("--out", str(tmp_path), "--backend", "cpu").returncode == 2
    r = run("--out", str(tmp_path), "--deadline", "900")
    assert r.returncode == 2 and "--deadline 900" in r.stderr
    assert not list(tmp_path.iterdir())
    r = run("--plan", "--deadline", "560")
    assert r.returncode == 0 and "fixes" in r.stdout and "runs" in r.stdout


def test_collect_refuses_a_dry_run(tmp_path):
    (tmp_path / "window.json").write_text(json.dumps({"dry_run": True, "steps": []}))
    with pytest.raises(SystemExit, match="a dry run"):
        window.collect_window(tmp_path, tmp_path / "home")


@pytest.mark.mpi
@pytest.mark.slow
def test_the_whole_plan_runs_at_toy_size_on_cpus(tmp_path):
    """`stage.py window --dry-run --backend cpu`: every step's script, flags and files at
    toy size, so that no device minute is lost to a Python error or a wrong flag; and
    what the benchmarks' CPU twins measured is what their GPU runs will record."""
    t0 = time.monotonic()
    r = subprocess.run(
        [PY, str(STAGE), "window", "--dry-run", "--backend", "cpu", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - t0
    summary = json.loads((tmp_path / "window.json").read_text())
    bad = {s["step"]: s.get("why") for s in summary["steps"] if not s["ok"]}
    assert r.returncode == 0 and not bad, (bad, r.stdout[-3000:], r.stderr[-2000:])
    assert [s["step"] for s in summary["steps"]] == [s.name for s in plan.plan()]
    assert len(list(tmp_path.iterdir())) <= window.MAX_FILES
    steps = tmp_path / "steps"
    for tar in tmp_path.glob("steps*.tar.gz"):
        with tarfile.open(tar) as t:
            t.extractall(steps, filter="data")
    e2e_rows(json.loads((steps / "e2e-0.05" / "e2e_vs_pyg_cpu.json").read_text()))
    kernel_rows(json.loads((steps / "kernel" / "kernel_ab_cpu.json").read_text()))
    locality_rows(json.loads((steps / "locality" / "locality_cpu.json").read_text()))
    for name in ("papers", "papers-80g"):
        (path,) = (steps / name).glob("papers_gpu_cpu*.json")  # -1g: --device-memory 1G
        (row,) = json.loads(path.read_text())["table"]
        assert not row.get("refused") and row["fits"] and row["hidden"] == 128, row
        assert row["prepare_s"] > 0 and row["epoch_s"] > 0 and row["pes"] == 1
    graph = {}
    for s in plan.plan():
        if s.name.startswith("fullsize-"):
            (row,) = json.loads((steps / s.name / "fullsize_cpu.json").read_text())["table"]
            assert "oom" not in row and row["epoch_s"] > 0, row
            graph[s.name] = row["graph"]
    assert graph == {f"fullsize-{g}": g for g in ("reddit", "products", "proteins", "orkut",
                                                  "enwiki")}  # fmt: skip
    print(f"dry run of {len(summary['steps'])} steps: {took:.1f} s")


def e2e_rows(res):
    """A row per model with mgg's and PyG's times, the captured sides skipped (they need
    CUDA), PyG's setup the expert's: int64 training rows, fused Adam."""
    from pyg_models import PATHS

    assert res["backend"] == "cpu" and res["partial"] is False
    assert res["meta"]["device"].startswith("cpu")
    rows = {r["model"]: r for r in res["table"]}
    assert sorted(rows) == ["gat", "gcn"]
    for model, row in rows.items():
        forms = PATHS[model]
        assert row["mgg_ms"] > 0 and row["pyg_best_ms"] > 0 and row["vs_pyg_best"] > 0
        assert row["pyg_best_path"] in forms  # the captured sides did not run
        assert row["pyg_best_ms"] == min(row[f"pyg_{f}_ms"] for f in forms)
        assert row["mgg_graph_ms"] is None and row["host_ms"] is None
        why = dict(part.split(": ", 1) for part in row["skipped"].split("; "))
        assert sorted(why) == sorted(["mgg_graph", *(f"pyg_graph_{f}" for f in forms)])
        assert all(w.startswith("needs CUDA") for w in why.values())
        for setup in row["pyg_setup"].values():
            assert setup["train_rows"].startswith("torch.int64 [") and setup["adam"]["fused"]


def kernel_rows(res):
    """Both dtypes at the four widths, positive times, within the oracle's tolerance; ncu
    commands over one inner run (never the whole benchmark: GPU run 8) at 16 and 128."""
    got = {(r["dtype"], r["D"]) for r in res["table"]}
    assert got == {(t, d) for t in ("float32", "bfloat16") for d in (16, 64, 128, 256)}
    for r in res["table"]:
        assert r["mgg_ms"] > 0 and r["cusparse_ms"] > 0, r
        assert r["max_rel_error"] < (1e-2 if r["dtype"] == "bfloat16" else 1e-4), r
    for cmd in res["ncu_commands"].values():
        assert cmd[-3] == "--inner" and cmd[-1] == "--profile" and "--backend" not in cmd
        assert cmd[cmd.index("--dims") + 1] == "16,128"


def locality_rows(res):
    """A row per order (metis too: pymetis is a dev dependency), each order computed,
    natural's ratio to itself 1, no hit rates without ncu."""
    assert {r["source"] for r in res["table"]} == {"natural", "rcm", "metis"}
    assert all(res["orders"][o]["how"].startswith("computed") for o in ("rcm", "metis"))
    assert all(r["vs_natural"] == 1.0 for r in res["table"] if r["source"] == "natural")
    assert all(r["mgg_ms"] > 0 and r["l1_hit_pct"] is None for r in res["table"])
