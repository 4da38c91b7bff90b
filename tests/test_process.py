"""Process-wide settings of `import mgg` (mgg/process.py), checked in real processes."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, mpirun

KERNEL = """
import numba, numpy as np

@numba.njit(cache=True, parallel=True)
def kernel(a):
    s = 0.0
    for i in numba.prange(a.size):
        s += np.sin(a[i]) * np.cos(a[i]) + np.sqrt(abs(a[i]))
    return s
"""

RUNNER = """
import json, sys
import mgg  # first, as any mgg program: installs the node's compile lock
sys.path.insert(0, sys.argv[1])
import kern
kern.kernel(__import__("numpy").arange(10.0))
st = kern.kernel.stats
print(json.dumps({"hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values())}))
"""


@pytest.mark.mpi
def test_ranks_of_a_node_compile_a_kernel_once(tmp_path):
    """Two ranks start together on an empty numba cache: one compiles, the other waits for
    the node's compile lock and loads what the first wrote (MGG_SERIAL_COMPILE=0 would let
    both compile)."""
    (tmp_path / "kern.py").write_text(KERNEL)
    (tmp_path / "run.py").write_text(RUNNER)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    r = mpirun(2, sys.executable, tmp_path / "run.py", tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    stats = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(stats) == 2, r.stdout
    assert sorted(s["misses"] for s in stats) == [0, 1], stats
    assert sorted(s["hits"] for s in stats) == [0, 1], stats


@pytest.mark.parametrize("torch_first", [False, True])
def test_torch_and_numba_share_one_openmp_runtime_if_mgg_comes_first(torch_first):
    code = f"""
import json, os
{"import torch" if torch_first else ""}
import mgg, numba, numpy as np, torch
torch.ones(64, 64) @ torch.ones(64, 64)

@numba.njit(parallel=True)
def f(a):
    for i in numba.prange(a.size):
        a[i] += 1

f(np.zeros(8))
gomp = {{line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}}
print(json.dumps({{"runtimes": len(gomp), "spin": os.environ.get("GOMP_SPINCOUNT")}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if torch_first:  # two pools: their idle threads must not spin
        assert got == {"runtimes": 2, "spin": "0"}
    else:
        assert got == {"runtimes": 1, "spin": None}


def test_ranks_on_a_node_as_each_launcher_reports_them():
    """One reading of the launcher's per-node count: mggrun's threads and the compile
    lock both follow it."""
    from mgg.launch import rank_environment
    from mgg.process import local_size

    assert local_size({}) == 1
    assert local_size({"MPI_LOCALNRANKS": "3", "SLURM_NTASKS_PER_NODE": "8"}) == 3
    assert local_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 4
    assert local_size({"SLURM_NTASKS_PER_NODE": "2(x3)"}) == 2
    env = rank_environment({"SLURM_NTASKS_PER_NODE": "2(x3)"}, cpus=8, gpus=0)
    assert env["MGG_LOCAL_SIZE"] == "2" and env["NUMBA_NUM_THREADS"] == "4"
    r = subprocess.run(
        [sys.executable, "-c", "import mgg, sys; print(type(sys.meta_path[0]).__name__)"],
        capture_output=True,
        text=True,
        env=dict(os.environ, MPI_LOCALNRANKS="junk"),
        cwd=ROOT,
    )
    assert r.returncode == 0 and r.stdout.strip() != "_OnImport", r.stderr[-2000:]


FREED = """
import json, sys
import numpy as np
import mgg
from mgg.process import fit_allocator

def rss_after_a_freed_array():
    a = np.ones(200 << 17)  # 200 MiB, touched
    del a
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmRSS"))

out = {"small_job": fit_allocator(False), "kept": rss_after_a_freed_array()}
out["large_job"] = fit_allocator(True)
out["returned"] = rss_after_a_freed_array()
print(json.dumps(out))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator")
def test_a_large_jobs_rank_gives_freed_memory_back_and_a_small_ones_keeps_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    r = subprocess.run(
        [sys.executable, "-c", FREED], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["small_job"] is False and got["large_job"] is True
    assert got["kept"] - got["returned"] > 150, got  # MB: the 200 MiB array stayed, then went back


@pytest.mark.parametrize("value", ["0", "abc", "-3"])
def test_a_bad_numba_num_threads_is_one_line_from_mgg_and_an_input_error_from_the_api(value):
    env = dict(os.environ, NUMBA_NUM_THREADS=value)  # numba's import raised a traceback on 0
    r = subprocess.run(
        [sys.executable, "-m", "mgg", "train", "--dataset", "planted:nodes=50,classes=2"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"mgg train: error: NUMBA_NUM_THREADS={value!r}: expected a whole number of threads "
        ">= 1 (unset it for every core)"
    ]
    api = "from mgg.backend import get_backend\ntry:\n    get_backend()\nexcept ValueError as e:\n"
    api += "    print(type(e).__name__, e)\n"
    r = subprocess.run([sys.executable, "-c", api], env=env, capture_output=True, text=True)
    assert r.stdout.startswith(f"InputError NUMBA_NUM_THREADS={value!r}"), r.stdout + r.stderr
