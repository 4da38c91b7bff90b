"""bench/gpu/kernel_ab.py on a CPU: its dry mode (--backend cpu) runs everything a GPU
run does but the GPU's work, at toy size, so that a GPU window never loses minutes to a
Python error, a wrong flag or a missing pymetis."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import kernel_ab  # noqa: E402

SCRIPT = str(ROOT / "bench" / "gpu" / "kernel_ab.py")
TOY = ["--backend", "cpu", "--nodes", "2000", "--edges", "20000", "--repeat", "3"]
# the script run with `import pymetis` failing (a GPU image without it)
NO_PYMETIS = (
    "import runpy, sys; sys.modules['pymetis'] = None; sys.path.insert(0, sys.argv[1]); "
    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def dry_run(tmp_path, *args, block_pymetis=False, timeout=300):
    """The dry mode's JSON and the run's output, its files in tmp_path/out."""
    out = tmp_path / "out"
    env = {**os.environ, "MGG_GPU_OUT": str(out), "PYTHONPATH": str(ROOT)}
    head = [sys.executable, "-c", NO_PYMETIS, str(ROOT / "bench" / "gpu")] if block_pymetis else []
    cmd = [*(head or [sys.executable]), SCRIPT, *TOY, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = "locality_cpu" if "--orders" in args else "kernel_ab_cpu"
    assert sorted(p.name for p in out.iterdir()) == [
        f"{name}.{ext}" for ext in ("json", "log", "md", "png")
    ]  # never kernel_ab.json or locality.json: a GPU run's files stay
    return json.loads((out / f"{name}.json").read_text()), r.stdout


def check_rows(result, sources, dims, bf16=True):
    """One row per source, dim, dtype, op and ps, each with positive times, checked."""
    rows = result["table"]
    dtypes = ("float32", "bfloat16")[: 1 + bf16]
    want = {
        (s, d, t, op, c[0])
        for s in sources
        for d in dims
        for t in dtypes
        for op in ("sum", "gcn")
        for c in kernel_ab.CONFIGS
    }
    got = [(r["source"], r["D"], r["dtype"], r["op"], r["ps"]) for r in rows]
    assert sorted(got) == sorted(want)
    for r in rows:
        assert r["mgg_ms"] > 0 and r["cusparse_ms"] > 0 and r["vs_cusparse"] > 0, r
        assert r["max_rel_error"] < (1e-2 if r["dtype"] == "bfloat16" else 1e-4), r


def check_ncu(result, graphs, ncu_dims):
    """The ncu commands recorded: one inner run each (--inner ... --profile, never the
    whole benchmark: GPU run 8), at the profiled widths only."""
    commands = result["ncu_commands"]
    assert sorted(commands) == sorted(graphs)
    for cmd in commands.values():
        assert cmd[-3] == "--inner" and cmd[-1] == "--profile" and "--clock-control" in cmd
        assert cmd[cmd.index("--dims") + 1] == ",".join(map(str, ncu_dims))
        assert "--backend" not in cmd  # as a GPU run builds it


@pytest.fixture(scope="module")
def orders_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("orders")


@pytest.mark.slow
def test_orders_kept_in_order_dir_are_read_back_without_pymetis(tmp_path, orders_dir):
    """A second run over the orders kept (the GPU machine's, whose image may lack pymetis)
    reads them and never imports pymetis: here `import pymetis` fails."""
    if not kernel_ab.module_found("pymetis"):
        pytest.skip("pymetis not installed: no METIS order to carry")
    if not (orders_dir / "metis.npy").exists():
        kernel_ab.main(["--orders", "rcm,metis", "--order-dir", str(orders_dir), "--orders-only",
                        "--nodes", "2000", "--edges", "20000"])  # fmt: skip
    args = ["--orders", "rcm,metis", "--order-dir", str(orders_dir), "--dims", "16"]
    result, _ = dry_run(tmp_path, *args, "--no-compile", "--no-ncu", block_pymetis=True)
    assert result["pymetis_imported"] is False
    assert all(result["orders"][o]["how"].startswith("read from") for o in ("rcm", "metis"))
    check_rows(result, ["rcm", "metis"], [16], bf16=False)


@pytest.mark.slow
def test_the_dry_mode_of_the_kernel_run_compiles_each_source_and_profiles_one_inner_run(tmp_path):
    """--against OLD.cu --bf16 on CPU: both sources' rows, their registers from NVRTC's
    compile of each variant a GPU run loads (where NVRTC is installed), and the ncu
    command (not run) over one inner run at --ncu-dims."""
    old = tmp_path / "old.cu"
    old.write_text((ROOT / "mgg" / "kernels" / "cuda" / "aggregate.cu").read_text())
    args = ["--against", str(old), "--bf16", "--dims", "16,128", "--ncu-dims", "128"]
    result, out = dry_run(tmp_path, *args)
    check_rows(result, ["this", "old.cu"], [16, 128])
    check_ncu(result, ["this"], [128])
    assert result["device_info"]["device"].startswith("cpu")
    if kernel_ab.nvrtc_library() is not None:
        assert "compile check: 8 variants" in out  # the same text compiles once
        regs = {(r["source"], r["dtype"], r["op"], r["D"]): r["regs"] for r in result["table"]}
        assert all(isinstance(v, int) and 16 <= v <= 255 for v in regs.values()), regs
        assert regs[("this", "float32", "sum", 16)] == regs[("old.cu", "float32", "sum", 16)]


def test_a_wrong_flag_fails_at_once_in_one_line_naming_it():
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, SCRIPT, "--dims", "0"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "kernel_ab.py: error: argument --dims: '0': widths are positive integers, e.g. 16,128"
    ]
    assert time.perf_counter() - t0 < 30  # the imports only (2 s idle): no graph built


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--dims", "0"], "--dims"),
        (["--dims", "16,"], "--dims"),
        (["--orders", "nonsense"], "--orders"),
        (["--orders", "rcm,nonsense"], "--orders"),
        (["--dims", "16,128", "--ncu-dims", "64"], "--ncu-dims"),
        (["--nodes", "0"], "--nodes"),
        (["--parts", "x"], "--parts"),
        (["--backend", "gpu"], "--backend"),
        (["--against", "/no/such.cu"], "--against"),
        (["--against", SCRIPT, "--orders", "rcm"], "--against"),
        (["--order-dir", "/tmp"], "--order-dir"),
        (["--orders", "rcm", "--orders-only"], "--orders-only"),
        (["--profile"], "--profile"),
    ],
)
def test_each_wrong_flag_is_refused_before_any_work(capsys, args, flag):
    with pytest.raises(SystemExit) as e:
        kernel_ab.main([*args, "--backend", "cpu"] if "--backend" not in args else args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and flag in err, err


def test_the_cuda_backend_without_cupy_is_refused_at_once(capsys):
    if kernel_ab.module_found("cupy"):
        pytest.skip("cupy installed")
    with pytest.raises(SystemExit):
        kernel_ab.main(["--dims", "16"])
    assert "--backend cpu" in capsys.readouterr().err


def test_an_order_dir_of_another_graph_or_parts_is_refused_before_the_graph(tmp_path, capsys):
    """Orders in --order-dir of another size, or METIS's into other parts, are refused
    while the flags are read (before minutes of graph building on the GPU machine)."""
    from mgg.partition import order as node_order

    perm = np.random.default_rng(0).permutation(2000)
    node_order.save(tmp_path / "metis.npy", node_order.Order("metis parts=8", perm), "f" * 32)
    node_order.save(tmp_path / "rcm.npy", node_order.Order("rcm", perm), "f" * 32)
    base = ["--backend", "cpu", "--order-dir", str(tmp_path), "--edges", "20000"]
    for args, words in [
        (["--orders", "metis", "--nodes", "2000", "--parts", "4"], "'metis parts=8', not"),
        (["--orders", "rcm", "--nodes", "3000"], "2,000 entries, but the graph has 3,000"),
    ]:
        with pytest.raises(SystemExit):
            kernel_ab.main([*base, *args])
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "--order-dir" in err and words in err, err
    # the same size but another graph: refused once its fingerprint is known
    with pytest.raises(SystemExit, match="computed for another graph"):
        kernel_ab.main([*base, "--orders", "rcm", "--nodes", "2000", "--orders-only"])


def test_metis_without_pymetis_or_its_kept_order_is_refused_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pymetis", None)  # `import pymetis` fails
    with pytest.raises(SystemExit):
        kernel_ab.main(["--backend", "cpu", "--orders", "natural,metis", "--dims", "16"])
    assert "--orders-only" in capsys.readouterr().err  # says how to make it elsewhere


def test_orders_only_computes_and_keeps_the_orders_without_a_gpu(tmp_path, capsys):
    from mgg.graph.generators import rmat_n
    from mgg.partition import order as node_order

    args = ["--orders", "natural,rcm", "--order-dir", str(tmp_path), "--orders-only"]
    args += ["--nodes", "500", "--edges", "4000"]
    assert kernel_ab.main(args) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["rcm.npy"]
    g = rmat_n(500, 4000, seed=0)
    o = node_order.read(tmp_path / "rcm.npy", 500, node_order.fingerprint_of(g))
    np.testing.assert_array_equal(o.perm, node_order.compute(g, "rcm").perm)
    assert kernel_ab.main(args) == 0  # the second time: read, not computed
    assert "order rcm: read from" in capsys.readouterr().out


def test_every_ncu_command_profiles_one_inner_run():
    me = [sys.executable, "-u", SCRIPT, "--dims", "16"]
    cmd = kernel_ab.profiled("ncu", ["--section", "Occupancy"], me, "/tmp/g.npz")
    assert cmd[-3:] == ["--inner", "/tmp/g.npz", "--profile"]
    with pytest.raises(AssertionError, match="not one inner run"):
        kernel_ab.check_profiled(["ncu", *me])
