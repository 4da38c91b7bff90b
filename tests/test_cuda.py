"""The CUDA backend: sources compile everywhere nvcc is; host logic runs without a GPU;
kernels are checked against scipy on a GPU (marked gpu, skipped without one)."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mgg.comm.nvshmem import HeapTooSmallError, check_heap, heap_bytes, heap_needed
from mgg.kernels import reference
from mgg.kernels.cuda import (
    NORMS,
    SOURCE,
    compile_options,
    exclusive_flags,
    launch_config,
    nvshmem_home,
    width_class,
)
from mgg.partition import build_plan
from mgg.precision import BF16
from mgg.tuner import known_gpu

from conftest import ROOT, assert_agg_close, gpu, held_weights, random_graph, virtual_design

NVCC = shutil.which("nvcc")


def virtual(design, plans, x, op, eps=0.0, **knobs):
    """The whole [N, D] output of a design over P virtual PEs on this GPU (numpy)."""
    import cupy

    return cupy.asnumpy(virtual_design(design, plans, x, **knobs)(op, eps))


# ---- compiles in CI --------------------------------------------------------------------
@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_training_kernels_compile_for_sm80_and_sm90(tmp_path):
    from mgg.kernels.cuda.nn_ops import SOURCE as NN

    r = subprocess.run(
        [
            NVCC,
            "-std=c++17",
            "--Werror",
            "all-warnings",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-gencode",
            "arch=compute_90,code=sm_90",
            "-c",
            str(NN),
            "-o",
            str(tmp_path / "nn.o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]


# every width class the launcher picks, for some D (and heads); the compile tests build each
CLASSES = sorted({width_class(d, h) for d in range(1, 1025) for h in (1, 2, 8) if d % h == 0})


def every_class_source(tmp_path, classes=CLASSES) -> Path:
    """aggregate.cu with every class's kernel instantiated (mgg_aggregate_class<vec, W>):
    one translation unit, so that the get mode's NVSHMEM headers compile once."""
    src = tmp_path / "every_class.cu"
    classes = " ".join(f"X({v}, {w})" for v, w in classes)
    src.write_text(f'#define MGG_EVERY_CLASS {classes}\n#include "{SOURCE}"\n')
    return src


def compiled_classes(ptxas_log: str) -> dict[str, set[tuple[int, int]]]:
    """{arch: the (vec, W) of each mgg_aggregate_class ptxas compiled} from -Xptxas -v."""
    got: dict[str, set[tuple[int, int]]] = {}
    for v, w, arch in re.findall(
        r"entry function '_Z19mgg_aggregate_classILi(\d+)ELi(\d+)E\w*' for '(sm_\d+)'",
        ptxas_log,
    ):
        got.setdefault(arch, set()).add((int(v), int(w)))
    return got


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("weighted", [1, NORMS])
def test_p2p_kernel_compiles_for_sm80_and_sm90(tmp_path, weighted):
    """Every width class's kernel, and the launcher's mgg_aggregate, for sm_80 and sm_90
    (the unweighted variant, the weighted one's code less the weights: with NVRTC 13)."""
    assert {(4, 16), (4, 128), (4, 256), (4, 0), (1, 1), (1, 64), (1, 0)} <= set(CLASSES)
    cmd = [
        NVCC,
        *compile_options(weighted, "p2p", (4, 16)),
        "--Werror",
        "all-warnings",
        "-Xptxas",
        "-v",
        "--threads",
        "2",  # one per architecture
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-c",
        str(every_class_source(tmp_path)),
        "-o",
        str(tmp_path / "k.o"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "k.o").stat().st_size > 0
    assert compiled_classes(r.stderr) == {"sm_80": set(CLASSES), "sm_90": set(CLASSES)}
    assert len(re.findall(r"entry function 'mgg_aggregate' for", r.stderr)) == 2


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_a_width_class_that_the_kernel_does_not_lay_out_fails_to_compile(tmp_path):
    for cls in ((4, 48), (4, 512), (2, 8), (1, 3)):
        r = subprocess.run(
            [NVCC, *compile_options(False, "p2p", cls), "-arch=sm_90", "--cubin"]
            + ["-o", str(tmp_path / "k.cubin"), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode != 0 and "MGG_" in r.stderr, cls


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_get_kernel_compiles_and_links_libnvshmem_device(tmp_path, weighted=1):
    """What CuPy's nvcc backend does with the get variant's options at run time: -dc,
    then a device link against libnvshmem_device into a cubin, for every width class. The
    weighted variant, which holds the unweighted one's code and more, and sm_90 only, as
    the bf16 get test (the p2p test compiles both variants for sm_80 and sm_90)."""
    home = nvshmem_home()
    if home is None:
        pytest.skip("the get mode needs NVSHMEM (nvidia-nvshmem-cu13, in the dev extra)")
    opts = list(compile_options(bool(weighted), "get", (4, 128)))
    assert "-dc" in opts and f"-I{home}/include" in opts and "-lnvshmem_device" in opts
    assert_get_module_links(tmp_path, opts, CLASSES)


def assert_get_module_links(tmp_path, opts, classes) -> None:
    """The get variant compiled with ``opts`` for sm_90, every class of ``classes`` in two
    objects compiled side by side (every other class each), each device-linked against
    libnvshmem_device into a cubin as CuPy's nvcc backend does: no warning, and the
    library's code linked in, not left unresolved."""
    arch = "arch=compute_90,code=sm_90"
    link_opts = [o for o in opts if o != "-dc"]

    def build(half: int):
        d = tmp_path / f"half{half}"
        d.mkdir()
        compiled = subprocess.run(
            [NVCC, "-gencode", arch, *opts, "--Werror", "all-warnings", "-Xptxas", "-v"]
            + ["-o", str(d / "k.o"), str(every_class_source(d, classes[half::2]))],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if compiled.returncode:
            return compiled, None, None
        linked = subprocess.run(
            [NVCC, "-gencode", arch, "--cubin", *link_opts, "--device-link", str(d / "k.o")]
            + ["-o", str(d / "k.cubin")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        return compiled, linked, d / "k.cubin"

    got = set()
    for compiled, linked, cubin in two_at_a_time(build, (0, 1)):
        assert compiled.returncode == 0, compiled.stderr[-3000:]
        got |= compiled_classes(compiled.stderr)["sm_90"]
        assert linked.returncode == 0, linked.stderr[-3000:]
        assert cubin.stat().st_size > 100_000
    assert got == set(classes)


def nvrtc_library(major: int):
    """libnvrtc of CUDA ``major`` from its pip wheel (dev extra), or None."""
    import importlib

    module = {12: "nvidia.cuda_nvrtc", 13: "nvidia.cu13"}[major]
    try:
        pkg = importlib.import_module(module)
    except ImportError:
        return None
    lib = Path(next(iter(pkg.__path__))) / "lib" / f"libnvrtc.so.{major}"
    return lib if lib.exists() else None


def nvrtc_compile(lib, source: str, options) -> tuple[int, str, int]:
    """(status, log, cubin bytes) of NVRTC compiling source, as CuPy's default backend
    does for every kernel but the get variant."""
    import ctypes

    nv = ctypes.CDLL(str(lib))
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = nv.nvrtcCompileProgram(prog, len(options), opts)
    n = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nv.nvrtcGetProgramLog(prog, log)
    size = ctypes.c_size_t(0)
    if status == 0:
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return status, log.value.decode(errors="replace"), size.value


def nvrtc_ptx(lib, source: str, options) -> str:
    """The PTX NVRTC makes of source (options naming a virtual architecture)."""
    import ctypes

    nv = ctypes.CDLL(str(lib))
    prog = ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    assert nv.nvrtcCompileProgram(prog, len(options), opts) == 0
    n = ctypes.c_size_t()
    assert nv.nvrtcGetPTXSize(prog, ctypes.byref(n)) == 0
    ptx = ctypes.create_string_buffer(n.value)
    assert nv.nvrtcGetPTX(prog, ptx) == 0
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


@pytest.mark.compile
@pytest.mark.parametrize("major", [12, 13])
def test_kernels_compile_with_the_nvrtc_of_cuda_12_and_13(major):
    """The p2p and training kernels through NVRTC 12 and 13 (the gpu and gpu-cu12
    extras), for sm_80 and sm_90 (the p2p kernel of every width class for sm_90 with
    NVRTC 13, as the launcher builds it; a sample with 12, as nvcc compiles them all); a
    broken source must fail, so the check can."""
    from mgg.kernels.cuda.nn_ops import SOURCE as NN

    lib = nvrtc_library(major)
    if lib is None:
        pytest.skip(f"NVRTC {major} not installed (the dev extra installs it on Linux x86_64)")
    assert nvrtc_compile(lib, "this is not CUDA", ["--gpu-architecture=sm_90"])[0] != 0
    jobs = []
    for arch in ("sm_80", "sm_90"):
        tail = [f"--gpu-architecture={arch}", "-ftz=true"]  # as CuPy adds
        for weighted in (0, 1):  # NORMS: the nvcc test compiles its every class
            every = arch == "sm_90" and major == 13
            for cls in CLASSES if every else [(4, 16), (4, 128), (1, 64), (1, 0)]:
                jobs.append((SOURCE, [*compile_options(weighted, "p2p", cls), *tail]))
        jobs.append((NN, ["-std=c++17", *tail]))
    got = two_at_a_time(lambda job: nvrtc_compile(lib, job[0].read_text(), job[1]), jobs)
    for (source, opts), (status, log, size) in zip(jobs, got, strict=True):
        assert status == 0 and size > 0, (source.name, opts, log)
    # the p2p variants end with dist, then heads (the weighted one's weights per edge)
    for weighted in (0, 1, NORMS):
        opts = [*compile_options(weighted, "p2p"), "--gpu-architecture=compute_90"]
        params = ptx_params(nvrtc_ptx(lib, SOURCE.read_text(), opts), "mgg_aggregate")
        assert len(params) == 21 and params[-3:] == ["u32"] * 3
    ptx = nvrtc_ptx(lib, NN.read_text(), ["-std=c++17", "--gpu-architecture=compute_90"])
    # each dropout kernel's last parameter is key_at, a pointer (a captured step's key)
    for kernel, count in (("mgg_edge_dropout", 10), ("mgg_dropout_dense", 9)):
        assert ptx_params(ptx, kernel)[-1] == "u64" and len(ptx_params(ptx, kernel)) == count
    assert len(ptx_params(ptx, "mgg_dropout_dense_bf16")) == 9
    assert len(ptx_params(ptx, "mgg_dropout_csr")) == 10
    assert len(ptx_params(ptx, "mgg_sddmm")) == 9


def ptx_params(ptx: str, kernel: str) -> list[str]:
    """The PTX types (u64, u32, f32, ...) of a kernel's parameters, in order."""
    m = re.search(rf"\.entry {kernel}\((.*?)\)", ptx, re.S)
    assert m, f"no .entry {kernel} in the PTX"
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


def two_at_a_time(fn, items) -> list:
    """[fn(item) for item in items], two at a time: nvcc and NVRTC (which releases the GIL
    through ctypes) compile on both of CI's cores."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, items))


def nvcc_ptx(tmp_path, source: Path, options) -> str:
    """The PTX nvcc makes of source (sm_90), for reading kernel signatures."""
    out = tmp_path / f"{source.stem}-{abs(hash(tuple(options))):x}.ptx"
    opts = [o for o in options if not o.startswith(("-L", "-l")) and o != "-dc"]
    r = subprocess.run(
        [NVCC, *opts, "-rdc=true", "-arch=sm_90", "-ptx", str(source), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out.read_text()


def ptx_type(arg) -> str:
    """The PTX parameter type a launcher argument lands in (arrays pass a pointer)."""
    if isinstance(arg, np.ndarray):
        return "u64"
    return {np.int64: "u64", np.uint64: "u64", np.int32: "u32", np.uint32: "u32"}.get(
        type(arg), "f32" if isinstance(arg, np.float32) else type(arg).__name__
    )


class Launches:
    """Stands in for compiled modules: records (kernel, args) of every launch."""

    def __init__(self):
        self.calls = []
        self.modules = []
        self.bf16 = []  # each module's bf16 flag

    def load_module(self, device_id, weighted, mode, cls, bf16=False):
        self.modules.append((weighted, mode, cls))
        self.bf16.append(bf16)
        return self

    def get_function(self, name):
        calls = self.calls

        class Kernel:
            def __call__(self, grid, block, args, **kw):
                calls.append((name, tuple(args)))

        return Kernel()


def _floats(a) -> np.ndarray:
    """Rows as float32: float32 as they are, uint16 bf16 bits widened exactly."""
    return (a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a


def _rows_of(flat, dim: int) -> np.ndarray:
    """A flat or 2-D array's whole rows of width ``dim``, a view [K, dim]."""
    flat = flat.reshape(-1)
    return flat[: flat.size // dim * dim].reshape(-1, dim)


class Emulated(Launches):
    """Launches that also run, in numpy, what aggregate.cu says each kernel does, reading
    the views the launcher passes as a device reads its pointers; peer_ptrs is a list of
    each PE's rows. mgg_aggregate also checks the exclusivity flags: a partition flagged
    exclusive has a node no other warp of its launch touches."""

    def get_function(self, name):
        record, body = super().get_function(name), getattr(self, name)

        class Kernel:
            def __call__(self, grid, block, args, **kw):
                record(grid, block, args, **kw)
                body(*args)

        return Kernel()

    @staticmethod
    def mgg_init(x, out, count, scale):
        flat = out.reshape(-1)
        flat[:count] = 0.0 if scale == 0 else scale * _floats(x).reshape(-1)[:count]

    def mgg_aggregate(self, x, lp, ln, lx, nl, li, lw, rp, rn, rx, nr, pe, rr, rw, slot, peers,
                      out, row0, dim, dist, *rest):  # fmt: skip
        sums, heads = _rows_of(out, dim), int(rest[-1])
        norms = self.modules[-1][0] == NORMS  # norm[u] · norm[v], no edge weights
        kinds = [
            (lp, ln, lx, nl, lw, lambda e: li[e], lambda e: _floats(x[li[e]])),
            (rp, rn, rx, nr, rw, lambda e: slot[e], lambda e: _floats(peers[pe[e]][rr[e]])),
        ]
        warps = {}
        for ptr, node, _, count, w, source, row in kinds:
            for k in range(int(count)):
                v = int(node[k] - row0)
                warps.setdefault(v, set()).add(k // int(dist))
                for e in range(int(ptr[k]), int(ptr[k + 1])):
                    if norms:
                        scale = w[source(e)] * lw[node[k]]
                    else:
                        scale = 1.0 if not isinstance(w, np.ndarray) else w[e]
                    sums[v] += np.repeat(np.atleast_1d(scale), dim // heads) * row(e)
        for _, node, excl, count, *_ in kinds:
            for k in range(int(count)):
                assert not excl[k] or len(warps[int(node[k] - row0)]) == 1, "not exclusive"

    @staticmethod
    def _degrees(lip, rip, n):
        return (lip[1 : n + 1] - lip[:n] + rip[1 : n + 1] - rip[:n])[:, None]

    def mgg_finalize_mean(self, out, lip, rip, n, dim):
        deg = self._degrees(lip, rip, int(n))
        rows = out[: int(n)]
        np.divide(rows, deg, out=rows, where=deg > 0)

    def mgg_round(self, acc, out, lip, rip, n, dim, mean):
        v = _rows_of(acc, int(dim))[: int(n)].copy()
        if mean:
            deg = self._degrees(lip, rip, int(n))
            np.divide(v, deg, out=v, where=deg > 0)
        out[: int(n)] = v.astype(BF16).view(np.uint16)


def test_gcn_weights_from_norms_give_the_held_weights_sums(rng, monkeypatch):
    """A gcn_norm graph's plans hold D^-1/2 of their rows (norm) and of their halo's
    (halo_norm), of which every edge weight is the product; a DevicePlan then holds no
    weight per edge, and the kernel's variant that computes them (emulated) gives the
    sums of the weights held, on every rank, after a restriction to some rows too. A
    weighted graph's weights do not factor: no norms."""
    import mgg.kernels.cuda as kc

    fake_cupy(monkeypatch)
    rec = Emulated()
    monkeypatch.setattr(kc, "load_module", rec.load_module)
    g0 = random_graph(rng, 300, 2000, hub_dst=True, isolated=4)
    g = g0.gcn_norm()
    deg = np.diff(g0.remove_self_loops().indptr) + 1.0  # in-degree of A + I
    plans = build_plan(g, 3, 4)
    d = 8
    x = rng.standard_normal((g.num_nodes, d)).astype(np.float32)
    peers = [x[q.lb : q.ub] for q in plans]
    h100 = known_gpu("H100")
    full = reference.aggregate(g, x, "gcn")
    kept = np.arange(0, plans[2].num_local_nodes, 3)
    for p, rows in [(q, None) for q in plans] + [(plans[2].restricted(kept), kept)]:
        np.testing.assert_allclose(p.norm, deg[p.lb : p.ub] ** -0.5, rtol=1e-6)
        np.testing.assert_allclose(p.halo_norm, deg[p.halo_nodes] ** -0.5, rtol=1e-6)
        ls, ld, rs, rd = p.global_edges()
        assert p.local_weights is p.remote_weights is None and p.has_weights
        lw, rw = p.edge_weights()
        np.testing.assert_allclose(lw, (deg[ls] * deg[ld]) ** -0.5, rtol=1e-6)
        np.testing.assert_allclose(rw, (deg[rs] * deg[rd]) ** -0.5, rtol=1e-6)
        dp = kc.DevicePlan(p, 2)
        held = kc.DevicePlan(held_weights(p), 2)
        assert dp.local_w is dp.remote_w is None and held.norm is None
        cfg = launch_config(4, 2, 4, d, p.lnp_node.size, p.rnp_node.size, h100, "p2p")
        got = []
        for dplan in (dp, held):
            out = np.zeros((p.num_local_nodes, d), np.float32)
            kc.run(dplan, peers[p.rank], peers, out, "gcn", 0.0, cfg, 0)
            got.append(out)
        assert [m[0] for m in rec.modules[-2:]] == [kc.NORMS, 1]
        want = full[p.lb : p.ub].copy()
        if rows is not None:  # the other rows keep no edge
            want[np.setdiff1d(np.arange(p.num_local_nodes), rows)] = 0
        np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-6)
    w = rng.random(g0.num_edges).astype(np.float32)
    weighted = type(g0)(g0.indptr, g0.indices, w, g0.num_nodes).gcn_norm()
    assert weighted.norm is None and build_plan(weighted, 2, 4)[0].norm is None


def fake_cupy(monkeypatch):
    """A numpy-backed stand-in for the bits of cupy the launchers touch."""
    _fake_modules(
        monkeypatch,
        cupy={
            "asarray": lambda a, dtype=None: np.asarray(a, dtype),
            "ascontiguousarray": lambda a, dtype=None: np.ascontiguousarray(a, dtype),
            "zeros": np.zeros,
            "empty": np.empty,
            "float32": np.float32,
            "int32": np.int32,
            "int64": np.int64,
        },
    )


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("mode", ["p2p", "get"])
def test_launcher_arguments_match_the_compiled_kernel_signature(rng, monkeypatch, tmp_path, mode):
    """run() builds the argument list each variant of mgg_aggregate was compiled with
    (heads last, after dist / ps), passes per-call edge weights and their heads to the
    weighted variant, null pointers to the unweighted one, picks the width class of D and
    the heads, and allocates nothing; no GPU needed (cupy and the module are stand-ins)."""
    import mgg.kernels.cuda as kc

    if mode == "get" and nvshmem_home() is None:
        pytest.skip("the get mode needs NVSHMEM (nvidia-nvshmem-cu13, in the dev extra)")
    fake_cupy(monkeypatch)
    rec = Launches()
    monkeypatch.setattr(kc, "load_module", rec.load_module)
    g = random_graph(rng, 300, 3000).gcn_norm()
    plan = build_plan(g, 3, 8)[1]
    dp = kc.DevicePlan(plan, 2)  # GCN's weights from the plan's norms
    held = kc.DevicePlan(held_weights(plan), 2)  # the weights held per edge
    d = 20
    cfg = launch_config(8, 2, 4, d, plan.lnp_node.size, plan.rnp_node.size, known_gpu("H100"), mode)
    x = np.zeros((plan.num_local_nodes, d), np.float32)
    out, peers = np.zeros_like(x), np.zeros(1, np.uint64)
    wl = rng.random((plan.num_local_edges, 4), dtype=np.float32)
    wr = rng.random((plan.num_remote_edges, 4), dtype=np.float32)
    variants = (0, 1, kc.NORMS) if mode == "p2p" else (1,)  # get: one, as the p2p case shows
    ptx = two_at_a_time(lambda w: nvcc_ptx(tmp_path, SOURCE, compile_options(w, mode)), variants)
    signatures = dict(zip(variants, (ptx_params(c, "mgg_aggregate") for c in ptx), strict=True))
    assert len(signatures[1]) == (21 if mode == "p2p" else 22)  # heads included
    assert all(s == signatures[1] for s in signatures.values())  # every variant's
    # D = 20: 5 float4 lanes, 8 a group; with 4 heads a head is 5 columns: scalar lanes
    cases = [  # (plan, op, weights, weighted module, heads, width class)
        (dp, "sum", None, 0, 1, (4, 32)),
        (dp, "gcn", None, kc.NORMS, 1, (4, 32)),
        (held, "gcn", None, 1, 1, (4, 32)),
        (dp, "sum", (wl, wr), 1, 4, (1, 32)),
        (dp, "sum", (wl[:, 0].copy(), wr[:, 0].copy()), 1, 1, (4, 32)),
    ]
    monkeypatch.setitem(sys.modules, "cupy", None)  # a launch that imports cupy fails
    for dplan, op, weights, weighted, heads, cls in cases:
        rec.calls.clear()
        kc.run(dplan, x, peers, out, op, 0.0, cfg, 0, weights=weights)
        assert rec.modules[-1] == (weighted, mode, cls)
        (args,) = [a for name, a in rec.calls if name == "mgg_aggregate"]
        assert [ptx_type(a) for a in args] == signatures[1]
        assert args[-1] == heads and type(args[-1]) is np.int32
        if weights is not None:
            assert args[6] is weights[0] and args[13] is weights[1]
        elif weighted == kc.NORMS:
            assert args[6] is dp.norm and args[13] is dp.halo_norm and args[14] is dp.remote_slot
        elif op == "gcn":
            assert args[6] is held.local_w and args[13] is held.remote_w
        else:  # no weights: null pointers
            assert args[6] == args[13] == 0 and type(args[6]) is type(args[13]) is np.uint64
        if weighted != kc.NORMS:
            assert args[14] == 0 and type(args[14]) is np.uint64
    with pytest.raises(ValueError, match="weighted sum"):
        kc.run(dp, x, peers, out, "mean", 0.0, cfg, 0, weights=(wl, wr))
    with pytest.raises(ValueError, match="do not divide"):
        kc.run(dp, x, peers, out, "sum", 0.0, cfg, 0, weights=(wl[:, :3], wr[:, :3]))


@pytest.mark.compile
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_nn_launchers_match_the_compiled_kernel_signatures(rng, monkeypatch, tmp_path):
    from mgg.kernels.cuda import nn_ops
    from mgg.kernels.cuda.nn_ops import SOURCE as NN

    fake_cupy(monkeypatch)
    calls = []
    monkeypatch.setattr(
        nn_ops, "_fn", lambda name: lambda grid, block, args: calls.append((name, args))
    )
    ptx = nvcc_ptx(tmp_path, NN, ["-std=c++17"])
    dst, src = rng.integers(0, 50, 40), rng.integers(0, 50, 40)
    assert nn_ops.edge_dropout(dst, src, 3, 50, np.uint64(7), np.uint32(1 << 30), 1.5).shape == (
        40,
        3,
    )
    indptr = np.array([0, 0, 3, 3, 5], np.int64)
    a, b = np.ones((4, 8), np.float32), np.ones((9, 8), np.float32)
    assert nn_ops.sddmm(indptr, np.array([1, 2, 3, 4, 8]), a, b, 2).shape == (5, 2)
    lp, rp = np.array([0, 1, 3], np.int64), np.array([0, 2, 2], np.int64)
    src, a_all, a_dst = np.arange(5, dtype=np.int64), np.ones((6, 2), np.float32), a[:2, :2]
    alpha = nn_ops.gat_softmax(lp, rp, src, a_all, a_dst, 0.2)
    assert alpha.shape == (5, 2)
    dscore, da_dst = nn_ops.gat_softmax_backward(lp, rp, src, a_all, a_dst, alpha, alpha, 0.2)
    assert dscore.shape == (5, 2) and da_dst.shape == (2, 2)
    assert nn_ops.segment_sum(np.array([0, 1, 2, 3, 4, 5, 5]), src, dscore, 6).shape == (6, 2)

    class Rows(np.ndarray):  # numpy rows with cupy's .data.ptr (16-byte aligned)
        data = type("Ptr", (), {"ptr": 0})()

    fake = np.zeros((6, 8), np.float32).view(Rows)
    nn_ops.gather_rows(fake, src, fake)
    launched = ["mgg_edge_dropout", "mgg_sddmm", "mgg_gat_softmax", "mgg_gat_softmax_backward"]
    assert [name for name, _ in calls] == [*launched, "mgg_segment_sum", "mgg_gather_rows4"]
    for name, args in calls:
        assert [ptx_type(x) for x in args] == ptx_params(ptx, name), name
    with pytest.raises(ValueError, match="do not divide"):
        nn_ops.sddmm(indptr, np.array([1, 2, 3, 4, 8]), a, b, 3)
    assert nn_ops.sddmm(np.zeros(3, np.int64), np.zeros(0, np.int32), a, None, 2).shape == (0, 2)
    nn_ops.gather_rows(fake, src[:0], fake)
    assert len(calls) == 6  # nothing launched for no edges or rows


# ---- host logic, no GPU needed -----------------------------------------------------------
def brute_exclusive(part_node, other_node, n, dist):
    warps = {}
    for nodes in (part_node, other_node):
        for k, v in enumerate(nodes):
            warps.setdefault(int(v), set()).add(k // dist)
    return np.array([len(warps[int(v)]) == 1 for v in part_node], np.uint8)


@pytest.mark.parametrize("dist", [1, 2, 3, 8])
def test_exclusive_flags_match_brute_force(rng, dist):
    g = random_graph(rng, 200, 1500, hub_dst=True)
    for p in build_plan(g, 3, 3):
        n = p.num_local_nodes
        got = exclusive_flags(p.lnp_node, p.rnp_node, n, dist)
        assert np.array_equal(got, brute_exclusive(p.lnp_node, p.rnp_node, n, dist))
        got = exclusive_flags(p.rnp_node, p.lnp_node, n, dist)
        assert np.array_equal(got, brute_exclusive(p.rnp_node, p.lnp_node, n, dist))


def test_launch_config_follows_the_paper_and_rejects_what_cannot_run():
    h100 = known_gpu("H100")
    cfg = launch_config(16, 4, 8, 64, n_lnp=1000, n_rnp=3000, device=h100, mode="get")
    assert cfg.warps == 750 and cfg.blocks == 94 and cfg.threads == 256
    assert cfg.smem == 16 * 8 * 4 + 2 * 16 * 8 * 64 * 4  # Listing 2
    assert launch_config(16, 4, 8, 64, 1000, 3000, h100, "p2p").smem == 0
    with pytest.raises(ValueError, match="shared memory per block"):
        launch_config(32, 1, 16, 256, 10, 10, h100, "get")
    with pytest.raises(ValueError, match="threads per block"):
        launch_config(4, 1, 64, 16, 10, 10, h100, "p2p")
    with pytest.raises(ValueError, match="remote mode"):
        compile_options(False, "carrier-pigeon")
    # ps * wpb ids rounded up to 4 ints, so that staged rows start 16-byte aligned
    assert launch_config(5, 1, 3, 64, 10, 10, h100, "get").smem == 16 * 4 + 2 * 5 * 3 * 64 * 4


def test_width_class_is_the_narrowest_layout_that_holds_d():
    """Against the definition: 16-byte lanes where D and each head's width are multiples of
    4; W the least vec * 2**k >= D with 2**k <= 64 vectors, else 0 (the generic kernel);
    and the occupancy model's lanes as aggregate.cu lays them out."""
    from mgg.kernels.cuda.occupancy import lanes_per_edge

    for d in range(1, 700):
        for heads in [h for h in (1, 2, 3, 4, 8) if d % h == 0]:
            vec, w = width_class(d, heads)
            assert vec == (4 if d % 4 == 0 and (d // heads) % 4 == 0 else 1), (d, heads)
            fits = [vec * 2**k for k in range(7) if vec * 2**k >= d]
            assert w == (fits[0] if fits else 0), (d, heads)
    dims = (1, 3, 16, 31, 32, 33, 64, 100, 128, 256, 300, 512, 600)
    assert [width_class(d) for d in dims] == [
        (1, 1), (1, 4), (4, 16), (1, 32), (4, 32), (1, 64), (4, 64), (4, 128), (4, 128),
        (4, 256), (4, 0), (4, 0), (4, 0),
    ]  # fmt: skip
    assert width_class(64, 8) == (4, 64) and width_class(16, 8) == (1, 16)
    # (edges a warp sums at once, passes over a row, vectors a lane loads of a row)
    assert lanes_per_edge(1) == (32, 1, 1) and lanes_per_edge(16) == (8, 1, 1)
    assert lanes_per_edge(64) == (2, 1, 1) and lanes_per_edge(128) == (1, 1, 1)
    assert lanes_per_edge(33) == (1, 1, 2) and lanes_per_edge(256) == (1, 1, 2)
    assert lanes_per_edge(600) == (1, 3, 2) and lanes_per_edge(601) == (1, 10, 2)
    with pytest.raises(ValueError, match="heads must divide the feature width"):
        width_class(20, 3)


def test_heap_size_parsing_and_the_too_small_error():
    assert heap_bytes({}) == 1 << 30
    assert heap_bytes({"NVSHMEM_SYMMETRIC_SIZE": "2G"}) == 2 << 30
    assert heap_bytes({"NVSHMEM_SYMMETRIC_SIZE": "512m"}) == 512 << 20
    assert heap_bytes({"NVSHMEM_SYMMETRIC_SIZE": "1048576"}) == 1 << 20
    with pytest.raises(ValueError, match="not a size"):
        heap_bytes({"NVSHMEM_SYMMETRIC_SIZE": "lots"})
    check_heap(0, 100 << 20, 1 << 30, 1000, 16)  # fits
    with pytest.raises(HeapTooSmallError, match="NVSHMEM_SYMMETRIC_SIZE=2G"):
        check_heap(900 << 20, 200 << 20, 1 << 30, 1_000_000, 50)
    assert heap_needed(1000, [16, 64]) > 2 * 1000 * 80 * 4


def _fake_modules(monkeypatch, **modules):
    import types

    for name, attrs in modules.items():
        mod = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(mod, k, v)
        monkeypatch.setitem(sys.modules, name, mod)


def test_cuda_device_imports_from_cuda_core_then_the_deprecated_path(monkeypatch):
    from mgg.comm.nvshmem import cuda_device

    class New:
        def __init__(self, i):
            self.i = i

    class Old(New):
        pass

    # cuda-core >= 0.5: Device at the top level (experimental may be gone)
    _fake_modules(monkeypatch, cuda={}, **{"cuda.core": {"Device": New}})
    monkeypatch.delitem(sys.modules, "cuda.core.experimental", raising=False)
    got = cuda_device(3)
    assert type(got) is New and got.i == 3
    # older cuda-core: only cuda.core.experimental has it
    _fake_modules(
        monkeypatch, cuda={}, **{"cuda.core": {}, "cuda.core.experimental": {"Device": Old}}
    )
    got = cuda_device(1)
    assert type(got) is Old and got.i == 1


def test_peer_addresses_survive_peers_that_nvshmem_ptr_cannot_map():
    from mgg.comm.nvshmem import peer_addresses

    class Arr:
        def __init__(self, ptr):
            self.data = type("D", (), {"ptr": ptr})()

    def get_peer(pe):
        if pe == 1:
            return None
        if pe == 2:
            raise RuntimeError("NvshmemError: peer not reachable")
        if pe == 3:
            return Arr(0)
        return Arr(0x1000 * pe)

    ptrs, why = peer_addresses(get_peer, 0xABC, rank=0, size=5)
    assert ptrs == [0xABC, 0, 0, 0, 0x4000]
    assert sorted(why) == [1, 2, 3] and "not reachable" in why[2]
    ptrs, why = peer_addresses(lambda pe: Arr(7 + pe), 0xABC, rank=1, size=3)
    assert ptrs == [7, 0xABC, 9] and why == {}


def test_register_module_checks_the_status_and_registers_once(monkeypatch):
    from mgg.comm import nvshmem as nv

    calls = []
    status = {"init": 0, "fini": 0}

    def init(ptr):
        calls.append(("init", ptr))
        return status["init"]

    def fini(ptr):
        calls.append(("fini", ptr))
        return status["fini"]

    _fake_modules(
        monkeypatch,
        nvshmem={},
        **{"nvshmem.bindings": {"cumodule_init": init, "cumodule_finalize": fini}},
    )
    sys.modules["nvshmem"].bindings = sys.modules["nvshmem.bindings"]
    monkeypatch.setattr(nv, "_MODULES", {})

    def module(ptr):
        return type("M", (), {"module": type("H", (), {"ptr": ptr})()})()

    nv.register_module(module(11))
    nv.register_module(module(11))  # cached: once per init
    assert calls == [("init", 11)]
    status["init"] = 7
    with pytest.raises(RuntimeError, match="returned 7"):
        nv.register_module(module(12))
    assert nv.release_modules() == [] and calls[-1] == ("fini", 11)
    status["init"], status["fini"] = 0, 3
    nv.register_module(module(11))  # a fresh init registers again
    assert calls[-1] == ("init", 11)
    assert "returned 3" in nv.release_modules()[0]


# ---- on a GPU ------------------------------------------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("nprocs", [1, 3])
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_kernel_equals_scipy(rng, nprocs, op):
    """Every width class and its edges (D = 1 .. 600: group lanes, float4 and scalar lanes,
    one and two vectors a lane, the generic kernel's slabs) and partition shapes."""
    dims = (1, 2, 3, 4, 5, 8, 9, 16, 31, 32, 33, 64, 100, 128, 130, 256, 300, 512, 600)
    assert {width_class(d) for d in dims} == set(CLASSES)
    for kind in range(4):  # plain, hub source, hub destination, empty ranks
        n = 9 if kind == 3 else 3000
        g = random_graph(rng, n, 30 * n, hub_src=kind == 1, hub_dst=kind == 2)
        if op == "gcn":
            g = g.gcn_norm()
        for ps, dist, wpb in ((16, 4, 4), (1, 1, 1), (32, 16, 8), (5, 3, 2)):
            plans = build_plan(g, nprocs if kind != 3 else 12, ps)
            for dim in dims:
                x = rng.standard_normal((n, dim)).astype(np.float32)
                out = virtual("pipelined", plans, x, op, eps=0.25, dist=dist, wpb=wpb)
                want = reference.aggregate(g, x, op, eps=0.25)
                assert_agg_close(out, want, g, x)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="no compute-sanitizer")
def test_memcheck_is_clean(tmp_path):
    script = tmp_path / "small.py"
    script.write_text(
        textwrap.dedent("""
        import cupy, numpy as np
        from mgg.backend import assign
        from mgg.designs import get_design
        from mgg.graph.generators import rmat
        from mgg.partition import build_plan
        g = rmat(8, 8).gcn_norm()
        for dim in (3, 20, 33, 256, 600):  # width classes: groups, one row, generic slabs
            x = np.random.default_rng(0).standard_normal((g.num_nodes, dim)).astype(np.float32)
            d = get_design("virtual", "pipelined")(build_plan(g, 3, 7), None, dim, dist=3, wpb=2)
            assign(d.x, x)
            for op in ("sum", "gcn", "gin", "mean"):
                d(op)
        cupy.cuda.Device().synchronize()
        print("done")
    """)
    )
    memcheck(script, timeout=80)


def memcheck(script, timeout: float) -> None:
    """Run the Python ``script`` under compute-sanitizer's memcheck: it must print "done"
    and report no error."""
    r = subprocess.run(
        ["compute-sanitizer", "--tool", "memcheck", "--report-api-errors", "no"]
        + ["--error-exitcode", "9", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        ),
    )
    assert r.returncode == 0 and "done" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in r.stdout + r.stderr


@gpu
@pytest.mark.gpu
def test_gpu_dropout_draws_the_cpu_masks(rng):
    import scipy.sparse as sp
    import torch

    import mgg.torch as mt
    from mgg.arrays import to_host
    from mgg.backend import get_backend
    from mgg.distgraph import DistGraph
    from mgg.graph.generators import rmat

    g = rmat(9, 4)
    gs = {b: DistGraph.build(g, None, backend=b) for b in ("cpu", "cuda")}
    x = torch.from_numpy(rng.standard_normal((g.num_nodes, 37)).astype(np.float32))
    xs = sp.random(g.num_nodes, 37, density=0.3, format="csr", random_state=0, dtype=np.float32)
    out = {}
    for b, dg in gs.items():
        dg.begin_step(7)
        dense = mt.dropout(x.to("cuda" if b == "cuda" else "cpu"), dg, 0.4)
        m = get_backend(b).to_device(xs)
        sparse = mt.dropout(mt.SparseRows(m), dg, 0.4).m
        alpha = mt.edge_dropout(
            torch.ones(dg.plan.num_local_edges, 3, device=dense.device), dg, 0.3
        )
        out[b] = (
            dense.cpu().numpy(),
            to_host(sparse).toarray(),
            alpha.cpu().numpy(),
        )
    for a, b in zip(out["cpu"], out["cuda"], strict=True):
        np.testing.assert_array_equal(a != 0, b != 0)
        np.testing.assert_allclose(a, b, rtol=1e-6)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gcn", "sage", "gin", "gat"])
def test_gpu_training_follows_the_cpu_loss_curve(model):
    import mgg.torch as mt
    from mgg.graph.generators import planted_partition
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.train import Trainer

    ds = planted_partition(3000, 4, avg_degree=8, num_features=24, seed=0)
    losses = {}
    for backend in ("cpu", "cuda"):
        dg, data = prepare(ds, None, model, backend=backend)
        m = mt.build_model(model, data.num_features, data.num_classes).to(data.y.device)
        t = Trainer(dg, data, m, build_optimizer("adam", m, 0.01, 5e-4), eval_every=0)
        losses[backend] = [h["loss"] for h in t.fit(30)]
        final = t.evaluate()
    np.testing.assert_allclose(losses["cpu"], losses["cuda"], atol=2e-3)
    assert 0 <= final["test_acc"] <= 1


# CUDA calls that make the host wait for the device (CuPy's too, which torch's sync debug
# mode does not see): synchronizations, blocking copies, frees
BLOCKING = re.compile(
    r"^cu(da)?(Stream|Device|Ctx|Event)Synchronize|^cu(da)?Memcpy(?!.*Async)|^cu(da)?(Mem)?Free"
    r"(_v2)?$"
)


def blocking_calls(prof, region: str) -> tuple[list[str], int]:
    """(the blocking CUDA calls, the kernel launches) the profiler recorded inside the
    record_function ``region``."""
    from torch.autograd import DeviceType

    events = prof.events()
    (span,) = [e.time_range for e in events if e.name == region and e.device_type == DeviceType.CPU]
    inside = [
        e.name
        for e in events
        if e.device_type == DeviceType.CPU
        and span.start <= e.time_range.start
        and e.time_range.end <= span.end
    ]
    return [n for n in inside if BLOCKING.match(n)], sum("LaunchKernel" in n for n in inside)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gcn", "sage", "gin", "gat"])
def test_a_training_step_never_waits_for_the_gpu(model):
    """After warm-up, training steps of each registered model on one GPU make no
    synchronizing torch call (torch's sync debug mode raises on one) and no blocking CUDA
    call at all (the profiler's record of the runtime and driver calls, CuPy's included),
    and the losses read afterwards equal those of the same run unwatched."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import mgg.torch as mt
    from mgg.graph.generators import planted_partition
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.train import Trainer

    assert model in mt.MODELS
    ds = planted_partition(3000, 4, avg_degree=8, num_features=24, seed=0)
    losses = {}
    for watched in (False, True):
        dg, data = prepare(ds, None, model, backend="cuda")
        m = mt.build_model(model, data.num_features, data.num_classes).to(data.y.device)
        t = Trainer(dg, data, m, build_optimizer("adam", m, 0.01, 5e-4), eval_every=0)
        warm = [t.train_step() for _ in range(2)]  # compile, upload, allocate (both buffers)
        t.read_losses()
        if not watched:
            steps = [t.train_step() for _ in range(4)]
        else:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                torch.cuda.set_sync_debug_mode("error")
                try:
                    with record_function("steps"):
                        steps = [t.train_step() for _ in range(4)]
                finally:
                    torch.cuda.set_sync_debug_mode(0)
        t.read_losses()
        losses[watched] = [s["loss"] for s in warm + steps]
        assert all(s["seconds"] > 0 for s in steps)
        dg.free()
    waits, launches = blocking_calls(prof, "steps")
    assert launches > 0, "the profiler recorded no kernel launch: the check would be void"
    assert waits == [], waits
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-4, atol=1e-6)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gcn", "sage", "gin", "gat"])
def test_a_captured_step_trains_as_the_eager_step_does(model):
    """--cuda-graph: after WARMUP eager steps the step is captured once and replayed. Every
    step's loss and the weights' updates equal those of eager steps from the same start
    (dropout masks read from the key slots, GIN's batch statistics, Adam's state), and a
    replayed step makes no synchronizing torch call.

    Equal up to rounding: the kernels' atomic sums round in any order, and Adam and GIN's
    batch norm amplify it (bench/captured_tolerance.py, on the CPU: noise of 2**-16 on
    every kernel's output moved the loss by at most 3.5e-5 and each tensor's update, final
    minus initial weights, by at most 4.1e-3 of its norm in these 9 steps; a replay that
    kept drawing one step's masks moved them by 2.7e-2 to 0.44 and 0.17 to 0.63)."""
    import torch

    import mgg.torch as mt
    from mgg.graph.generators import planted_partition
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.torch.graphs import WARMUP
    from mgg.train import Trainer

    ds = planted_partition(3000, 4, avg_degree=8, num_features=24, seed=0)
    runs = {}
    for captured in (False, True):
        torch.manual_seed(0)
        dg, data = prepare(ds, None, model, backend="cuda")
        m = mt.build_model(model, data.num_features, data.num_classes).to(data.y.device)
        w0 = [p.detach().cpu() for p in m.parameters()]
        opt = build_optimizer("adam", m, 0.01, 5e-4)
        t = Trainer(dg, data, m, opt, eval_every=0, cuda_graph=captured)
        steps = [t.train_step() for _ in range(WARMUP + 1)]  # the last one captures
        torch.cuda.set_sync_debug_mode("error")
        try:
            steps += [t.train_step() for _ in range(5)]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        t.read_losses()
        assert (t._captured is not None and t._captured.graph is not None) == captured
        updates = [p.detach().cpu() - w for p, w in zip(m.parameters(), w0, strict=True)]
        runs[captured] = ([s["loss"] for s in steps], updates)
        dg.free()
    (got, got_w), (want, want_w) = runs[True], runs[False]
    assert len(set(want)) == len(want)  # it trains: every step's loss differs
    np.testing.assert_allclose(got, want, rtol=1e-3)
    moved = [
        float((a - b).norm() / b.norm().clamp_min(1e-12))
        for a, b in zip(got_w, want_w, strict=True)
    ]
    assert max(moved) < 2e-2, moved


@gpu
@pytest.mark.gpu
def test_gin_eps_on_the_gpu_is_never_read_and_its_gradient_equals_scipy(rng):
    """GIN's eps on the GPU stays there (the kernel sums x + A x, eps x is added after it):
    no synchronizing torch call, and (1 + eps) x + A x, its x gradient and its eps gradient
    equal scipy's."""
    import torch

    import mgg.torch as mt
    from mgg.distgraph import DistGraph
    from mgg.torch.aggregation import _Aggregate

    g = random_graph(rng, 500, 4000, hub_dst=True).remove_self_loops()
    dg = DistGraph.build(g, None, backend="cuda", ps=4)
    xn = rng.standard_normal((500, 16)).astype(np.float32)
    wn = rng.standard_normal((500, 16)).astype(np.float32)
    x = torch.from_numpy(xn).cuda().requires_grad_()
    eps = torch.tensor([0.3], device="cuda", requires_grad=True)
    w = torch.from_numpy(wn).cuda()
    assert _Aggregate.eps_stays(eps, x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = mt.aggregate(x, dg, "gin", eps=eps)
        (y * w).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    a = g.to_scipy().astype(np.float64)
    x64, w64 = xn.astype(np.float64), wn.astype(np.float64)
    e = np.float32(0.3).astype(np.float64)
    assert_agg_close(y.detach().cpu().numpy(), (1 + e) * x64 + a @ x64, g, xn)
    dx = x.grad.cpu().numpy()
    np.testing.assert_allclose(dx, (1 + e) * w64 + a.T @ w64, rtol=1e-4, atol=1e-4)
    assert abs(eps.grad.item() - (x64 * w64).sum()) <= 1e-5 * np.abs(x64 * w64).sum()


@gpu
@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,mode", [(2, "p2p"), (4, "p2p"), (2, "get")])
def test_nvshmem_pes_sharing_the_gpu_equal_scipy(nprocs, mode, tmp_path):
    """Real PEs (one process each) through the given remote path; every rank's output is
    gathered to a file and compared here with scipy."""
    pytest.importorskip("nvshmem.core")
    from mgg.graph.dataset import random_features
    from mgg.graph.generators import rmat

    got = nvshmem_outputs(tmp_path, nprocs, mode, (5, 24, 300))  # groups, float4, generic
    g = rmat(11, 8, seed=1).gcn_norm()
    for dim in (5, 24, 300):
        x = random_features(5, 0, g.num_nodes, dim)
        for op in ("sum", "mean", "gcn", "gin"):
            assert_agg_close(got[f"{op}{dim}"], reference.aggregate(g, x, op, eps=0.3), g, x)


def nvshmem_outputs(tmp_path, nprocs: int, mode: str, dims, dtype: str = "float32"):
    """Real PEs (one process each) through remote path ``mode``: CudaPipelined over
    rmat(11, 8)'s gcn_norm at each width of ``dims``, every op (gin's eps 0.3), rows
    random_features(5) in ``dtype`` (bfloat16: held as uint16 words); returns {f"{op}{dim}":
    the output gathered from every rank} (bf16 as its words)."""
    from conftest import mpirun

    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(f"""
        import numpy as np, cupy
        from mgg.comm import finalize, get_comm
        from mgg.designs.cuda import CudaPipelined
        from mgg.graph.dataset import random_features
        from mgg.graph.generators import rmat
        from mgg.partition import build_plan
        from mgg.precision import row_dtype, storage
        comm = get_comm("nvshmem")
        dtype = row_dtype("{dtype}")
        g = rmat(11, 8, seed=1).gcn_norm()
        plan = build_plan(g, comm.size, 8, rank=comm.rank, transposed=False)
        outs = {{}}
        for dim in {tuple(dims)}:
            rows = random_features(5, plan.lb, plan.ub, dim).astype(dtype).view(storage(dtype))
            for op in ("sum", "mean", "gcn", "gin"):
                d = CudaPipelined(plan, comm, dim, dtype, dist=3, wpb=2, remote="{mode}")
                assert d.x.dtype == storage(dtype), d.x.dtype
                d.x[:] = cupy.asarray(rows)
                got = cupy.asnumpy(d(op, eps=0.3))
                assert got.dtype == storage(dtype), got.dtype
                assert d.remote_path["mode"] == "{mode}", d.remote_path
                parts = comm.gather(got, root=0)
                if comm.rank == 0:
                    outs[f"{{op}}{{dim}}"] = np.concatenate(parts)
                d.free()
        if comm.rank == 0:
            np.savez(r"{tmp_path / "out.npz"}", size=comm.size, **outs)
        finalize()
    """)
    )
    r = mpirun(nprocs, "python", job, timeout=240)  # the get mode compiles 6 modules
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    assert int(got["size"]) == nprocs  # not a run of singletons
    return got


@gpu
@pytest.mark.gpu
@pytest.mark.mpi
def test_mgg_check_with_nvshmem_reports_the_size_and_the_remote_path():
    pytest.importorskip("nvshmem.core")
    from conftest import last_json, mpirun

    r = mpirun(
        2,
        "mgg",
        "check",
        "rmat:scale=10,ef=8",
        "--backend",
        "cuda",
        "--remote",
        "get",
        "--op",
        "sum",
        "--dim",
        "16",
        "--repeat",
        "1",
        "--json",
        timeout=90,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = last_json(r.stdout)
    assert res["np"] == 2
    pipelined = [run for run in res["runs"] if run["design"] == "pipelined"]
    assert pipelined and all(run["remote_path"]["mode"] == "get" for run in pipelined)


@gpu
@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gat", "gcn"])
def test_gpu_training_on_two_pes_follows_one_cpu_rank(model):
    """mgg train on 2 NVSHMEM PEs (halo rows, edge weights moved to the transposed plan,
    SDDMM over remote sources, gradients summed over MPI) follows a 1-rank CPU run."""
    pytest.importorskip("nvshmem.core")
    from conftest import last_json, mpirun

    args = ["mgg", "train", "--dataset", "planted:nodes=3000,classes=4", "--model", model]
    args += ["--epochs", "12", "--json"]
    runs = {}
    for np_, backend in ((1, "cpu"), (2, "cuda")):
        r = mpirun(np_, *args, "--backend", backend, timeout=150)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[backend] = last_json(r.stdout)
    assert runs["cuda"]["np"] == 2  # not a run of singletons
    want = [h["loss"] for h in runs["cpu"]["history"]]
    got = [h["loss"] for h in runs["cuda"]["history"]]
    assert len(got) == len(want) == 12
    np.testing.assert_allclose(got, want, atol=2e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("design", ["pipelined", "direct", "dgcl", "uvm", "no_interleave"])
@pytest.mark.parametrize("op", ["sum", "gcn", "gin", "mean"])
def test_gpu_designs_equal_scipy(rng, design, op):
    g = random_graph(rng, 2000, 40_000, hub_dst=True)
    if op == "gcn":
        g = g.gcn_norm()
    x = rng.standard_normal((2000, 24)).astype(np.float32)
    for nprocs in (1, 3, 8):
        out = virtual(design, build_plan(g, nprocs, 16), x, op, eps=0.5)
        assert_agg_close(out, reference.aggregate(g, x, op, eps=0.5), g, x)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_cuda_backend_of_the_aggregate_entry_point(rng, op):
    import cupy

    from mgg.kernels import aggregate, gather_halo

    g = random_graph(rng, 1500, 20_000, hub_src=True)
    if op == "gcn":
        g = g.gcn_norm()
    x = rng.standard_normal((1500, 40)).astype(np.float32)
    for p in build_plan(g, 3, 8):
        want = aggregate(p, x[p.lb : p.ub], op, halo=gather_halo(p, x), eps=0.3)
        got = aggregate(p, x[p.lb : p.ub], op, halo=gather_halo(p, x), eps=0.3, backend="cuda")
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-4)


@gpu
@pytest.mark.gpu
def test_cuda_aggregate_with_per_call_multi_head_edge_weights(rng):
    """Per-call edge weights, 1 to 32 heads (column j takes w[e, j // C]) at widths of
    every class, on 1 and 3 PEs, through the mgg.kernels entry point and aggregate_halo's
    launch knobs, against the CPU kernel."""
    import cupy

    from mgg.kernels import aggregate, gather_halo
    from mgg.kernels.cuda import aggregate_halo

    g = random_graph(rng, 1500, 20_000, hub_src=True, isolated=20)
    cases = {  # D: heads (None: one weight per edge, [E]), over every class's lane layout
        1: (None, 1),
        2: (None,),
        3: (None, 3),
        4: (None, 1, 4),
        8: (None, 4),
        16: (None, 2, 8),  # float4 lanes with 2 heads; scalar with 8 (2 columns a head)
        20: (1, 4),
        31: (1,),
        33: (None, 3),
        64: (None, 8),  # GAT's 8 heads of 8
        100: (1, 5),
        128: (None, 4, 32),
        136: (4,),
        256: (2,),
        300: (3,),
        512: (8,),
        600: (None, 4),
    }
    assert {width_class(d, h or 1) for d, hs in cases.items() for h in hs} == set(CLASSES)
    for dim, head_counts in cases.items():
        x = rng.standard_normal((1500, dim)).astype(np.float32)
        for p in build_plan(g, 1, 8) + build_plan(g, 3, 8):
            xs, halo = x[p.lb : p.ub], gather_halo(p, x)
            for heads in head_counts:
                tail = () if heads is None else (heads,)
                wl = rng.standard_normal((p.num_local_edges, *tail)).astype(np.float32)
                wr = rng.standard_normal((p.num_remote_edges, *tail)).astype(np.float32)
                want = aggregate(p, xs, "sum", halo=halo, weights=(wl, wr))
                got = aggregate(p, xs, "sum", halo=halo, backend="cuda", weights=(wl, wr))
                np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-4)
                for dist, wpb in ((1, 1), (3, 2), (16, 8)):
                    got = aggregate_halo(
                        p,
                        cupy.asarray(xs),
                        halo,
                        "sum",
                        dist=dist,
                        wpb=wpb,
                        weights=(cupy.asarray(wl), cupy.asarray(wr)),
                    )
                    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-4)
    p = build_plan(g, 3, 8)[0]
    x = rng.standard_normal((1500, 20)).astype(np.float32)
    wl, wr = np.ones((p.num_local_edges, 3), np.float32), np.ones((p.num_remote_edges, 3))
    with pytest.raises(ValueError, match="do not divide"):
        aggregate_halo(p, x[p.lb : p.ub], gather_halo(p, x), "sum", weights=(wl, wr))


@gpu
@pytest.mark.gpu
def test_cuda_design_takes_per_call_edge_weights(rng):
    """CudaPipelined on one PE: d("sum", weights=...) weights every edge per head."""
    import cupy

    from mgg.backend import assign
    from mgg.designs.cuda import CudaPipelined
    from mgg.kernels import aggregate

    g = random_graph(rng, 800, 9000, hub_dst=True)
    x = rng.standard_normal((800, 32)).astype(np.float32)
    (p,) = build_plan(g, 1, 8)
    d = CudaPipelined(p, None, 32, dist=3, wpb=2)
    assign(d.x, x)
    for heads in (1, 4):
        wl = rng.standard_normal((p.num_local_edges, heads)).astype(np.float32)
        wr = np.zeros((0, heads), np.float32)
        want = aggregate(p, x, "sum", weights=(wl, wr))
        got = d("sum", weights=(cupy.asarray(wl), cupy.asarray(wr)))
        np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-4)
        assert d.edge_weights is None  # only for the call
    plain = cupy.asnumpy(d("sum"))  # and the unweighted sum is back
    np.testing.assert_allclose(plain, aggregate(p, x, "sum"), rtol=1e-4, atol=1e-4)


def test_one_pe_alone_reads_its_input_in_place_and_makes_a_buffer_only_when_asked(rng, monkeypatch):
    """CudaPipelined without NVSHMEM (one PE): a call given its rows (a C-contiguous array
    of the rows' storage and width) launches on them, and no input buffer is made; ``x``
    makes one when asked (a caller writing into it), a restricted design shares it; other
    rows are refused. No GPU needed (cupy and the launch are stand-ins)."""
    import mgg.designs.cuda as dc
    import mgg.kernels.cuda as kc

    fake_cupy(monkeypatch)
    monkeypatch.setattr(sys.modules["cupy"], "ndarray", np.ndarray, raising=False)
    monkeypatch.setattr(sys.modules["cupy"], "uint64", np.uint64, raising=False)
    monkeypatch.setattr(kc, "_SUMS", {})
    monkeypatch.setattr(dc, "current_device", lambda: (0, known_gpu("H100")))
    launched = []
    monkeypatch.setattr(dc, "run", lambda dplan, x, *rest, **kw: launched.append(x))
    (p,) = build_plan(random_graph(rng, 300, 3000), 1, 8)
    d = dc.CudaPipelined(p, None, 16, dist=2, wpb=2)
    x = rng.standard_normal((300, 16)).astype(np.float32)
    d("sum", x=x)
    assert launched[-1] is x and d._own is None
    for other in (x[:, :8].copy(), np.asfortranarray(x), x.astype(np.float64), x[:100].copy()):
        assert not d.reads_in_place(other)
        with pytest.raises(ValueError, match="reads its input rows from its buffer"):
            d("sum", x=other)
    d.x[:] = x  # a caller that writes into the buffer: made now
    d("sum")
    assert launched[-1] is d.x and d._own is not None and d.x.shape == (300, 16)
    assert dc.CudaPipelined(p, None, 16, share=d).x.base is d._own
    d.free()
    assert d.x is None


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 4])
def test_gpu_sddmm_and_edge_dropout_equal_the_cpu_kernels(rng, heads):
    import cupy

    from mgg.kernels import cpu_nn
    from mgg.kernels.cuda import nn_ops

    g = random_graph(rng, 700, 6000, hub_dst=True, isolated=30)  # empty rows too
    c = 6
    a = rng.standard_normal((700, heads * c)).astype(np.float32)
    b = rng.standard_normal((900, heads * c)).astype(np.float32)
    indices = rng.integers(0, 900, g.num_edges).astype(np.int32)
    want = cpu_nn.sddmm(g.indptr, indices, a, b, heads)
    got = nn_ops.sddmm(cupy.asarray(g.indptr), cupy.asarray(indices), cupy.asarray(a), b, heads)
    assert got.shape == (g.num_edges, heads)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-5)

    dst = rng.integers(0, 5000, 20_000)
    src = rng.integers(0, 5000, 20_000)
    for p in (0.1, 0.5, 0.9):
        threshold = np.uint32(p * 2.0**32)
        key, scale = np.uint64(rng.integers(0, 2**63)), 1.0 / (1.0 - p)
        want = cpu_nn.edge_dropout(dst, src, heads, 5000, key, threshold, scale)
        got = nn_ops.edge_dropout(cupy.asarray(dst), src, heads, 5000, key, threshold, scale)
        np.testing.assert_array_equal(cupy.asnumpy(got), want)
        assert abs((want == 0).mean() - p) < 0.02


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 3, 8])
def test_gpu_gat_softmax_and_its_backward_equal_the_cpu_kernels(rng, heads):
    """The attention kernels on a graph with hubs (warps whose lanes walk many edges) and
    empty rows, local and remote edges, against the numba twins."""
    import cupy

    from mgg.kernels import cpu_nn
    from mgg.kernels.cuda import nn_ops

    n, slots = 900, 1300
    loc = random_graph(rng, n, 9000, hub_dst=True, isolated=40)
    rem = random_graph(rng, n, 3000, hub_dst=True, isolated=100)
    lp, rp = loc.indptr.astype(np.int64), rem.indptr.astype(np.int64)
    src = np.concatenate([loc.indices, n + rng.integers(0, slots - n, rem.num_edges)])
    src = src.astype(np.int64)
    a_all = (3 * rng.standard_normal((slots, heads))).astype(np.float32)
    a_dst = (3 * rng.standard_normal((n, heads))).astype(np.float32)
    dalpha = rng.standard_normal((src.size, heads)).astype(np.float32)
    up = cupy.asarray
    want = cpu_nn.gat_softmax(lp, rp, src, a_all, a_dst, 0.2)
    got = nn_ops.gat_softmax(up(lp), up(rp), up(src), up(a_all), up(a_dst), 0.2)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-5, atol=1e-7)
    ws, wd = cpu_nn.gat_softmax_backward(lp, rp, src, a_all, a_dst, want, dalpha, 0.2)
    gs, gd = nn_ops.gat_softmax_backward(
        up(lp), up(rp), up(src), up(a_all), up(a_dst), got, up(dalpha), 0.2
    )
    np.testing.assert_allclose(cupy.asnumpy(gs), ws, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cupy.asnumpy(gd), wd, rtol=1e-4, atol=1e-5)
    ptr = np.zeros(slots + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=slots), out=ptr[1:])
    perm = np.argsort(src, kind="stable")
    want = cpu_nn.segment_sum(ptr, perm, ws, slots)
    got = nn_ops.segment_sum(up(ptr), up(perm), gs, slots)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-5)


def test_the_remote_mode_is_checked_before_any_gpu_work(rng, capsys):
    from mgg.cli import main
    from mgg.designs.cuda import CudaPipelined

    plan = build_plan(random_graph(rng, 50, 200), 1, 4)[0]
    with pytest.raises(ValueError, match="reads through NVSHMEM"):
        CudaPipelined(plan, None, 8, remote="get")
    with pytest.raises(ValueError, match="remote: must be one of p2p, get"):
        CudaPipelined(plan, None, 8, remote="teleport")
    assert main(["check", "rmat:scale=6,ef=4", "--remote", "get"]) == 2
    assert "--remote is not a knob of" in capsys.readouterr().err
