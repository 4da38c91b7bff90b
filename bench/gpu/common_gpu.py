"""What the GPU benchmarks share: CUDA-event timing, device facts, raw logs, results.

Results go to $MGG_GPU_OUT (set by bench/gpu/stage.py to the stage's output folder on
the GPU machine) or else bench/results/gpu/: <name>.json|.md|.png and the raw log
<name>.log, each JSON naming the device as the driver reports it under "device". Rows
are written as they are measured, so a run killed at its limit keeps what it measured.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import RESULTS, ROOT, write_results  # noqa: E402

GPU_RESULTS = Path(os.environ.get("MGG_GPU_OUT") or RESULTS / "gpu")

# datasheet HBM bandwidth (bytes/s), the bound the measured copy rate is held against
NOMINAL_HBM = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.039e12}

CHECK_ROWS = 4096  # rows of a large output checked against scipy (a random sample)
TOLERANCE = 1e-4  # max |got - want| / max(1, max |want|)


@functools.cache
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
    return cuda_compare({"fn": fn}, repeat, warmup)["fn"]


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


def cusparse_matrix(graph, weights, index_dtype=np.int32):
    """The graph's in-edge CSR as a torch sparse CSR tensor on the GPU (offsets and
    columns of ``index_dtype``, ``weights`` a torch float32 [E]): ``a @ x`` is torch's
    cuSPARSE SpMM."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's beta-state warning for sparse CSR
        return torch.sparse_csr_tensor(
            torch.from_numpy(graph.indptr.astype(index_dtype)),
            torch.from_numpy(graph.indices.astype(index_dtype)),
            weights,
            size=(graph.num_nodes,) * 2,
        ).cuda()


# cusparseSpMMAlg_t (cusparse.h) for a CSR matrix
SPMM_ALGS = {"alg_default": 0, "csr_alg1": 4, "csr_alg2": 6, "csr_alg3": 12}


class CusparseSpMM:
    """out [N, D] = A @ x through cuSPARSE's generic SpMM in its best form for a graph:
    CSR with int32 offsets and columns, float32 values [E], row-major x [N, D] and out,
    the output and workspace allocated once, algorithm ``alg`` (SPMM_ALGS)."""

    def __init__(self, indptr, indices, values, x, alg: str):
        import cupy
        from cupy_backends.cuda.libs import cusparse as cs

        n, d = x.shape
        self.cs, self.keep = cs, (indptr, indices, values, x)
        self.out = cupy.empty_like(x)
        f32 = getattr(cupy.cuda.runtime, "CUDA_R_32F", 0)
        i32, zero = cs.CUSPARSE_INDEX_32I, cs.CUSPARSE_INDEX_BASE_ZERO
        row = cs.CUSPARSE_ORDER_ROW
        self.a = cs.createCsr(
            n, n, indices.size, indptr.data.ptr, indices.data.ptr, values.data.ptr,
            i32, i32, zero, f32,
        )  # fmt: skip
        self.b = cs.createDnMat(n, d, d, x.data.ptr, f32, row)
        self.c = cs.createDnMat(n, d, d, self.out.data.ptr, f32, row)
        self.handle = cupy.cuda.device.get_cusparse_handle()
        self.alpha, self.beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        op = cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        self.args = (op, op, self.alpha.ctypes.data, self.a, self.b, self.beta.ctypes.data)
        self.tail = (self.c, f32, SPMM_ALGS[alg])
        size = cs.spMM_bufferSize(self.handle, *self.args, *self.tail)
        self.buf = cupy.empty(max(size, 1), cupy.int8)
        if alg == "csr_alg3":  # its analysis, once, as the documentation asks
            cs.spMM_preprocess(self.handle, *self.args, *self.tail, self.buf.data.ptr)

    def __call__(self):
        self.cs.spMM(self.handle, *self.args, *self.tail, self.buf.data.ptr)
        return self.out

    def close(self) -> None:
        self.cs.destroySpMat(self.a)
        self.cs.destroyDnMat(self.b)
        self.cs.destroyDnMat(self.c)


def cusparse_forms(graph, weights, x) -> tuple[dict, dict]:
    """cuSPARSE's forms of out = A @ x for a graph (weights: float32 [E] host array, x: a
    cupy [N, D] float32): ({form: fn returning out}, {form: why it could not be built}).
    Forms: torch's SpMM with int64 and with int32 indices, and the generic API in each
    SPMM_ALGS algorithm (CusparseSpMM). The fastest is cuSPARSE at its best."""
    import cupy
    import torch

    fns, failed = {}, {}
    w = torch.from_numpy(np.ascontiguousarray(weights, np.float32))
    xt = torch.as_tensor(x, device="cuda")
    for name, dtype in (("torch_int64", np.int64), ("torch_int32", np.int32)):
        try:
            a = cusparse_matrix(graph, w, dtype)
            fns[name] = lambda a=a: a @ xt
            fns[name]()
        except Exception as e:  # noqa: BLE001 - a form this torch lacks is reported
            fns.pop(name, None)
            failed[name] = f"{type(e).__name__}: {e}"
    ip = cupy.asarray(graph.indptr.astype(np.int32))
    ix = cupy.asarray(graph.indices.astype(np.int32))
    vals = cupy.asarray(np.ascontiguousarray(weights, np.float32))
    for alg in SPMM_ALGS:
        try:
            fns[alg] = CusparseSpMM(ip, ix, vals, x, alg)
            fns[alg]()
        except Exception as e:  # noqa: BLE001 - an algorithm cuSPARSE refuses is reported
            fns.pop(alg, None)
            failed[alg] = f"{type(e).__name__}: {e}"
    return fns, failed


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
    """Tee stdout into <results>/<name>.log, flushed line by line."""
    GPU_RESULTS.mkdir(parents=True, exist_ok=True)
    path = GPU_RESULTS / f"{name}.log"
    with open(path, "w", buffering=1) as f:
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


def grouped_bars(path, rows, group, bars, title, ylabel, goal=None, log=False, line="goal"):
    """A bar chart at path: one group per group(row), the bars of each group the merged
    bars(row) dicts ({label: value}, None skipped); goal draws a dashed line, named line.
    A callable title (of a row) gives each title's rows a panel of its own, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, dict[str, dict]] = {}
    for r in rows:
        groups = panels.setdefault(title(r) if callable(title) else title, {})
        groups.setdefault(group(r), {}).update(bars(r))
    labels = {t: list(dict.fromkeys(k for g in gs.values() for k in g)) for t, gs in panels.items()}
    widths = [max(6, 1.1 * len(gs) * max(1, len(labels[t])) ** 0.5) for t, gs in panels.items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4), sharey=True, squeeze=False)
    for ax, (t, groups) in zip(axes[0], panels.items(), strict=True):
        w = 0.8 / max(1, len(labels[t]))
        for i, label in enumerate(labels[t]):
            xs = [j + i * w for j, g in enumerate(groups.values()) if g.get(label) is not None]
            ys = [g[label] for g in groups.values() if g.get(label) is not None]
            ax.bar(xs, ys, w, label=label)
        if goal is not None:
            ax.axhline(goal, color="k", ls="--", lw=1, label=f"{line} {goal:g}")
        ticks = np.arange(len(groups)) + w * (len(labels[t]) - 1) / 2
        ax.set_xticks(ticks, list(groups), fontsize=8)
        if log:
            ax.set_yscale("log")
        ax.set_title(t)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Results:
    """One benchmark's result files, rewritten after every row (JSON + markdown), with
    the device, commit and command. ``plot(rows, path)`` draws <name>.png at the end.
    ``device_info``: the device facts to record ({"device": ..., ...}) where they are not
    the GPU's (a CPU dry run: then cupy is never imported); default device()."""

    def __init__(
        self,
        name: str,
        payload: dict,
        columns: list[str],
        notes: str = "",
        plot=None,
        device_info: dict | None = None,
    ):
        self.name, self.payload, self.columns, self.notes = name, dict(payload), columns, notes
        self.plot, self.rows, self.device_info = plot, [], device_info

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write(partial=True)

    def write(self, partial: bool = False) -> Path:
        dev = device() if self.device_info is None else self.device_info
        return write_results(
            self.name,
            {**self.payload, "partial": partial, "device_info": dev},
            self.rows,
            self.columns,
            self.notes,
            out_dir=GPU_RESULTS,
            extra_meta={"device": dev["device"]},
        )

    def finish(self, **payload) -> int:
        """Final write and plot; the exit status: 3 where a row's managed-memory placement
        (<name>_advice_verified) was not verified (its UVM numbers would not measure what
        they say), else 0."""
        self.payload.update(payload)
        if self.plot is not None and self.rows:
            self.plot(self.rows, GPU_RESULTS / f"{self.name}.png")
        self.write()
        tag = "_advice_verified"
        bad = [(k, r) for r in self.rows for k, v in r.items() if k.endswith(tag) and v is False]
        for k, r in bad:
            name = k.removesuffix(tag)
            print(f"{name} placement not verified: {r.get(f'{name}_advice')}", flush=True)
        return 3 if bad else 0


def standin_graph(name: str, scale: float = 1.0, *, features: bool = False):
    """A stand-in of the paper's Table 3 (R-MAT structure, the paper's sizes x scale)."""
    from mgg.graph.generators import standin

    return standin(name, scale, with_features=features)


PAPER_GRAPHS = ("reddit", "enwiki", "products", "proteins", "orkut")


def check_output(
    graph, x, op: str, got, eps: float = 0.0, label: str = "", tolerance: float = TOLERANCE
) -> float:
    """Relative error of an [N, D] output against scipy on a random sample of rows;
    raises AssertionError above ``tolerance`` (bf16 rows: mgg.harness.check.tolerance)."""
    from mgg.kernels import reference

    n = graph.num_nodes
    rows = np.sort(np.random.default_rng(0).choice(n, min(n, CHECK_ROWS), replace=False))
    want = reference.aggregate(graph, x, op, eps=eps, rows=rows)
    err = float(np.abs(np.asarray(got)[rows] - want).max() / max(1.0, np.abs(want).max()))
    if err > tolerance:
        raise AssertionError(f"{label} differs from scipy by {err:.2e}")
    return err


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
    against scipy first. Also returns each design's setup seconds under 'setup', and the
    placement of each managed-memory design (uvm, uvm_hbm) under '<name>_advice'."""
    import cupy

    from mgg.backend import assign
    from mgg.designs import get_design
    from mgg.graph.dataset import random_features
    from mgg.partition import build_plan

    g = graph.gcn_norm() if op == "gcn" else graph
    plans = build_plan(g, nprocs, 16, transposed=False)
    x = random_features(0, 0, g.num_nodes, dim)
    designs = {}
    for name in names:
        kw = dict((knobs or {}).get(name, {}))
        designs[name] = get_design("virtual", kw.pop("design", name))(plans, None, dim, **kw)
        assign(designs[name].x, x)
    if check:
        for name, d in designs.items():
            check_output(g, x, op, cupy.asnumpy(d(op)), label=name)
    t = cuda_compare({k: (lambda d=d: d(op)) for k, d in designs.items()}, repeat)
    t["setup"] = {k: d.setup_seconds for k, d in designs.items()}
    for k, d in designs.items():
        if hasattr(d, "advice"):
            t[f"{k}_advice"] = d.advice
    designs.clear()
    cupy.get_default_memory_pool().free_all_blocks()
    return t


def uvm_columns(t: dict, name: str = "uvm") -> dict:
    """The row fields that say whether design ``name``'s managed-memory placement took
    effect."""
    a = t[f"{name}_advice"]
    return {f"{name}_advice_verified": a["verified"], f"{name}_advice": a["detail"]}


__all__ = [
    "ROOT",
    "GPU_RESULTS",
    "Results",
    "device",
    "cuda_median",
    "cuda_compare",
    "copy_bandwidth",
    "cusparse_forms",
    "CusparseSpMM",
    "check_output",
    "raw_log",
    "standin_graph",
    "PAPER_GRAPHS",
    "time_designs",
    "uvm_columns",
]
