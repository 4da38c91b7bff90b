"""What the GPU benchmarks share: CUDA-event timing, device facts, raw logs, results.

Results go to bench/results/gpu/<name>.json|.md|.png with the device name as the
driver reports it under "device", and the raw log beside them (<name>.log).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import RESULTS, ROOT, write_results  # noqa: E402

GPU_RESULTS = RESULTS / "gpu"

# datasheet HBM bandwidth (bytes/s), the bound the measured copy rate is held against
NOMINAL_HBM = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.039e12}


def device() -> dict:
    import cupy

    i = cupy.cuda.Device().id
    prop = cupy.cuda.runtime.getDeviceProperties(i)
    name = prop["name"].decode()
    free, total = cupy.cuda.runtime.memGetInfo()
    nominal = next((v for k, v in NOMINAL_HBM.items() if k in name), None)
    return {
        "device": name,
        "sms": prop["multiProcessorCount"],
        "memory_gib": round(total / 2**30, 1),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "nominal_hbm_bytes_per_s": nominal,
    }


def cuda_median(fn, repeat: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() between CUDA events on the current stream."""
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def cuda_compare(fns: dict, repeat: int = 20, warmup: int = 3) -> dict:
    """Median seconds of each callable, round-robin (they share the GPU's clocks)."""
    import cupy

    for f in fns.values():
        for _ in range(warmup):
            f()
    cupy.cuda.Device().synchronize()
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            f()
            end.record()
            end.synchronize()
            times[k].append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return {k: float(np.median(v)) for k, v in times.items()}


def copy_bandwidth(gib: float = 2.0) -> float:
    """Achievable device-memory bandwidth: a device-to-device copy, bytes read + written
    per second."""
    import cupy

    n = int(gib * 2**30 / 4)
    a = cupy.ones(n, cupy.float32)
    b = cupy.empty_like(a)
    t = cuda_median(lambda: b.__setitem__(slice(None), a), repeat=10)
    return 2 * n * 4 / t


@contextlib.contextmanager
def raw_log(name: str):
    """Tee stdout into bench/results/gpu/<name>.log."""
    GPU_RESULTS.mkdir(parents=True, exist_ok=True)
    path = GPU_RESULTS / f"{name}.log"
    with open(path, "w") as f:
        old = sys.stdout

        class Tee:
            def write(self, s):
                old.write(s)
                f.write(s)

            def flush(self):
                old.flush()
                f.flush()

        sys.stdout = Tee()
        try:
            yield path
        finally:
            sys.stdout = old


def write_gpu(
    name: str, payload: dict, rows: list[dict], columns: list[str], notes: str = ""
) -> Path:
    dev = device()
    return write_results(
        name,
        {**payload, "device_info": dev},
        rows,
        columns,
        notes,
        subdir="gpu",
        extra_meta={"device": dev["device"]},
    )


def standin_graph(name: str, scale: float = 1.0, *, features: bool = False):
    """A stand-in of the paper's Table 3 (R-MAT structure, the paper's sizes x scale)."""
    from mgg.graph.generators import standin

    return standin(name, scale, with_features=features)


PAPER_GRAPHS = ("reddit", "enwiki", "products", "proteins", "orkut")


def time_designs(
    graph,
    nprocs: int,
    dim: int,
    names,
    op: str = "sum",
    repeat: int = 10,
    knobs: dict | None = None,
    check: bool = True,
) -> dict:
    """Seconds per call of each GPU design over P virtual PEs (one call = every PE's
    aggregation, one after another on this GPU), round-robin; outputs are checked
    against scipy first. Also returns each design's setup seconds under 'setup'."""
    import cupy

    from mgg.baselines.cuda import GPU_DESIGNS
    from mgg.graph.generators import random_features
    from mgg.kernels import reference
    from mgg.partition import build_plan

    g = graph.gcn_norm() if op == "gcn" else graph
    plans = build_plan(g, nprocs, 16, transposed=False)
    x = random_features(0, 0, g.num_nodes, dim)
    designs = {}
    for name in names:
        kw = dict((knobs or {}).get(name, {}))
        designs[name] = GPU_DESIGNS[kw.pop("design", name)](plans, dim, **kw)
        designs[name].load(x)
    if check:
        ref = reference.aggregate(g, x, op)
        for name, d in designs.items():
            got = d.gather(d.run(op))
            err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
            if err > 1e-4:
                raise AssertionError(f"{name} differs from scipy by {err:.2e}")
    t = cuda_compare({k: (lambda d=d: d.run(op)) for k, d in designs.items()}, repeat)
    t["setup"] = {k: d.setup_seconds for k, d in designs.items()}
    designs.clear()
    cupy.get_default_memory_pool().free_all_blocks()
    return t


__all__ = [
    "ROOT",
    "GPU_RESULTS",
    "device",
    "cuda_median",
    "cuda_compare",
    "copy_bandwidth",
    "raw_log",
    "write_gpu",
    "standin_graph",
    "PAPER_GRAPHS",
    "time_designs",
]
