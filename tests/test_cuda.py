"""The CUDA backend: sources compile everywhere nvcc is; host logic runs without a GPU;
kernels are checked against scipy on a GPU (marked gpu, skipped without one)."""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mgg.comm.nvshmem import HeapTooSmallError, check_heap, heap_bytes, heap_needed
from mgg.kernels import reference
from mgg.kernels.cuda import SOURCE, compile_options, exclusive_flags, launch_config, nvshmem_home
from mgg.partition import build_plan
from mgg.tuner import known_gpu

from conftest import ROOT, assert_agg_close, random_graph

NVCC = shutil.which("nvcc")


def have_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device
        return False


gpu = pytest.mark.skipif(not have_gpu(), reason="needs cupy and an NVIDIA GPU")


# ---- compiles in CI --------------------------------------------------------------------
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


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("weighted", [0, 1])
@pytest.mark.parametrize("mode", ["p2p", "get"])
def test_kernels_compile_for_sm80_and_sm90(tmp_path, weighted, mode):
    if mode == "get" and nvshmem_home() is None:
        pytest.skip("the get mode needs NVSHMEM headers (nvidia-nvshmem-cu13 or NVSHMEM_HOME)")
    opts = [o for o in compile_options(bool(weighted), mode) if not o.startswith(("-L", "-l"))]
    opts = ["-rdc=true" if o == "-dc" else o for o in opts]
    cmd = [
        NVCC,
        *opts,
        "--Werror",
        "all-warnings",
        "-gencode",
        "arch=compute_80,code=sm_80",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-c",
        str(SOURCE),
        "-o",
        str(tmp_path / "k.o"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "k.o").stat().st_size > 0


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


# ---- on a GPU ------------------------------------------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("nprocs", [1, 2, 4])
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_kernel_equals_scipy(rng, nprocs, op):
    from mgg.kernels.cuda import aggregate_virtual

    for kind in range(4):  # plain, hub source, hub destination, empty ranks
        n = 9 if kind == 3 else 3000
        g = random_graph(rng, n, 30 * n, hub_src=kind == 1, hub_dst=kind == 2)
        if op == "gcn":
            g = g.gcn_norm()
        for dim in (1, 16, 20, 64, 130):
            x = rng.standard_normal((n, dim)).astype(np.float32)
            for ps, dist, wpb in ((16, 4, 4), (1, 1, 1), (32, 16, 8), (5, 3, 2)):
                plans = build_plan(g, nprocs if kind != 3 else 12, ps)
                out = aggregate_virtual(plans, x, op, eps=0.25, dist=dist, wpb=wpb)
                assert_agg_close(out, reference.aggregate(g, x, op, eps=0.25), g, x)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="no compute-sanitizer")
def test_memcheck_is_clean(tmp_path):
    script = tmp_path / "small.py"
    script.write_text(
        textwrap.dedent("""
        import numpy as np
        from mgg.graph.generators import rmat
        from mgg.kernels.cuda import aggregate_virtual
        from mgg.partition import build_plan
        g = rmat(8, 8).gcn_norm()
        x = np.random.default_rng(0).standard_normal((g.num_nodes, 20)).astype(np.float32)
        for op in ("sum", "gcn", "gin", "mean"):
            aggregate_virtual(build_plan(g, 3, 7), x, op, dist=3, wpb=2)
        print("done")
    """)
    )
    r = subprocess.run(
        [
            "compute-sanitizer",
            "--tool",
            "memcheck",
            "--error-exitcode",
            "9",
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 0 and "done" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ERROR SUMMARY: 0 errors" in r.stdout + r.stderr


@gpu
@pytest.mark.gpu
def test_gpu_dropout_draws_the_cpu_masks_and_loss_matches(rng):
    import cupy
    import scipy.sparse as sp

    from mgg.nn import Dropout, softmax_cross_entropy

    class Rows:
        lb = 123

    x = rng.standard_normal((500, 37)).astype(np.float32)
    drop = Dropout(0.4, seed=3, stream=1)
    drop.epoch = 7
    cpu = drop.forward(x, Rows())
    gpu_out = cupy.asnumpy(drop.forward(cupy.asarray(x), Rows()))
    np.testing.assert_array_equal(cpu != 0, gpu_out != 0)
    np.testing.assert_allclose(cpu, gpu_out, rtol=1e-6)
    xs = sp.random(500, 37, density=0.3, format="csr", random_state=0, dtype=np.float32)
    from mgg.nn.backend import to_device

    np.testing.assert_allclose(
        drop.forward(xs, Rows()).toarray(),
        drop.forward(to_device(xs), Rows()).get().toarray(),
        rtol=1e-6,
    )
    logits = rng.standard_normal((400, 9)).astype(np.float32)
    y = rng.integers(0, 9, 400)
    mask = rng.random(400) < 0.5
    a = softmax_cross_entropy(logits, y, mask)
    b = softmax_cross_entropy(cupy.asarray(logits), cupy.asarray(y), cupy.asarray(mask))
    assert abs(a[0] - b[0]) < 1e-5 and a[2:] == b[2:]
    np.testing.assert_allclose(a[1], cupy.asnumpy(b[1]), atol=1e-6)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("model", ["gcn", "gin"])
def test_gpu_training_follows_the_cpu_loss_curve(model):
    from mgg.graph.generators import planted_partition
    from mgg.train import Trainer, build_model, build_optimizer, prepare

    ds = planted_partition(3000, 4, avg_degree=8, num_features=24, seed=0)
    losses = {}
    for backend in ("cpu", "cuda"):
        dg, data = prepare(ds, None, model, backend=backend)
        m = build_model(model, data, layers=3 if model == "gin" else None).to(backend)
        t = Trainer(dg, data, m, build_optimizer("adam", m, 0.01, 5e-4), eval_every=0)
        losses[backend] = [h["loss"] for h in t.fit(30)]
        final = t.evaluate()
    np.testing.assert_allclose(losses["cpu"], losses["cuda"], atol=2e-3)
    assert 0 <= final["test_acc"] <= 1


@gpu
@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 4])
def test_nvshmem_pes_sharing_the_gpu_equal_scipy(nprocs):
    pytest.importorskip("nvshmem.core")
    from conftest import last_json, mpirun

    r = mpirun(
        nprocs,
        "mgg",
        "check",
        "rmat:scale=12,ef=8",
        "--backend",
        "cuda",
        "--op",
        "all",
        "--dim",
        "32",
        "--repeat",
        "2",
        "--json",
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = last_json(r.stdout)
    assert all(run["ok"] for run in res["runs"]), res["runs"]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("design", ["pipelined", "direct", "dgcl", "uvm", "no_interleave"])
@pytest.mark.parametrize("op", ["sum", "gcn", "gin", "mean"])
def test_gpu_designs_equal_scipy(rng, design, op):
    from mgg.baselines.cuda import aggregate_virtual_design

    g = random_graph(rng, 2000, 40_000, hub_dst=True)
    if op == "gcn":
        g = g.gcn_norm()
    x = rng.standard_normal((2000, 24)).astype(np.float32)
    for nprocs in (1, 3, 8):
        out = aggregate_virtual_design(design, build_plan(g, nprocs, 16), x, op, eps=0.5)
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
