import os
import subprocess
import sys
from pathlib import Path

# make test's workers (and the ranks they start) share the cores: an idle OpenMP thread
# of torch or numba sleeps instead of spinning on a core another process needs. libgomp
# reads this as it loads: here, before anything imports mgg.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mgg.graph import Graph  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def have_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device
        return False


gpu = pytest.mark.skipif(not have_gpu(), reason="needs cupy and an NVIDIA GPU")


def pytest_runtest_logreport(report):
    """With MGG_TEST_REPORT set (bench/gpu/stage.py's steps): each test's outcome and time
    as it ends, and a failure's traceback at once, so that a step killed at its limit
    still says which tests failed, why, and where its time went."""
    if not os.environ.get("MGG_TEST_REPORT") or (report.when != "call" and report.passed):
        return
    line = f"\n[{report.outcome} {report.when} {report.duration:.1f} s] {report.nodeid}"
    if report.failed:
        line += "\n" + report.longreprtext
    print(line, file=sys.__stdout__, flush=True)


def virtual_design(design: str, plans, x, **knobs):
    """A virtual design (mgg.designs.virtual) over P PEs on this GPU with x [N, D] written
    into its input."""
    from mgg.backend import assign
    from mgg.designs import get_design

    d = get_design("virtual", design)(plans, None, x.shape[1], **knobs)
    assign(d.x, x)
    return d


def shared_dataset(name: str) -> Path:
    """Path of a real graph in ../shared/data, or skip the test when it is absent."""
    p = SHARED_DATA / f"{name}.npz"
    if not p.exists():
        pytest.skip(f"{p} not available")
    return p


def held_weights(plan):
    """``plan`` (and its transposed plan) with GCN's weights held per edge, made from its
    factors (norm, halo_norm), as a weighted graph's plan holds them."""
    from dataclasses import replace

    if plan.norm is None:
        return plan
    lw, rw = plan.edge_weights()
    t = None if plan._transposed is None else held_weights(plan._transposed)
    return replace(
        plan, norm=None, halo_norm=None, local_weights=lw, remote_weights=rw, _transposed=t
    )


def random_graph(rng, n, e, *, hub_src=False, hub_dst=False, self_loops=True, isolated=0):
    """A messy random graph: duplicates, optional hubs, self loops, isolated tail nodes."""
    m = max(n - isolated, 1)
    src = rng.integers(0, m, e)
    dst = rng.integers(0, m, e)
    if hub_src and e:
        src[: e // 3] = rng.integers(0, m)
    if hub_dst and e:
        dst[e // 3 : 2 * e // 3] = rng.integers(0, m)
    if not self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    return Graph.from_edges(src, dst, n)


def assert_agg_close(out, ref, graph, x):
    """float32-aware comparison: error scaled by the magnitude of what was summed."""
    a = graph.to_scipy()
    a.data = np.abs(a.data).astype(np.float64)
    mag = a @ np.abs(x.astype(np.float64)) + np.abs(x)
    eps = 1e-5 if x.dtype == np.float32 else 1e-12
    np.testing.assert_array_less(np.abs(out - ref), eps * (mag + 1.0))


# What a test starts, by the words of its command line: the marker it must carry, so that
# `make test-quick` (-m "not mpi and not compile") leaves out exactly those tests.
STARTS = {"mggrun": "mpi", "mpiexec": "mpi", "nvcc": "compile"}


@pytest.fixture(autouse=True)
def _marked_for_what_it_starts(request, monkeypatch):
    """Fail a test that starts mpiexec (mggrun) without the mpi marker, or nvcc without
    the compile marker: the quick tier's split is explicit, and held to."""
    marks = {m.name for m in request.node.iter_markers()}
    start = subprocess.Popen.__init__

    def checked(self, args, *a, **kw):
        words = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        for word in map(os.fspath, words):
            for name, mark in STARTS.items():
                if Path(str(word)).name == name and mark not in marks:
                    pytest.fail(f"this test starts {name}: mark it @pytest.mark.{mark}")
        start(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked)


@pytest.fixture
def rng():
    return np.random.default_rng(int(os.environ.get("MGG_TEST_SEED", "0")))


ROOT = Path(__file__).resolve().parents[1]


def mpi_runs(nprocs: int, args: list, variants: list, setup: str = "", timeout: float = 180):
    """`mgg ARGS VARIANT` (ARGS with --json) for each variant in turn, in one mggrun job of
    ``nprocs`` ranks (one start-up), after the Python lines ``setup``; rank 0's JSON of
    each run, in order (the job must succeed)."""
    import json

    job = (
        f"import sys\nfrom mgg.cli import main\n{setup}\n"
        f"for extra in {[list(map(str, v)) for v in variants]!r}:\n"
        f"    assert main([*{list(map(str, args))!r}, *extra]) == 0\n"
        "    sys.stdout.flush()\n"
    )
    out = mpirun(nprocs, "python", "-c", job, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]


def mpirun(nprocs: int, *args, timeout: float = 180, env=None):
    """Run ``mggrun -np nprocs ARGS`` for real; returns the CompletedProcess."""
    import subprocess
    import sys

    full_env = {**os.environ, "MGG_PROGRESS": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(nprocs), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


def run_mgg(*args, env=None, timeout: float = 120):
    """Run ``python -m mgg ARGS`` as one process (no mpiexec); the CompletedProcess."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "mgg", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "MGG_PROGRESS": "0", **(env or {})},
    )


def kill_when_stalled(argv, env: dict, what: str):
    """Start ``argv`` (a command one of whose writes is stopped by a test-only STALL
    variable in ``env``), SIGKILL it once it prints "stalled writing PATH", and return PATH
    (the temporary it was writing); the test fails if it ends before (``what``: before
    which write)."""
    import signal
    import subprocess

    env = {**os.environ, "MGG_PROGRESS": "0", **env}
    job = subprocess.Popen([*map(str, argv)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                           text=True, env=env)  # fmt: skip
    try:
        seen = []
        for line in job.stderr:
            if line.startswith("stalled writing "):
                return Path(line.split()[-1])
            seen.append(line)
        pytest.fail(f"the job ended before {what}: {''.join(seen)[-2000:]}")
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()


def last_json(stdout: str) -> dict:
    import json

    return json.loads(stdout.strip().splitlines()[-1])
