"""What times one kernel source: the inner run (one process per source) over a side,
the GPU's (the design, cuSPARSE, CUDA events, ncu's profiled range, registers) or the
dry mode's host side, whose registers come from the NVRTC compile check."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from pathlib import Path

import numpy as np
from common_gpu import check_output, cuda_compare, cusparse_matrix

CONFIGS = [(64, 1, 4), (128, 1, 4)]  # (ps, dist, wpb): the best of aggregation.py's sweep
OPS = ("sum", "gcn")
ARCH = "sm_90"  # the compile check's target: H100 and H200, the GPUs these runs get


def variant(factored: bool, op: str, dim: int, bf16: bool) -> tuple[int, tuple[int, int]]:
    """(MGG_WEIGHTED, width class) of the p2p kernel that op's design loads at width dim
    (``factored``: its plan has GCN's weights as norms): what the GPU run reads the
    registers of, and the dry mode compiles."""
    import mgg.kernels.cuda as kc

    weighted = (kc.NORMS if factored else 1) if op == "gcn" else 0
    return weighted, kc.width_class(dim, 1, 2) if bf16 else kc.width_class(dim)


class GpuSide:
    """The inner's work on the GPU: the virtual pipelined design (the source's kernel),
    torch's cuSPARSE, CUDA events."""

    def __init__(self, source: str | None):
        import cupy

        import mgg.kernels.cuda as kc

        if source:
            kc.SOURCE = Path(source)
        self.cupy, self.kc = cupy, kc

    def kernel(self, plan, dim: int, x: np.ndarray, config, bf16: bool = False):
        """The design over one plan (a callable of the op) with rows x (bf16: x's words)."""
        from mgg.backend import assign
        from mgg.designs import get_design
        from mgg.precision import BF16

        pipelined = get_design("virtual", "pipelined")
        ps, dist, wpb = config
        if not bf16:
            d = pipelined([plan], None, dim, dist=dist, wpb=wpb)
            assign(d.x, x)
        else:
            d = pipelined([plan], None, dim, BF16, dist=dist, wpb=wpb)
            assign(d.x, self.cupy.asarray(x.view(np.uint16)))
        return d

    def cusparse(self, graph, op: str, x: np.ndarray):
        import torch

        w = torch.from_numpy(graph.weights if op == "gcn" else np.ones(graph.num_edges, np.float32))
        a_t = cusparse_matrix(graph, w)
        xt = torch.from_numpy(x).cuda()
        return lambda: a_t @ xt

    def compare(self, fns: dict, repeat: int) -> dict:
        return cuda_compare(fns, repeat=repeat)

    def profile(self, fns: dict) -> None:
        """One call of each, inside the profiled range (after one outside it)."""
        import cupyx.profiler

        for f in fns.values():
            f()
        self.cupy.cuda.Device().synchronize()
        with cupyx.profiler.profile():
            for f in fns.values():
                f()
            self.cupy.cuda.Device().synchronize()

    def host(self, out) -> np.ndarray:
        return self.cupy.asnumpy(out)

    def regs(self, plan, op: str, dim: int, bf16: bool = False):
        weighted, cls = variant(plan.norm is not None, op, dim, bf16)
        dev = self.cupy.cuda.Device().id
        mod = self.kc.load_module(dev, weighted, "p2p", cls, bf16=bf16)
        return mod.get_function("mgg_aggregate").num_regs

    def free(self) -> None:
        import torch

        self.cupy.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()


class HostSide:
    """The inner's work in the dry mode (--backend cpu): mgg's CPU aggregation over the
    same plans and rows where the GPU runs the kernel, scipy's CSR product where it runs
    cuSPARSE, a host clock; registers come from the outer's compile check."""

    def __init__(self, source: str | None):
        import numba

        self.source = source
        numba.set_num_threads(1)  # toy graphs: threads would only wait on each other

    def kernel(self, plan, dim: int, x: np.ndarray, config, bf16: bool = False):
        from mgg.kernels import aggregate

        return lambda op: aggregate(plan, x, op)

    def cusparse(self, graph, op: str, x: np.ndarray):
        import scipy.sparse as sp

        w = graph.weights if op == "gcn" else np.ones(graph.num_edges, np.float32)
        a = sp.csr_matrix((w, graph.indices, graph.indptr), shape=(graph.num_nodes,) * 2)
        return lambda: a @ x

    def compare(self, fns: dict, repeat: int) -> dict:
        from common import compare

        return compare(fns, repeat=repeat, warmup=3)

    def profile(self, fns: dict) -> None:
        for f in fns.values():
            f()

    def host(self, out) -> np.ndarray:
        return np.asarray(out)

    def regs(self, plan, op: str, dim: int, bf16: bool = False):
        return None

    def free(self) -> None:
        pass


def inner(
    path: str,
    source: str | None,
    dims: list[int],
    repeat: int,
    profile: bool,
    bf16: bool,
    backend: str = "cuda",
) -> None:
    """One source's process: print one JSON line {'D op ps=..': median ms, ...} (and
    'D op bf16 ps=..' with ``bf16``; 'D op[ bf16] variant': the kernel variant whose
    registers the row reports)."""
    from mgg.graph.core import Graph
    from mgg.graph.dataset import random_features
    from mgg.harness.check import tolerance
    from mgg.partition import build_plan
    from mgg.precision import BF16

    side = (GpuSide if backend == "cuda" else HostSide)(source)
    z = np.load(path)
    g = Graph(z["indptr"], z["indices"], check=False)
    graphs = {"sum": g, "gcn": g.gcn_norm()}
    plans = {op: build_plan(gg, 1, 16, transposed=False)[0] for op, gg in graphs.items()}
    out = {}
    for dim, op in ((d, op) for d in dims for op in OPS):
        gg, plan = graphs[op], plans[op]
        x = random_features(0, 0, gg.num_nodes, dim)
        xh = x.astype(BF16) if bf16 else None  # the rows, rounded once
        mine = {c: side.kernel(plan.with_ps(c[0]), dim, x, c) for c in CONFIGS}
        halves = {
            c: side.kernel(plan.with_ps(c[0]), dim, xh, c, True) for c in (CONFIGS if bf16 else [])
        }
        fns = {f"{dim} {op} ps={c[0]}": (lambda k=k: k(op)) for c, k in mine.items()}
        fns |= {f"{dim} {op} bf16 ps={c[0]}": (lambda k=k: k(op)) for c, k in halves.items()}
        fns[f"{dim} {op} cusparse"] = side.cusparse(gg, op, x)
        if profile:  # one call of each, inside the profiled range
            side.profile(fns)
        else:
            out.update({k: v * 1e3 for k, v in side.compare(fns, repeat).items()})
            got = side.host(mine[CONFIGS[0]](op))
            out[f"{dim} {op} max_rel_error"] = check_output(gg, x, op, got, label=op)
            out[f"{dim} {op} regs"] = side.regs(plan, op, dim)
            out[f"{dim} {op} variant"] = variant(plan.norm is not None, op, dim, False)
            if bf16:
                got = side.host(halves[CONFIGS[0]](op)).view(BF16).astype(np.float32)
                xr = xh.astype(np.float32)
                out[f"{dim} {op} bf16 max_rel_error"] = check_output(
                    gg, xr, op, got, label=f"{op} bf16", tolerance=tolerance(BF16)
                )
                out[f"{dim} {op} bf16 regs"] = side.regs(plan, op, dim, bf16=True)
                out[f"{dim} {op} bf16 variant"] = variant(plan.norm is not None, op, dim, True)
        del mine, halves, fns
        side.free()
    print(json.dumps(out), flush=True)


# ---- the dry mode's compile check ----------------------------------------------------------
def nvrtc_library() -> Path | None:
    """libnvrtc from the CUDA 13 or 12 wheel (the dev extra), or the system's; None."""
    import ctypes.util

    for module, major in (("nvidia.cu13", 13), ("nvidia.cuda_nvrtc", 12)):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec else []:
            lib = Path(folder) / "lib" / f"libnvrtc.so.{major}"
            if lib.exists():
                return lib
    found = ctypes.util.find_library("nvrtc")
    return Path(found) if found else None


def nvrtc_regs(lib: Path, source: str, options: list[str]) -> int:
    """Registers per thread of mgg_aggregate compiled by NVRTC (as CuPy compiles it) with
    ``options``; RuntimeError with the compiler's log where it fails."""
    import ctypes

    nv = ctypes.CDLL(str(lib))
    prog = ctypes.c_void_p()
    if nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [*options, f"--gpu-architecture={ARCH}", "-ftz=true", "--ptxas-options=-v"]
    argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    status = nv.nvrtcCompileProgram(prog, len(opts), argv)
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    text = log.value.decode(errors="replace")
    found = re.search(r"entry function 'mgg_aggregate'.*?Used (\d+) registers", text, re.S)
    if status or not found:
        raise RuntimeError(f"NVRTC status {status}: {text[-2000:]}")
    return int(found.group(1))


class CompileCheck:
    """The dry mode's compile check: each source's mgg_aggregate compiled by NVRTC for
    ARCH in each variant (weighted, (vec, W), bf16) a GPU run loads, on threads beside
    the inner runs (NVRTC releases the GIL); ``regs`` waits for one's registers."""

    def __init__(self, lib: Path):
        from concurrent.futures import ThreadPoolExecutor

        self.lib, self.futures, self.t0 = lib, {}, time.perf_counter()
        self.pool = ThreadPoolExecutor(max(1, min(len(os.sched_getaffinity(0)), 4)))

    def submit(self, source: str | None, variants) -> None:
        import mgg.kernels.cuda as kc

        text = Path(source or kc.SOURCE).read_text()  # a source as its text: one compile
        for v in variants:
            if (text, v) not in self.futures:
                weighted, cls, bf16 = v
                opts = list(kc.compile_options(weighted, "p2p", cls, bf16))
                self.futures[(text, v)] = self.pool.submit(nvrtc_regs, self.lib, text, opts)

    def regs(self, source: str | None, v) -> int:
        import mgg.kernels.cuda as kc

        self.submit(source, [v])
        try:
            return self.futures[(Path(source or kc.SOURCE).read_text(), v)].result()
        except RuntimeError as e:
            raise SystemExit(f"{source or kc.SOURCE}: {v} does not compile: {e}") from None

    def close(self) -> str:
        self.pool.shutdown()
        n, s = len(self.futures), time.perf_counter() - self.t0
        return f"compile check: {n} variants for {ARCH} with NVRTC, {s:.1f} s"


def variants_of(g, dims, bf16: bool) -> set:
    """The variants (weighted, (vec, W), bf16) the inner runs of ``g`` will report."""
    factored = g.gcn_norm().norm is not None
    return {
        (*variant(factored, op, d, half), half)
        for d in dims
        for op in OPS
        for half in (False, True)[: 1 + bf16]
    }
