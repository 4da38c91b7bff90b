"""bfloat16 rows on the GPU (issue 52): the bf16 variants of aggregate.cu and nn.cu compile
everywhere nvcc is; the host logic (width classes, launch arguments, the compute
capability check) runs without a GPU; the kernels and every design are checked on a GPU
(marked gpu) against float64 oracles of the bf16-rounded inputs, within one bf16 rounding
of the output."""

import dataclasses
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_cuda import (
    NVCC,
    Emulated,
    Launches,
    assert_get_module_links,
    compiled_classes,
    every_class_source,
    fake_cupy,
    memcheck,
    nvcc_ptx,
    nvrtc_compile,
    nvrtc_library,
    nvrtc_ptx,
    nvshmem_outputs,
    ptx_params,
    ptx_type,
    two_at_a_time,
)

from mgg.errors import InputError
from mgg.graph import Graph
from mgg.kernels import reference
from mgg.kernels.cuda import (
    NORMS,
    SOURCE,
    compile_options,
    launch_config,
    nvshmem_home,
    row_storage,
    width_class,
)
from mgg.kernels.cuda.occupancy import Device, lanes_per_edge, smem_bytes
from mgg.partition import build_plan
from mgg.precision import BF16, BF16_MAX
from mgg.tuner import known_gpu

from conftest import gpu, held_weights, random_graph, virtual_design

# every bf16 width class the launcher picks, for some D and heads
BF16_CLASSES = sorted(
    {width_class(d, h, 2) for d in range(1, 1025) for h in (1, 2, 8) if d % h == 0}
)
# a sample of them for NVRTC (nvcc compiles them all): per vector width, groups of lanes,
# one and two vectors a lane, the generic kernel
NVRTC_CLASSES = [
    c
    for c in BF16_CLASSES
    if c in {(8, 16), (8, 256), (8, 512), (8, 0), (2, 2), (2, 64)}
    or c in {(2, 128), (2, 0), (1, 1), (1, 64), (1, 0)}
]
# D (one head) reaching every bf16 class but (1, 2) (D = 2 with 2 heads): 1-, 2- and 8-element
# lanes, groups, one and two vectors a lane, the generic kernel
DIMS = (1, 2, 3, 4, 5, 6, 8, 9, 10, 16, 17, 18, 24, 33, 34, 64, 65, 66, 128, 130, 136, 264, 520)
# the weighted test's D: heads (None: one weight per edge, [E]), reaching every bf16 class
WEIGHTED_CASES = {
    1: (None,),
    2: (None, 2),
    3: (3,),
    4: (None, 2),
    6: (None, 3),
    8: (None, 8),
    9: (3,),
    16: (None, 2, 8),
    18: (None, 2),
    24: (3,),
    34: (2,),
    36: (None,),
    64: (None, 8),  # GAT's 8 heads of 8: 8-element lanes
    65: (None,),
    100: (4,),
    128: (None, 4, 32),
    136: (1,),
    264: (None, 8),
    300: (3,),
    520: (None,),
}
V100 = Device("Tesla V100-SXM2-16GB", 80, 96 * 1024, 96 * 1024, cc=(7, 0))
nvcc_only = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def bf16_bits(x) -> np.ndarray:
    """x rounded to bf16 (to nearest even), as the uint16 bits the GPU holds."""
    return np.asarray(x, np.float32).astype(BF16).view(np.uint16)


def widen(bits) -> np.ndarray:
    """uint16 bf16 bits (numpy or cupy) -> float64."""
    if not isinstance(bits, np.ndarray):
        import cupy

        bits = cupy.asnumpy(bits)
    return bits.view(BF16).astype(np.float64)


def assert_bf16_close(out_bits, ref, mag):
    """out within one bf16 rounding of the float64 oracle ref: |out - ref| <= 2**-8 |ref|
    (half a bf16 step) plus float32's summation error, 1e-5 of mag (the sum of the
    magnitudes of the terms) + 1."""
    out = widen(out_bits)
    assert out.shape == ref.shape
    np.testing.assert_array_less(np.abs(out - ref), 2.0**-8 * np.abs(ref) + 1e-5 * (mag + 1.0))


def magnitude(graph, x, op, eps=0.0):
    """The sum of the magnitudes of what each output sums: |A| |x| + (1 + |eps|) |x|
    (A with each duplicate edge on its own, |weights| for gcn)."""
    import scipy.sparse as sp

    w = np.abs(graph.weights) if op == "gcn" else np.ones(graph.num_edges)
    a = sp.csr_matrix((w.astype(np.float64), graph.indices, graph.indptr), (graph.num_nodes,) * 2)
    ax = np.abs(x.astype(np.float64))
    return a @ ax + (1 + abs(eps)) * ax


def bf16_oracle(graph, x, op, eps=0.0):
    """(oracle, magnitude) in float64 from the bf16-rounded rows of x [N, D]."""
    xb = widen(bf16_bits(x))
    return reference.aggregate(graph, xb, op, eps=eps), magnitude(graph, xb, op, eps)


# ---- compiles in CI --------------------------------------------------------------------
@pytest.mark.compile
@nvcc_only
@pytest.mark.parametrize("weighted", [0, 1, NORMS])
def test_bf16_p2p_kernel_compiles_for_sm80_and_sm90(tmp_path, weighted):
    """Every bf16 width class's kernel, mgg_aggregate and mgg_round, for sm_80 and sm_90,
    without spilling a register (1024 threads a block: at most 64 each)."""
    assert {(8, 16), (8, 128), (8, 512), (8, 0), (2, 2), (2, 0), (1, 1), (1, 0)} <= set(
        BF16_CLASSES
    )
    cmd = [
        NVCC,
        *compile_options(weighted, "p2p", (8, 128), bf16=True),
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
        str(every_class_source(tmp_path, BF16_CLASSES)),
        "-o",
        str(tmp_path / "k.o"),
    ]
    assert "-DMGG_BF16=1" in cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    classes = set(BF16_CLASSES)
    assert compiled_classes(r.stderr) == {"sm_80": classes, "sm_90": classes}
    for kernel in ("mgg_aggregate", "mgg_round", "mgg_init"):
        assert len(re.findall(rf"entry function '{kernel}' for", r.stderr)) == 2, kernel
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and set(spills) == {"0"}


@pytest.mark.compile
@nvcc_only
def test_bf16_get_kernel_compiles_and_links_libnvshmem_device(tmp_path, weighted=1):
    """The get variant in bf16 (nvshmemx_getmem_nbi_warp of 2-byte rows into shared
    memory): every class for sm_90, device-linked against libnvshmem_device as CuPy's
    nvcc backend does. Weighted and sm_90 only (40 s of make test saved): the
    unweighted variant differs in the weight load alone and sm_80 in nothing of the get
    path, and the p2p test compiles both, for both."""
    home = nvshmem_home()
    if home is None:
        pytest.skip("the get mode needs NVSHMEM (nvidia-nvshmem-cu13, in the dev extra)")
    opts = list(compile_options(bool(weighted), "get", (8, 128), bf16=True))
    assert "-DMGG_BF16=1" in opts and "-dc" in opts
    assert_get_module_links(tmp_path, opts, BF16_CLASSES)


@pytest.mark.compile
@nvcc_only
def test_bf16_classes_the_kernel_does_not_lay_out_and_old_gpus_fail_to_compile(tmp_path):
    """float32's 4-float lanes are no bf16 class (and bf16's 8 no float32 one); bf16 for a
    GPU below compute capability 8.0 stops at the #error naming it."""

    def nvcc(cls, bf16, arch="sm_90"):
        return subprocess.run(
            [NVCC, *compile_options(False, "p2p", cls, bf16), f"-arch={arch}", "--cubin"]
            + ["-o", str(tmp_path / "k.cubin"), str(SOURCE)],
            capture_output=True,
            text=True,
            timeout=300,
        )

    for cls in ((4, 16), (8, 1024), (16, 16), (2, 6)):
        r = nvcc(cls, True)
        assert r.returncode != 0 and "MGG_" in r.stderr, cls
    r = nvcc((8, 16), False)
    assert r.returncode != 0 and "MGG_VEC" in r.stderr
    assert nvcc((8, 16), True).returncode == 0
    r = nvcc((8, 16), True, "sm_75")
    assert r.returncode != 0 and "compute capability 8.0" in r.stderr


@pytest.mark.compile
@pytest.mark.parametrize("major", [12, 13])
def test_bf16_kernels_compile_with_the_nvrtc_of_cuda_12_and_13(major):
    """The bf16 p2p variants (for sm_90 each vector width's group and slab layouts, and the
    generic kernel; two for sm_80: nvcc compiles every class, from the same source) and
    nn.cu (sm_75 too: its bf16 kernels round by hand there) through NVRTC, which has no
    cuda_bf16.h; the bf16 kernels' parameters as their launchers pass them."""
    from mgg.kernels.cuda.nn_ops import SOURCE as NN

    lib = nvrtc_library(major)
    if lib is None:
        pytest.skip(f"NVRTC {major} not installed (the dev extra installs it on Linux x86_64)")
    jobs = []
    for arch in ("sm_80", "sm_90"):
        tail = [f"--gpu-architecture={arch}", "-ftz=true"]  # as CuPy adds
        for weighted in (0, 1):  # NORMS: the nvcc test compiles its every class
            for cls in NVRTC_CLASSES if arch == "sm_90" else [(8, 128), (1, 0)]:
                jobs.append((SOURCE, [*compile_options(weighted, "p2p", cls, bf16=True), *tail]))
    for arch in ("sm_75", "sm_80", "sm_90"):
        jobs.append((NN, ["-std=c++17", f"--gpu-architecture={arch}", "-ftz=true"]))
    got = two_at_a_time(lambda job: nvrtc_compile(lib, job[0].read_text(), job[1]), jobs)
    for (source, opts), (status, log, size) in zip(jobs, got, strict=True):
        assert status == 0 and size > 0, (source.name, opts, log)
    for weighted in (0, 1, NORMS):  # the float32 variant's parameters; out the float32 sums
        opts = [*compile_options(weighted, "p2p", bf16=True), "--gpu-architecture=compute_90"]
        ptx = nvrtc_ptx(lib, SOURCE.read_text(), opts)
        params = ptx_params(ptx, "mgg_aggregate")
        assert len(params) == 21 and params[-3:] == ["u32"] * 3
        assert ptx_params(ptx, "mgg_round") == ["u64"] * 5 + ["u32"] * 2
        assert "cvt.rn.bf16.f32" in ptx  # one rounding, to nearest even, by the hardware
    ptx = nvrtc_ptx(lib, NN.read_text(), ["-std=c++17", "--gpu-architecture=compute_90"])
    for kernel in ("dropout_dense", "sddmm"):
        assert ptx_params(ptx, f"mgg_{kernel}_bf16") == ptx_params(ptx, f"mgg_{kernel}")


def same(a, b) -> bool:
    """a and b are one array: the same first element and shape (a view of all of b)."""
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and (
        a.shape == b.shape
    )


@pytest.mark.compile
@nvcc_only
@pytest.mark.parametrize("mode", ["p2p", "get"])
def test_bf16_launcher_arguments_match_the_compiled_kernels(rng, monkeypatch, tmp_path, mode):
    """run() on uint16 rows: the bf16 module of the class width_class gives for 2-byte
    rows; mgg_init and mgg_aggregate write the float32 accumulator, mgg_round reads it and
    writes out (mean: its flag), every argument list as the bf16 variant was compiled;
    nothing allocated. Refused: no accumulator, rows of two dtypes, a float32 launch config."""
    import mgg.kernels.cuda as kc

    if mode == "get" and nvshmem_home() is None:
        pytest.skip("the get mode needs NVSHMEM (nvidia-nvshmem-cu13, in the dev extra)")
    fake_cupy(monkeypatch)
    rec = Launches()
    monkeypatch.setattr(kc, "load_module", rec.load_module)
    g = random_graph(rng, 300, 3000).gcn_norm()
    plan = build_plan(g, 3, 8)[1]
    dp = kc.DevicePlan(plan, 2)
    d, n = 48, plan.num_local_nodes
    h100 = known_gpu("H100")
    cfg = launch_config(8, 2, 4, d, plan.lnp_node.size, plan.rnp_node.size, h100, mode, 2)
    x = np.zeros((n, d), np.uint16)
    out, acc, peers = np.zeros_like(x), np.zeros(n * d, np.float32), np.zeros(1, np.uint64)
    wl = rng.random((plan.num_local_edges, 3), dtype=np.float32)
    wr = rng.random((plan.num_remote_edges, 3), dtype=np.float32)
    variants = (0, 1, NORMS) if mode == "p2p" else (1,)  # get: one, as the p2p case shows
    opts = [compile_options(w, mode, bf16=True) for w in variants]
    codes = two_at_a_time(lambda o: nvcc_ptx(tmp_path, SOURCE, o), opts)
    ptx = dict(zip(variants, codes, strict=True))
    for name in ("mgg_init", "mgg_aggregate", "mgg_round"):  # one signature for every variant
        assert len({tuple(ptx_params(code, name)) for code in ptx.values()}) == 1
    # D = 48: 8-element lanes (6 of 8 in a group); with 3 heads a head is 16 wide: still 8
    cases = [  # (op, weights, weighted module, mean flag)
        ("sum", None, 0, 0),
        ("mean", None, 0, 1),
        ("gin", None, 0, 0),
        ("gcn", None, NORMS, 0),  # a gcn_norm graph's weights, from its norms
        ("sum", (wl, wr), 1, 0),
    ]
    monkeypatch.setitem(sys.modules, "cupy", None)  # a launch that imports cupy fails
    for op, weights, weighted, mean in cases:
        rec.calls.clear()
        kc.run(dp, x, peers, out, op, 0.5, cfg, 0, weights=weights, acc=acc)
        assert rec.modules[-1] == (weighted, mode, (8, 64)) and rec.bf16[-1] is True
        assert [name for name, _ in rec.calls] == ["mgg_init", "mgg_aggregate", "mgg_round"]
        calls = dict(rec.calls)
        for name, args in calls.items():
            assert [ptx_type(a) for a in args] == ptx_params(ptx[1], name), (op, name)
        assert same(calls["mgg_init"][0], x) and calls["mgg_init"][1] is acc
        assert calls["mgg_aggregate"][0] is x and calls["mgg_aggregate"][16] is acc
        assert calls["mgg_aggregate"][17] == 0  # one launch: rows from 0
        assert calls["mgg_round"][0] is acc and same(calls["mgg_round"][1], out)
        assert calls["mgg_round"][-1] == mean
        assert calls["mgg_init"][3] == (np.float32(1.5) if op == "gin" else 0.0)
    # no interleaving: init with the local launch, the rounding after the remote one
    parts = {}
    for part in ("local", "remote"):
        rec.calls.clear()
        kc.run(dp, x, peers, out, "mean", 0.0, cfg, 0, parts=part, acc=acc)
        parts[part] = [name for name, _ in rec.calls]
    assert parts == {
        "local": ["mgg_init", "mgg_aggregate"],
        "remote": ["mgg_aggregate", "mgg_round"],
    }
    with pytest.raises(ValueError, match="float32 accumulator"):
        kc.run(dp, x, peers, out, "sum", 0.0, cfg, 0)
    with pytest.raises(ValueError, match="float32 accumulator"):
        kc.run(dp, x, peers, out, "sum", 0.0, cfg, 0, acc=acc[:-1])
    with pytest.raises(ValueError, match="both float32, or both uint16"):
        kc.run(dp, x.astype(np.float32), peers, out, "sum", 0.0, cfg, 0, acc=acc)
    f32 = launch_config(8, 2, 4, d, plan.lnp_node.size, plan.rnp_node.size, h100, mode)
    with pytest.raises(ValueError, match="for 4-byte rows, not 2"):
        kc.run(dp, x, peers, out, "sum", 0.0, f32, 0, acc=acc)
    # float32 rows still take the float32 module and no rounding
    rec.calls.clear()
    xf = np.zeros((n, d), np.float32)
    kc.run(dp, xf, peers, np.zeros_like(xf), "mean", 0.0, f32, 0)
    assert rec.bf16[-1] is False and rec.modules[-1] == (False, mode, (4, 64))
    assert [name for name, _ in rec.calls] == ["mgg_init", "mgg_aggregate", "mgg_finalize_mean"]


@pytest.mark.parametrize("rows", [37, 1, None])
def test_launches_by_destination_rows_give_what_one_launch_gives(rng, monkeypatch, rows):
    """A DevicePlan cut into launches of at most ``rows`` destination rows (so that bf16's
    float32 sums hold one launch's rows only: acc of dplan.rows * D) gives every op the
    oracle's rows, bf16 and float32, and the very bits of one launch; the launches cover
    the rows once, in order, each with its own partitions, row0 and exclusivity flags
    (which the emulator checks). aggregate.cu's kernels emulated (test_cuda.Emulated)."""
    import mgg.kernels.cuda as kc
    from mgg.kernels import gather_halo

    fake_cupy(monkeypatch)
    rec = Emulated()
    monkeypatch.setattr(kc, "load_module", rec.load_module)
    g = random_graph(rng, 400, 2400, hub_src=True, isolated=5).gcn_norm()
    plans = build_plan(g, 3, 4)
    p, d = plans[1], 12
    x = widen(bf16_bits(rng.standard_normal((g.num_nodes, d)))).astype(np.float32)
    dp, whole = kc.DevicePlan(p, 2, rows), kc.DevicePlan(p, 2)
    n = p.num_local_nodes
    want_rows = n if rows is None else rows
    assert dp.rows == min(n, want_rows) and len(whole.launches) == 1
    cuts = [(c.a, c.b) for c in dp.launches]
    assert cuts == [(a, min(a + want_rows, n)) for a in range(0, n, want_rows)]
    for c in dp.launches:  # each launch's partitions: those of its rows, all of them
        assert np.all((p.lnp_node[c.l0 : c.l1] >= c.a) & (p.lnp_node[c.l0 : c.l1] < c.b))
        assert np.all((p.rnp_node[c.r0 : c.r1] >= c.a) & (p.rnp_node[c.r0 : c.r1] < c.b))
    assert sum(c.l1 - c.l0 for c in dp.launches) == p.lnp_node.size
    wl = rng.standard_normal((p.num_local_edges, 3)).astype(np.float32)
    wr = rng.standard_normal((p.num_remote_edges, 3)).astype(np.float32)
    xs, halo = x[p.lb : p.ub], gather_halo(p, x)
    h100 = known_gpu("H100")
    for dtype in (np.uint16, np.float32):
        bf16 = dtype == np.uint16
        rows_of = (lambda a: bf16_bits(a)) if bf16 else (lambda a: a.copy())
        peers = [rows_of(x[q.lb : q.ub]) for q in plans]
        cfg = launch_config(4, 2, 4, d, p.lnp_node.size, p.rnp_node.size, h100, "p2p",
                            np.dtype(dtype).itemsize)  # fmt: skip
        for op, eps, weights in [("sum", 0, None), ("mean", 0, None), ("gin", 0.5, None),
                                 ("gcn", 0, None), ("sum", 0, (wl, wr))]:  # fmt: skip
            got = {}
            for plan_ in (dp, whole):
                out = np.zeros((n, d), dtype)
                acc = np.full(plan_.rows * d + 3, np.nan, np.float32) if bf16 else None
                rec.calls.clear()
                kc.run(plan_, peers[1], peers, out, op, eps, cfg, 0, weights=weights, acc=acc)
                got[plan_ is dp] = widen(out) if bf16 else out.astype(np.float64)
                aggs = [a for name, a in rec.calls if name == "mgg_aggregate"]
                assert [int(a[17]) for a in aggs] == [c.a for c in plan_.launches if c.b > c.a]
            if weights is None:
                want, mag = bf16_oracle(g, x, op, eps)
                want, mag = want[p.lb : p.ub], mag[p.lb : p.ub]
            else:
                want = weighted_oracle(p, xs, halo, wl, wr)
                mag = weighted_oracle(p, np.abs(xs), np.abs(halo), np.abs(wl), np.abs(wr))
            np.testing.assert_array_equal(got[True], got[False])
            err = 2.0**-8 * np.abs(want) if bf16 else 0
            np.testing.assert_array_less(np.abs(got[True] - want), err + 1e-5 * (mag + 1))
    acc, out, xb = np.zeros(dp.rows * d, np.float32), np.zeros((n, d), np.uint16), bf16_bits(xs)
    cfg = launch_config(4, 2, 4, d, p.lnp_node.size, p.rnp_node.size, h100, "p2p", 2)
    with pytest.raises(ValueError, match=f"acc \\[>= {dp.rows * d}\\]"):
        kc.run(dp, xb, peers, out, "sum", 0, cfg, 0, acc=acc[:-1])
    if len(dp.launches) > 1:
        with pytest.raises(ValueError, match="in one launch"):
            kc.run(dp, xb, peers, out, "sum", 0, cfg, 0, parts="local", acc=acc)


@pytest.mark.compile
@nvcc_only
def test_bf16_nn_launchers_match_the_compiled_kernel_signatures(rng, monkeypatch, tmp_path):
    """dropout_dense and sddmm take the _bf16 kernels for uint16 (or host bfloat16) rows,
    float32 for float32; gather_rows copies 2-byte rows in 16-, 4- or 2-byte units as the
    row's bytes and the pointers allow; the argument lists as nn.cu was compiled."""
    from mgg.kernels.cuda import nn_ops
    from mgg.kernels.cuda.nn_ops import SOURCE as NN

    fake_cupy(monkeypatch)
    monkeypatch.setattr(sys.modules["cupy"], "empty_like", np.empty_like, raising=False)
    calls = []
    monkeypatch.setattr(
        nn_ops, "_fn", lambda name: lambda grid, block, args: calls.append((name, args))
    )
    ptx = nvcc_ptx(tmp_path, NN, ["-std=c++17"])
    x = rng.standard_normal((5, 7)).astype(np.float32)
    for rows in (bf16_bits(x), x.astype(BF16)):  # device bits, or host bfloat16
        got = nn_ops.dropout_dense(rows, np.uint64(3), 0, np.uint32(1 << 30), 1.5)
        assert got.dtype == np.uint16 and got.shape == (5, 7)
        assert calls[-1][0] == "mgg_dropout_dense_bf16"
        np.testing.assert_array_equal(calls[-1][1][0], bf16_bits(x))  # the bits, not values
    assert nn_ops.dropout_dense(x, np.uint64(3), 0, np.uint32(1), 1.5).dtype == np.float32
    assert calls[-1][0] == "mgg_dropout_dense"
    indptr = np.array([0, 0, 3, 3, 5], np.int64)
    a, b = bf16_bits(np.ones((4, 8))), np.ones((9, 8), np.float32).astype(BF16)
    assert nn_ops.sddmm(indptr, np.array([1, 2, 3, 4, 8]), a, b, 2).shape == (5, 2)
    assert calls[-1][0] == "mgg_sddmm_bf16" and calls[-1][1][3].dtype == np.uint16
    with pytest.raises(ValueError, match="give both in one dtype"):
        nn_ops.sddmm(indptr, np.array([1, 2, 3, 4, 8]), a, b.astype(np.float32), 2)

    class Rows(np.ndarray):  # numpy rows with cupy's .data.ptr
        ptr = 0

        @property
        def data(self):
            return type("Ptr", (), {"ptr": self.ptr})()

    src = np.array([2, 0, 1], np.int64)
    for d, offset, kernel, q in (
        (8, 0, "mgg_gather_rows4", 1),  # 16 bytes a row: one float4
        (16, 4, "mgg_gather_rows1", 8),  # 4-byte aligned only: 8 words
        (6, 0, "mgg_gather_rows1", 3),  # 12 bytes
        (5, 0, "mgg_gather_rows_half", 5),  # 10 bytes: 2-byte units
        (8, 2, "mgg_gather_rows_half", 4 * 2),  # rows 2 bytes off: 2-byte units
    ):
        rows = np.zeros((4, d), np.uint16).view(Rows)
        rows.ptr = offset
        nn_ops.gather_rows(rows, src, rows)
        name, args = calls[-1]
        assert name == kernel and args[-1] == q and args[-2] == 3 * q, (d, offset)
        assert [ptx_type(v) for v in args] == ptx_params(ptx, name)
    for name, args in calls:
        assert [ptx_type(v) for v in args] == ptx_params(ptx, name), name
    with pytest.raises(ValueError, match="float32 or uint16 rows"):
        nn_ops.gather_rows(rows, src, np.zeros((3, 8), np.float32).view(Rows))


# ---- host logic, no GPU needed -----------------------------------------------------------
def test_bf16_width_class_is_the_narrowest_layout_of_16_byte_lanes():
    """Against the definition for 2-byte rows: 8 elements a lane (16 bytes) where D and
    each head's width are multiples of 8, else 2 (4 bytes) where even, else 1; W the least
    vec * 2**k >= D with 2**k <= 64 vectors, else 0. float32's classes do not change."""
    for d in range(1, 1100):
        for heads in [h for h in (1, 2, 3, 4, 8) if d % h == 0]:
            vec, w = width_class(d, heads, 2)
            want = next(v for v in (8, 2, 1) if d % v == 0 and (d // heads) % v == 0)
            assert vec == want, (d, heads)
            fits = [vec * 2**k for k in range(7) if vec * 2**k >= d]
            assert w == (fits[0] if fits else 0), (d, heads)
            assert width_class(d, heads, 4) == width_class(d, heads)
    assert width_class(128, itemsize=2) == (8, 128) and width_class(100, itemsize=2) == (2, 128)
    assert width_class(602, itemsize=2) == (2, 0) and width_class(64, 8, 2) == (8, 64)
    # (edges a warp sums at once, passes, vectors a lane loads of a row): D = 128 in bf16
    # is 16 lanes of 16 bytes, two edges at once (float32: one edge, 32 lanes)
    assert lanes_per_edge(128, itemsize=2) == (2, 1, 1) and lanes_per_edge(128) == (1, 1, 1)
    assert lanes_per_edge(512, itemsize=2) == (1, 1, 2) and lanes_per_edge(16, 1, 2) == (16, 1, 1)
    with pytest.raises(ValueError, match="4 or 2"):
        width_class(16, 1, 8)


def test_bf16_get_mode_stages_two_byte_rows():
    """The get mode's staging holds 2-byte rows: half the shared memory, so a
    configuration float32 rows cannot run fits in bf16."""
    h100 = known_gpu("H100")
    assert smem_bytes(16, 4, 32, "get", 2) == 16 * 4 * 4 + 2 * 16 * 4 * 32 * 2
    assert smem_bytes(16, 4, 32, "p2p", 2) == 0
    cfg = launch_config(32, 1, 16, 64, 10, 10, h100, "get", itemsize=2)
    assert cfg.smem == 32 * 16 * 4 + 2 * 32 * 16 * 64 * 2 and cfg.itemsize == 2
    with pytest.raises(ValueError, match="shared memory per block"):
        launch_config(32, 1, 16, 64, 10, 10, h100, "get")


def test_row_storage_refuses_bf16_below_compute_capability_8_naming_the_device():
    assert row_storage(np.float32, V100, 0) == np.float32
    for dtype in (BF16, "bfloat16"):
        for dev in (known_gpu("A100"), known_gpu("H100"), dataclasses.replace(V100, cc=None)):
            assert row_storage(dtype, dev, 0) == np.uint16
    for cc in ((7, 0), (7, 5), (6, 1)):
        with pytest.raises(
            InputError, match=rf"GPU 3 \(Tesla V100-SXM2-16GB\) has {cc[0]}\.{cc[1]}"
        ):
            row_storage(BF16, dataclasses.replace(V100, cc=cc), 3)
    with pytest.raises(ValueError, match="float32 or bfloat16 rows, not float64"):
        row_storage(np.float64, known_gpu("H100"), 0)
    with pytest.raises(ValueError, match="float32 or bfloat16 rows, not float16"):
        row_storage(np.float16, known_gpu("H100"), 0)


@pytest.mark.parametrize(
    "backend,name",
    [("cuda", "pipelined")]
    + [("virtual", n) for n in ("pipelined", "direct", "dgcl", "uvm", "uvm_hbm", "no_interleave")],
)
def test_designs_refuse_bf16_on_an_old_gpu_before_allocating(rng, monkeypatch, backend, name):
    """Every CUDA design checks the device where it is built, before any allocation (here
    without cupy: the error comes first, or the test fails on the import)."""
    from mgg.designs import cuda, get_design, virtual

    for module in (cuda, virtual):
        monkeypatch.setattr(module, "current_device", lambda: (3, V100))
    monkeypatch.setitem(sys.modules, "cupy", None)  # an allocation fails the test
    g = random_graph(rng, 60, 300)
    plans = build_plan(g, 1 if backend == "cuda" else 2, 4)
    plan = plans[0] if backend == "cuda" else plans
    cls = get_design(backend, name)
    assert cls.stores_rounded is True
    with pytest.raises(InputError, match=r"compute capability 8\.0.*GPU 3 \(Tesla V100"):
        cls(plan, None, 16, BF16)
    with pytest.raises(ValueError, match="float32 or bfloat16 rows, not float64"):
        cls(plan, None, 16, np.float64)


def test_nvshmem_symmetric_arrays_of_bf16_rows_are_uint16(monkeypatch):
    """NVSHMEMComm.symmetric (with NVSHMEM and MPI stand-ins): a bfloat16 array is its
    uint16 bits in the heap, 2 bytes an element in the heap's accounting."""
    from mgg.comm.nvshmem import NVSHMEMComm

    made = []

    class Heap:  # nvshmem.core's array()
        def array(self, shape, dtype):
            made.append(dtype)
            return np.zeros(shape, dtype)

    class Stub:  # the state symmetric() uses, two PEs
        used, heap, arrays = 0, 1 << 30, []
        comm = type("C", (), {"allgather": staticmethod(lambda v: [v, v])})()

    stub = Stub()
    stub.nvshmem = Heap()
    sym = NVSHMEMComm.symmetric(stub, 100, 24, BF16)
    assert made == ["uint16"] and sym.local.dtype == np.uint16 and sym.local.shape == (100, 24)
    assert stub.used == 100 * 24 * 2
    NVSHMEMComm.symmetric(stub, 100, 24, np.float32)
    assert made[-1] == "float32" and stub.used == 100 * 24 * 6


# ---- on a GPU ------------------------------------------------------------------------------
def virtual_bf16(design, plans, x, op, eps=0.0, **knobs):
    """The whole [N, D] output (uint16 bits) of a bf16 design over virtual PEs, its input
    x rounded to bf16."""
    import cupy

    d = virtual_design(design, plans, bf16_bits(x), dtype=BF16, **knobs)
    out = d(op, eps)
    assert out.dtype == np.uint16 and d.x.dtype == np.uint16
    return cupy.asnumpy(out)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_bf16_kernel_is_within_one_rounding_of_float64(rng, op):
    """Every bf16 width class a single head reaches, hubs and empty ranks, a few launch
    shapes, 1 and 3 PEs: within one bf16 rounding of the float64 oracle."""
    assert {width_class(d, 1, 2) for d in DIMS} == set(BF16_CLASSES) - {(1, 2)}
    for kind in range(3):  # hub source, hub destination, empty ranks
        n = 9 if kind == 2 else 2000
        g = random_graph(rng, n, 20 * n, hub_src=kind == 0, hub_dst=kind == 1)
        if op == "gcn":
            g = g.gcn_norm()
        for nprocs, (ps, dist, wpb) in ((1, (16, 4, 4)), (3, (5, 3, 2))):
            plans = build_plan(g, nprocs if kind != 2 else 12, ps)
            for dim in DIMS:
                x = rng.standard_normal((n, dim)).astype(np.float32)
                out = virtual_bf16("pipelined", plans, x, op, 0.25, dist=dist, wpb=wpb)
                assert_bf16_close(out, *bf16_oracle(g, x, op, 0.25))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "mean", "gin"])
def test_bf16_kernel_rounds_exact_sums_to_nearest_even(rng, op):
    """Integer rows: float32 sums them exactly, so the output is exactly the sum rounded
    once, to nearest even (mean: the float32 quotient rounded), bit for bit; among them
    ties that round up across a power of two."""
    g = random_graph(rng, 1500, 40_000, hub_dst=True, isolated=10)
    x = rng.integers(-120, 121, (1500, 40)).astype(np.float32)  # exact in bf16 (<= 256)
    ref = reference.aggregate(g, x.astype(np.float64), op if op != "mean" else "sum", eps=0.5)
    want = ref.astype(np.float32)
    if op == "mean":
        deg = np.maximum(g.in_degrees(), 1).astype(np.float32)
        want = want / deg[:, None]
    want = want.astype(BF16).astype(np.float64)
    assert (np.abs(ref) > 256).mean() > 0.2  # sums that bf16 must round
    for dim in (5, 33, 6, 8, 16, 40):  # 1-, 2- and 8-element lanes (the first columns)
        for nprocs in (1, 2, 4):
            out = virtual_bf16("pipelined", build_plan(g, nprocs, 8), x[:, :dim], op, 0.5)
            np.testing.assert_array_equal(widen(out), want[:, :dim])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("nprocs", [1, 2])
def test_bf16_ties_infinities_and_nans(nprocs):
    """One node summing two rows chosen column by column: ties to even (257 -> 256, 259 ->
    260), up across a power of two (511 -> 512, (2 - 2**-8) 2**127 -> inf), float32
    overflow, inf and NaN propagating."""
    big = 2.0**127
    cols = [  # (a, b, a + b rounded to bf16)
        (255, 256, 512),
        (255, 2, 256),
        (255, 4, 260),
        (-255, -256, -512),
        (255, 128, 384),
        (big, (2 - 2**-7) * 2**126, np.inf),  # the sum is exactly halfway to inf: even is inf
        (big, (2 - 2**-6) * 2**126, BF16_MAX),
        (BF16_MAX, BF16_MAX, np.inf),  # float32 overflows
        (np.inf, 1, np.inf),
        (np.inf, -np.inf, np.nan),
        (np.nan, 1, np.nan),
        (-np.inf, -1, -np.inf),
        (1.5, 2**-8, 1.5),  # halfway between 1.5 and 1.5078125: to the even 1.5
        (1.5078125, 2**-8, 1.515625),  # halfway between 1.5078125 and 1.515625: even, up
        (1.5, 3 * 2**-9, 1.5078125),  # past halfway: up
        (0, 0, 0),
        (-3, 3, 0),
    ]
    a, b, want = (np.array(c, np.float64) for c in zip(*cols, strict=True))
    for v in (a, b):  # exact in bf16
        assert np.array_equal(widen(bf16_bits(v)), v, equal_nan=True)
    with np.errstate(over="ignore", invalid="ignore"):  # the table is ml_dtypes' rounding
        assert np.array_equal(widen(bf16_bits(a + b)), want, equal_nan=True)
    g = Graph.from_edges(np.array([1, 2]), np.array([0, 0]), 3)
    x = np.stack([np.zeros_like(a), a, b]).astype(np.float32)
    out = widen(virtual_bf16("pipelined", build_plan(g, nprocs, 4), x, "sum"))
    np.testing.assert_array_equal(out[0], want)
    np.testing.assert_array_equal(out[1:], 0)


def weighted_oracle(p, x, halo, wl, wr):
    """float64 [n, D]: column j of row v sums w[e, j // C] x[src e, j] over v's edges e
    (local from x, remote from the halo), from the plan's CSRs directly."""
    import scipy.sparse as sp

    n, d = p.num_local_nodes, x.shape[1]
    heads = 1 if wl.ndim == 1 else wl.shape[1]
    wl, wr, c = wl.reshape(-1, heads), wr.reshape(-1, heads), d // heads
    out = np.zeros((n, d))
    for h in range(heads):
        cols = slice(h * c, (h + 1) * c)
        loc = sp.csr_matrix((wl[:, h], p.local_indices, p.local_indptr), (n, len(x)))
        out[:, cols] += loc @ x[:, cols]
        if p.num_remote_edges:
            rem = sp.csr_matrix((wr[:, h], p.remote_slot, p.remote_indptr), (n, len(halo)))
            out[:, cols] += rem @ halo[:, cols]
    return out


def test_the_weighted_cases_reach_every_bf16_class():
    """Checked here, not only where a GPU runs the weighted test below."""
    got = {width_class(d, h or 1, 2) for d, hs in WEIGHTED_CASES.items() for h in hs}
    assert got == set(BF16_CLASSES)


@gpu
@pytest.mark.gpu
def test_bf16_weighted_sums_per_edge_and_per_head(rng):
    """Per-call float32 weights [E] and [E, H] over bf16 rows, at widths of every bf16
    class with heads (D = 2 with 2 heads is the scalar lanes' (1, 2)), 1 and 3 PEs,
    through mgg.kernels.aggregate and aggregate_halo's launch knobs: within one rounding
    of the float64 oracle."""
    import cupy

    from mgg.kernels import aggregate, gather_halo
    from mgg.kernels.cuda import aggregate_halo

    g = random_graph(rng, 1200, 15_000, hub_src=True, isolated=20)
    for dim, head_counts in WEIGHTED_CASES.items():
        xb = widen(bf16_bits(rng.standard_normal((1200, dim))))
        for p in build_plan(g, 1, 8) + build_plan(g, 3, 8):
            xs, halo = xb[p.lb : p.ub], gather_halo(p, xb)
            for heads in head_counts:
                tail = () if heads is None else (heads,)
                wl = rng.standard_normal((p.num_local_edges, *tail)).astype(np.float32)
                wr = rng.standard_normal((p.num_remote_edges, *tail)).astype(np.float32)
                want = weighted_oracle(p, xs, halo, wl, wr)
                mag = weighted_oracle(p, np.abs(xs), np.abs(halo), np.abs(wl), np.abs(wr))
                got = aggregate(
                    p,
                    xs.astype(BF16),
                    "sum",
                    halo=halo.astype(BF16),
                    backend="cuda",
                    weights=(wl, wr),
                )
                assert got.dtype == np.uint16
                assert_bf16_close(got, want, mag)
                for dist, wpb in ((1, 1), (3, 2), (16, 8)):
                    got = aggregate_halo(
                        p,
                        cupy.asarray(bf16_bits(xs)),
                        cupy.asarray(bf16_bits(halo)),
                        "sum",
                        dist=dist,
                        wpb=wpb,
                        weights=(cupy.asarray(wl), cupy.asarray(wr)),
                    )
                    assert_bf16_close(got, want, mag)
    p = build_plan(g, 3, 8)[0]
    with pytest.raises(ValueError, match="give both in one"):
        aggregate_halo(p, xb[p.lb : p.ub].astype(BF16), gather_halo(p, xb), "sum")


def test_the_float32_sums_of_a_device_are_allocated_once_per_larger_size(monkeypatch):
    """shared_sums: every bf16 launch of a device reads the largest buffer asked for so
    far; a larger size adds one and keeps the smaller (a captured step may hold it), the
    same or a smaller size allocates nothing; each device has its own."""
    import mgg.kernels.cuda as kc

    fake_cupy(monkeypatch)
    monkeypatch.setattr(kc, "_SUMS", {})
    a = kc.shared_sums(0, 64 * 100)
    assert a.dtype == np.float32 and a.size == 6400
    assert kc.shared_sums(0, 16 * 100) is a and kc.shared_sums(0, 6400) is a
    b = kc.shared_sums(0, 128 * 100)
    assert b.size == 12800 and kc.shared_sums(0, 10) is b
    assert kc._SUMS[0] == [a, b]  # the smaller one still held
    c = kc.shared_sums(1, 10)
    assert c is not b and c.size == 10


@gpu
@pytest.mark.gpu
def test_one_pe_holds_one_design_a_width_and_its_bf16_designs_share_their_sums(rng):
    """A DistGraph of one PE on a GPU: one design per (direction, width), not two in turn,
    reading its input rows in place; the bf16 designs of two widths read one float32
    buffer; both aggregate as the oracle."""
    import cupy

    from mgg.distgraph import DistGraph

    g = random_graph(rng, 900, 10_000, hub_dst=True)
    dg = DistGraph.build(g, None, backend="cuda", dtype="bfloat16")
    for width in (64, 16):
        x = rng.standard_normal((900, width)).astype(np.float32)
        xb = cupy.asarray(bf16_bits(x))
        for _ in range(2):
            out = dg.aggregate(xb, "sum")
            assert_bf16_close(out, *bf16_oracle(g, x, "sum"))
        assert len(dg._designs[(False, width)]) == 1
    (wide,), (narrow,) = dg._designs[(False, 64)], dg._designs[(False, 16)]
    assert narrow.acc is wide.acc and wide.acc.size >= 900 * 64
    assert wide._own is None and narrow._own is None  # the rows read in place
    dg.free()


@gpu
@pytest.mark.gpu
def test_bf16_launches_by_destination_rows_on_the_gpu(rng, monkeypatch):
    """Float32 sums capped at 100 rows of 64 (memory.SUMS_MAX_BYTES): CudaPipelined cuts
    its plan into 9 launches, and every op is within one rounding of the oracle; so is
    aggregate_halo in launches of 37 rows on a rank of 3 with a halo, bf16 and float32."""
    import cupy

    import mgg.designs.cuda
    from mgg.backend import assign
    from mgg.designs.cuda import CudaPipelined
    from mgg.kernels import gather_halo
    from mgg.kernels.cuda import aggregate_halo

    monkeypatch.setattr(mgg.designs.cuda, "SUMS_MAX_BYTES", 4 * 64 * 100)
    g = random_graph(rng, 900, 10_000, hub_dst=True, isolated=5).gcn_norm()
    x = rng.standard_normal((900, 64)).astype(np.float32)
    (p,) = build_plan(g, 1, 8)
    d = CudaPipelined(p, None, 64, BF16, dist=3, wpb=2)
    assert len(d.dplan.launches) == 9 and d.dplan.rows == 100
    assign(d.x, bf16_bits(x))
    for op in ("sum", "mean", "gcn", "gin"):
        assert_bf16_close(d(op, 0.3), *bf16_oracle(g, x, op, 0.3))
    d.free()
    xb = widen(bf16_bits(x))
    for p in build_plan(g, 3, 8):
        halo = gather_halo(p, xb)
        for op in ("sum", "mean", "gcn", "gin"):
            want, mag = bf16_oracle(g, x, op, 0.3)
            got = aggregate_halo(p, xb[p.lb : p.ub].astype(BF16), halo.astype(BF16), op, 0.3,
                                 dist=2, wpb=4, rows=37)  # fmt: skip
            assert_bf16_close(got, want[p.lb : p.ub], mag[p.lb : p.ub])
            got = aggregate_halo(p, xb[p.lb : p.ub], halo, op, 0.3, dist=2, wpb=4, rows=37)
            err = np.abs(cupy.asnumpy(got) - want[p.lb : p.ub])  # float32 sums of the rows
            np.testing.assert_array_less(err, 1e-4 * (mag[p.lb : p.ub] + 1))


@gpu
@pytest.mark.gpu
def test_gcn_weights_from_norms_on_the_gpu(rng):
    """GCN's weights computed from a gcn_norm plan's norms (the NORMS kernel: no weight per
    edge on the device) give the held weights' sums, float32 and bf16, on one PE and on a
    rank of 3 with a halo, and on a restricted plan."""

    from mgg.kernels import gather_halo
    from mgg.kernels.cuda import DevicePlan, aggregate_halo

    g = random_graph(rng, 900, 10_000, hub_dst=True, isolated=5).gcn_norm()
    x = widen(bf16_bits(rng.standard_normal((900, 64))))
    plans = build_plan(g, 1, 8) + build_plan(g, 3, 8)
    for p in plans + [plans[2].restricted(np.arange(0, plans[2].num_local_nodes, 2))]:
        assert DevicePlan(p, 2).local_w is None and p.norm is not None
        held = held_weights(p)
        halo = gather_halo(p, x)
        for dtype in (np.float32, BF16):
            xs, hs = x[p.lb : p.ub].astype(dtype), halo.astype(dtype)
            outs = [aggregate_halo(q, xs, hs, "gcn", dist=2, wpb=4).get() for q in (p, held)]
            a, b = (widen(o) if dtype == BF16 else o for o in outs)
            tol = 2.0**-7 if dtype == BF16 else 1e-5
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@gpu
@pytest.mark.gpu
def test_bf16_cuda_design_on_one_pe(rng):
    """CudaPipelined in plain device memory, bf16: uint16 rows and output, one float32
    accumulator for the design's life, every op and per-call weights [E, H]."""
    import cupy

    from mgg.backend import assign
    from mgg.designs.cuda import CudaPipelined

    g = random_graph(rng, 900, 10_000, hub_dst=True, isolated=5).gcn_norm()
    x = rng.standard_normal((900, 64)).astype(np.float32)
    (p,) = build_plan(g, 1, 8)
    d = CudaPipelined(p, None, 64, BF16, dist=3, wpb=2)
    assert d.x.dtype == np.uint16 and d.acc.dtype == np.float32
    assign(d.x, bf16_bits(x))
    acc = d.acc
    for op in ("sum", "mean", "gcn", "gin"):
        out = d(op, 0.3)
        assert out.dtype == np.uint16 and d.acc is acc
        assert_bf16_close(out, *bf16_oracle(g, x, op, 0.3))
    xb = widen(bf16_bits(x))
    for heads in (1, 8):
        wl = rng.standard_normal((p.num_local_edges, heads)).astype(np.float32)
        wr = np.zeros((0, heads), np.float32)
        got = d("sum", weights=(cupy.asarray(wl), cupy.asarray(wr)))
        want = weighted_oracle(p, xb, xb[:0], wl, wr)
        mag = weighted_oracle(p, np.abs(xb), xb[:0], np.abs(wl), wr)
        assert_bf16_close(got, want, mag)
    d.free()
    assert d.acc is None


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(
    "design", ["pipelined", "direct", "dgcl", "uvm", "uvm_hbm", "no_interleave"]
)
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_bf16_virtual_designs_at_1_to_4_pes(rng, design, op):
    """Every virtual design in bf16 (their row arrays, staging and managed memory 2 bytes
    an element), P = 1..4, hubs and isolated nodes, widths of 1-, 2- and 8-element lanes
    and the generic kernel: within one rounding of the float64 oracle."""
    g = random_graph(rng, 1500, 25_000, hub_src=True, isolated=40)
    if op == "gcn":
        g = g.gcn_norm()
    for dim in (5, 18, 128, 300):
        x = rng.standard_normal((1500, dim)).astype(np.float32)
        want = bf16_oracle(g, x, op, 0.5)
        for nprocs in (1, 2, 3, 4):
            assert_bf16_close(virtual_bf16(design, build_plan(g, nprocs, 16), x, op, 0.5), *want)


@gpu
@pytest.mark.gpu
def test_bf16_dgcl_gathers_2_byte_rows_and_uvm_advice_holds(rng):
    """DGCL-style staging of bf16 rows holds each remote edge's row, bit for bit; the UVM
    designs' advice covers 2-byte rows (verified on the GPU)."""
    import cupy
    from test_virtual_designs import remote_sources

    g = random_graph(rng, 1500, 20_000, hub_src=True)
    x = rng.standard_normal((1500, 12)).astype(np.float32)
    plans = build_plan(g, 4, 16)
    d = virtual_design("dgcl", plans, bf16_bits(x), dtype=BF16)
    d("sum")
    for p, (_, staging, _) in zip(plans, d.halo, strict=True):
        assert staging.dtype == np.uint16
        got = cupy.asnumpy(staging)[p.remote_slot]
        np.testing.assert_array_equal(got, bf16_bits(x)[remote_sources(g, p.lb, p.ub)])
    for name in ("uvm", "uvm_hbm"):
        d = virtual_design(name, plans, bf16_bits(x), dtype=BF16)
        d("sum")
        assert d.advice == {"verified": True, "detail": "as advised"}, name
        assert isinstance(d.x.data.mem, cupy.cuda.ManagedMemory) and d.x.dtype == np.uint16


@gpu
@pytest.mark.gpu
def test_bf16_gather_rows_copies_the_bits(rng):
    """gather_rows over uint16 rows of odd, even and 16-byte widths, rows 2 bytes off
    alignment: every bit pattern (NaN payloads too) copied as numpy's take does."""
    import cupy

    from mgg.kernels.cuda.nn_ops import gather_rows

    for dim in (1, 3, 6, 8, 16, 100, 130):
        x = rng.integers(0, 1 << 16, (700, dim), dtype=np.uint16)
        src = rng.integers(0, 700, 5000)
        for offset in (0, 1, 2):
            buf = cupy.zeros(700 * dim + offset, cupy.uint16)
            xd = buf[offset:].reshape(700, dim)
            xd[...] = cupy.asarray(x)
            out = cupy.zeros((src.size, dim), cupy.uint16)
            gather_rows(xd, cupy.asarray(src), out)
            np.testing.assert_array_equal(cupy.asnumpy(out), x[src])


@gpu
@pytest.mark.gpu
def test_bf16_dropout_keeps_the_float32_entries_and_rounds_once(rng):
    """dropout_dense over bf16 rows drops exactly the entries float32's drops (the same
    hash), and a kept entry is bf16(x) * scale in float32 rounded once, to nearest even."""
    import cupy

    from mgg.kernels.cuda import nn_ops

    x = rng.standard_normal((600, 37)).astype(np.float32)
    x[np.abs(x) < 1e-3] = 0.5  # no zeros: a zero kept would look dropped
    xb = bf16_bits(x)
    for p in (0.1, 0.5, 0.9):
        threshold = np.uint32(p * 2.0**32)
        key, scale = np.uint64(rng.integers(0, 2**63)), np.float32(1.0 / (1.0 - p))
        f32 = cupy.asnumpy(nn_ops.dropout_dense(cupy.asarray(x), key, 7, threshold, scale))
        got = nn_ops.dropout_dense(cupy.asarray(xb), key, 7, threshold, scale)
        assert got.dtype == np.uint16
        got = widen(got)
        np.testing.assert_array_equal(got != 0, f32 != 0)
        kept = f32 != 0
        want = (xb.view(BF16).astype(np.float32) * scale).astype(BF16).astype(np.float64)
        np.testing.assert_array_equal(got[kept], want[kept])
        assert abs((~kept).mean() - p) < 0.02
        host = nn_ops.dropout_dense(x.astype(BF16), key, 7, threshold, scale)  # ml_dtypes in
        np.testing.assert_array_equal(cupy.asnumpy(host), bf16_bits(got))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 4])
def test_bf16_sddmm_is_float32_dot_products_of_bf16_rows(rng, heads):
    """sddmm over bf16 a and b: float32 [E, H], within float32's summation error of the
    float64 dot products of the bf16-rounded rows; host bfloat16 rows give the same."""
    import cupy

    from mgg.kernels.cuda import nn_ops

    g = random_graph(rng, 700, 6000, hub_dst=True, isolated=30)
    c = 20
    a = widen(bf16_bits(rng.standard_normal((700, heads * c))))
    b = widen(bf16_bits(rng.standard_normal((900, heads * c))))
    indices = rng.integers(0, 900, g.num_edges).astype(np.int32)
    rows = np.repeat(np.arange(700), np.diff(g.indptr))
    prod = (a[rows] * b[indices]).reshape(-1, heads, c)
    want, mag = prod.sum(-1), np.abs(prod).sum(-1)
    up = cupy.asarray
    got = nn_ops.sddmm(up(g.indptr), up(indices), up(bf16_bits(a)), up(bf16_bits(b)), heads)
    assert got.dtype == np.float32 and got.shape == (g.num_edges, heads)
    got = cupy.asnumpy(got)
    np.testing.assert_array_less(np.abs(got - want), 1e-5 * (mag + 1e-3))
    host = nn_ops.sddmm(up(g.indptr), up(indices), a.astype(BF16), b.astype(BF16), heads)
    np.testing.assert_array_equal(cupy.asnumpy(host), got)


@gpu
@pytest.mark.gpu
def test_bf16_on_a_gpu_below_compute_capability_8_is_refused_naming_it(rng, monkeypatch):
    """This GPU reported as compute capability 7.5: bf16 designs are refused naming it;
    float32 ones still build."""
    import mgg.kernels.cuda as kc
    from mgg.designs.cuda import CudaPipelined

    real = kc.live_gpu
    monkeypatch.setattr(kc, "live_gpu", lambda i=0: dataclasses.replace(real(i), cc=(7, 5)))
    name = real(0).name
    plan = build_plan(random_graph(rng, 50, 200), 1, 4)[0]
    with pytest.raises(InputError, match=rf"\({re.escape(name)}\) has 7\.5"):
        CudaPipelined(plan, None, 16, BF16)
    with pytest.raises(InputError, match="has 7.5"):
        plans = build_plan(random_graph(rng, 50, 200), 2, 4)
        virtual_design("dgcl", plans, np.zeros((50, 16), np.uint16), dtype=BF16)
    CudaPipelined(plan, None, 16).free()


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="no compute-sanitizer")
def test_bf16_memcheck_is_clean(tmp_path):
    """compute-sanitizer's memcheck over the bf16 kernels: every kind of lane (1, 2 and 8
    elements, groups, two vectors a lane, the generic slabs), every op, the two launches
    of no_interleave, DGCL's gather of odd 2-byte rows."""
    script = tmp_path / "small.py"
    script.write_text(
        textwrap.dedent("""
        import cupy, numpy as np
        from mgg.backend import assign
        from mgg.designs import get_design
        from mgg.graph.generators import rmat
        from mgg.partition import build_plan
        from mgg.precision import BF16
        g = rmat(8, 8).gcn_norm()
        for dim in (3, 6, 20, 128, 264, 600):
            x = np.random.default_rng(0).standard_normal((g.num_nodes, dim), np.float32)
            for name in ("pipelined", "no_interleave", "dgcl"):
                d = get_design("virtual", name)(build_plan(g, 3, 7), None, dim, BF16, wpb=2)
                assign(d.x, x.astype(BF16).view(np.uint16))
                for op in ("sum", "gcn", "gin", "mean"):
                    d(op, 0.5)
        cupy.cuda.Device().synchronize()
        print("done")
    """)
    )
    memcheck(script, timeout=120)


@gpu
@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,mode", [(2, "p2p"), (2, "get")])
def test_bf16_nvshmem_pes_are_within_one_rounding_of_float64(nprocs, mode, tmp_path):
    """Real PEs over NVSHMEM in bf16: uint16 symmetric arrays, peers read by loads (p2p)
    or fetched 2 bytes an element (get); every rank's output gathered and compared here."""
    pytest.importorskip("nvshmem.core")
    from mgg.graph.dataset import random_features
    from mgg.graph.generators import rmat

    # 1- and 8-element lanes, the generic kernel of pairs
    got = nvshmem_outputs(tmp_path, nprocs, mode, (5, 128, 300), "bfloat16")
    g = rmat(11, 8, seed=1).gcn_norm()
    for dim in (5, 128, 300):
        x = random_features(5, 0, g.num_nodes, dim)
        for op in ("sum", "mean", "gcn", "gin"):
            assert_bf16_close(got[f"{op}{dim}"], *bf16_oracle(g, x, op, 0.3))
