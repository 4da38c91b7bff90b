"""Sizes that pass argparse but that no job could run (issue 93): each refused before
the work starts, in seconds, with one line `mgg CMD: error: ...` naming the flag and the
bound (a policy says why) or the plan's numbers; never a loop over a million layers or
two billion ranks. Run in-process (mgg.cli.main), each within a generous wall time: the
point is seconds, not hours, on a loaded machine.

The memory limit is a bound the job stays under: a job run under MGG_MEMORY_LIMIT just
above its estimate peaks below the limit, its kernels compiled cold (a fresh numba
cache: the worst case)."""

from __future__ import annotations

import json
import re
import time

import pytest

from mgg.cli import main
from mgg.job import MAX_LAYERS, MAX_RANKS

from conftest import SHARED_DATA, run_mgg

CORA = str(SHARED_DATA / "cora.npz")
P = "planted:nodes=300,classes=3"
BIG = "2147483647"  # the top of every integer flag
WALL_S = 60

RANKS = rf"at most {MAX_RANKS:,} ranks \(a policy: "
LAYERS = rf"at most {MAX_LAYERS:,} layers \(a policy: "
PLAN = r"needs about [\d.]+ [KMGTP]iB per rank .* but this rank has"

CASES = [
    # ---- ranks: a loop over P before anything checked P --------------------------------
    ("plan-np", ["plan", CORA, "--np", BIG], rf"--np 2,147,483,647: {RANKS}"),
    ("plan-np-100k", ["plan", P, "--np", "100000"], rf"--np 100,000: {RANKS}"),
    ("plan-np-check", ["plan", P, "--command", "check", "--np", BIG, "--dim", BIG], RANKS),
    ("plan-np-partition", ["plan", P, "--command", "partition", "--np", "100000"], RANKS),
    ("partition-np-100k", ["partition", CORA, "--np", "100000"], rf"--np 100,000: {RANKS}"),
    ("partition-np", ["partition", CORA, "--np", BIG], rf"--np 2,147,483,647: {RANKS}"),
    ("partition-np-out", ["partition", P, "--np", BIG, "--out", "{tmp}/o"], RANKS),
    # ---- layers: a model of a million layers built (or planned) before its first step --
    ("plan-layers", ["plan", CORA, "--layers", "1000000"], rf"--layers 1,000,000: {LAYERS}"),
    ("plan-layers-hidden", ["plan", CORA, "--layers", "1000000", "--hidden", BIG], LAYERS),
    ("plan-layers-1025", ["plan", P, "--layers", str(MAX_LAYERS + 1)], LAYERS),
    ("train-layers", ["train", "--dataset", CORA, "--layers", "1000000"], LAYERS),
    (
        "train-layers-hidden-1",
        ["train", "--dataset", P, "--layers", "100000", "--hidden", "1"],
        LAYERS,
    ),  # fmt: skip
    ("train-layers-gat", ["train", "--dataset", P, "--model", "gat", "--layers", BIG], LAYERS),
    # ---- widths: refused by the plan, with its numbers, in O(layers) ---------------------
    ("train-hidden", ["train", "--dataset", CORA, "--hidden", BIG], PLAN),
    ("train-hidden-deep", ["train", "--dataset", P, "--hidden", BIG, "--layers", "1024"], PLAN),
    ("train-heads", ["train", "--dataset", P, "--model", "gat", "--heads", BIG], PLAN),
    (
        "train-heads-hidden",
        ["train", "--dataset", P, "--model", "gat", "--heads", BIG, "--hidden", BIG],
        PLAN,
    ),  # fmt: skip
    ("check-dim", ["check", CORA, "--dim", BIG], PLAN),
    ("tune-dim", ["tune", P, "--dim", BIG, "--out", "{tmp}/t"], PLAN),
    # ---- generators: sizes past what any id holds --------------------------------------
    (
        "plan-scale-1e300",
        ["plan", "reddit", "--scale", "1e300"],
        r"scale 1e\+300: a stand-in of .*\(int64 ids\)",
    ),  # fmt: skip
    ("train-scale-1e300", ["train", "--dataset", "products", "--scale", "1e300"], r"int64 ids"),
    ("check-rmat-62", ["check", "rmat:scale=62"], r"choose a smaller scale"),
    ("plan-planted-big", ["plan", f"planted:nodes={BIG},classes={BIG}"], r"choose a smaller scale"),
]


def _run(argv, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    took = time.perf_counter() - start
    out, err = capsys.readouterr()
    return code, err, took


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_size_no_job_could_run_is_refused_in_seconds(case, tmp_path, capsys, monkeypatch):
    if CORA in case[1] and not (SHARED_DATA / "cora.npz").exists():
        pytest.skip("needs ../shared/data/cora.npz")
    monkeypatch.setenv("MGG_PROGRESS", "0")
    monkeypatch.delenv("MGG_MEMORY_LIMIT", raising=False)
    _, argv, pattern = case
    if argv[0] == "train":
        argv = [*argv, "--epochs", "1"]
    code, err, took = _run(argv, tmp_path, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"mgg {argv[0]}: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert took < WALL_S, f"{took:.1f} s"


def test_a_np_fix_is_planned_against_that_jobs_own_budget(monkeypatch):
    """Ranks sharing a node share its memory: a --np fix is offered only where the job
    of that many ranks fits the budget each of its ranks has (``budget_of``), not the
    budget of the job as given; and never past MAX_RANKS."""
    from mgg.footprint import plan
    from mgg.graph.specs import spec_facts
    from mgg.memory import parse_size
    from mgg.torch import MODELS

    monkeypatch.setenv("MGG_MEMORY_LIMIT", "64G")  # --np fixes offered; each budget given
    facts = spec_facts("products:scale=0.05")
    kw = dict(model=MODELS["gcn"], hidden=256)
    host, device = parse_size("64G"), parse_size("1G")
    budget = {"host": host, "device": device}
    alone = plan(facts, 1, budget=budget, device=True, **kw)
    assert not alone["fits"] and any(f.startswith("--np") for f in alone["fixes"])
    first = int(next(f for f in alone["fixes"] if f.startswith("--np")).split()[1])
    # the same node's host memory shared by every rank: too little at that many ranks
    need = max(
        r["total_bytes"] for r in plan(facts, first, budget=budget, device=True, **kw)["per_rank"]
    )

    def share(p):
        return {"host": need * first // (2 * p), "device": device}

    shared = plan(facts, 1, budget=budget, device=True, budget_of=share, **kw)
    assert f"--np {first}" not in shared["fixes"], shared["fixes"]  # offered before
    for fix in shared["fixes"]:
        if fix.startswith("--np"):
            p = int(fix.split()[1])
            assert p <= MAX_RANKS and p != first, fix
            assert plan(facts, p, budget=share(p), device=True, **kw)["fits"], fix
    near = plan(facts, MAX_RANKS // 2, budget=budget, device=True, **kw)
    assert all(
        int(f.split()[1]) <= MAX_RANKS for f in near.get("fixes", []) if f.startswith("--np")
    )


def test_plan_refuses_what_train_refuses_at_parse_time(capsys):
    """The job's parameters parse in one place (Job.parse): a design the backend lacks, a
    model's option given to another model, too many layers: plan and train alike."""
    for extra, pattern in (
        (["--design", "nope"], r"unknown design 'nope' for the cpu backend"),
        (["--heads", "2"], r"--heads is an option of --model gat"),
        (["--layers", str(MAX_LAYERS + 1)], LAYERS),
        (["--output-rows", "labeled", "--model", "gin"], r"--output-rows labeled: the last"),
    ):
        got = []
        for argv in (["plan", P, *extra], ["train", "--dataset", P, "--epochs", "1", *extra]):
            code, err, _ = _run(argv, None, capsys)
            assert code == 2 and re.search(pattern, err), (argv, err)
            got.append(err.split("error: ", 1)[1])
        assert got[0] == got[1], got


def test_a_job_under_a_limit_just_above_its_estimate_peaks_below_it(tmp_path):
    """A Cora-sized GCN (a planted graph of its sizes: 2,708 nodes, 1,433 features, 7
    classes) under MGG_MEMORY_LIMIT just above its estimate peaks below the limit by its
    own peak report (peak_rss_mb: VmHWM), with numba's cache cold (a fresh NUMBA_CACHE_DIR:
    the job compiles every kernel, the worst case; part 'compile' counts it). Before, its
    estimate on Cora itself, 406.6 MiB, let it peak at 571 MiB cold."""
    from mgg.footprint import job_estimate, job_kw
    from mgg.graph.specs import resolve
    from mgg.job import Job
    from mgg.memory import budget_for

    spec = "planted:nodes=2708,classes=7,features=1433"
    estimate = job_estimate(resolve(spec), 1, "train", **job_kw(Job.parse({})))["total"]
    limit = budget_for(estimate) + 2**20
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), "MGG_MEMORY_LIMIT": str(limit)}
    res = run_mgg("train", "--dataset", spec, "--epochs", "3", "--json", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["planned_bytes"] == estimate
    peak = max(out["peak_rss_mb"]) * 2**20
    assert peak < limit, (peak / 2**20, limit / 2**20, estimate / 2**20)
