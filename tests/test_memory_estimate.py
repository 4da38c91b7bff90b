"""`mgg train`'s memory estimate against the peak RSS (VmHWM) each rank then reaches: the
reliability issue's acceptance is within 30% (bench/memory_estimate.py: a wider range).

The estimate models a warm numba cache. On a cold one the first run of each model also holds
LLVM's compile memory (100-300 MB measured, and kept by the allocator afterwards), so a
separate job compiles and caches the kernels first."""

import json

import pytest

from mgg.cli import main

from conftest import mpirun

RUNS = (("gcn", 20_000), ("gcn", 80_000), ("gcn", 200_000), ("gat", 60_000))

JOB = """
import sys
from mgg.cli import main

for model, n in %r:  # one job, several runs: VmHWM reset before each (Linux >= 4.0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    spec = f"planted:nodes={n},classes=8,degree=12,features=32"
    assert main(["train", "--dataset", spec, "--model", model, "--epochs", "2", "--json"]) == 0
    sys.stdout.flush()
"""


@pytest.mark.mpi
def test_estimate_within_30_percent_on_three_sizes_and_attention():
    warm = mpirun(2, "python", "-c", JOB % ((("gcn", 2000), ("gat", 2000)),))
    assert warm.returncode == 0, warm.stderr[-2000:]
    out = mpirun(2, "python", "-c", JOB % (RUNS,))
    assert out.returncode == 0, out.stderr[-2000:]
    runs = [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert [(r["model"], r["num_nodes"]) for r in runs] == list(RUNS)
    for r in runs:
        est = r["memory_estimate_mb"]
        for peak in r["peak_rss_mb"]:
            assert 0.7 * peak <= est <= 1.3 * peak, (r["num_nodes"], est, r["peak_rss_mb"])
    assert runs[2]["memory_estimate_mb"] > runs[0]["memory_estimate_mb"] + 100


def test_refused_before_allocating(monkeypatch, capsys):
    monkeypatch.setenv("MGG_MEMORY_LIMIT", "150M")
    assert main(["train", "--dataset", "planted:nodes=300000,classes=8", "--epochs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "planted:nodes=300000,classes=8" in err[0], err
    assert "MGG_MEMORY_LIMIT=150M" in err[0], err
