"""The baselines among the virtual designs (mgg.designs.virtual): DGCL-style's one gather
per PE and UVM with every row in HBM. Host logic runs anywhere; the designs (and the gather
kernel, compiled with nn.cu's tests) are checked against scipy on a GPU (marked gpu)."""

import numpy as np
import pytest

from mgg.designs.virtual import advise_rows, place_rows
from mgg.kernels import reference
from mgg.partition import build_plan

from conftest import ROOT, assert_agg_close, gpu, random_graph, virtual_design


def remote_sources(g, lb, ub):
    """The global source of each in-edge of rows [lb, ub) that lives outside them, in
    CSR order: what a PE's remote edges read, straight from the graph."""
    out = []
    for v in range(lb, ub):
        for u in g.indices[g.indptr[v] : g.indptr[v + 1]]:
            if not lb <= u < ub:
                out.append(int(u))
    return np.array(out, np.int64)


# ---- host logic ------------------------------------------------------------------------
@pytest.mark.parametrize("nprocs", [1, 2, 4, 7])
def test_halo_nodes_are_each_remote_source_once_in_order_of_first_use(rng, nprocs):
    g = random_graph(rng, 600, 5000, hub_src=True, isolated=30)
    for p in build_plan(g, nprocs, 8):
        want = remote_sources(g, p.lb, p.ub)
        got = p.halo_nodes
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, list(dict.fromkeys(want.tolist())))
        np.testing.assert_array_equal(got[p.remote_slot], want)  # each remote edge's row


class FakeRuntime:
    """cuda.bindings.runtime as place_rows uses it: records the advice per byte range
    and reads the preferred location back (or refuses, or lies)."""

    class cudaError_t:  # noqa: N801 - the binding's names
        cudaSuccess = 0
        cudaErrorInvalidDevice = 101

    class cudaMemLocationType:  # noqa: N801
        cudaMemLocationTypeDevice = "device"
        cudaMemLocationTypeHost = "host"

    class cudaMemoryAdvise:  # noqa: N801
        cudaMemAdviseSetPreferredLocation = "preferred"
        cudaMemAdviseSetAccessedBy = "accessed"

    class cudaMemRangeAttribute:  # noqa: N801
        cudaMemRangeAttributePreferredLocation = "preferred"

    class cudaMemLocation:  # noqa: N801
        type = id = None

    def __init__(self, refuse_host=False, ignore=False):
        self.refuse_host, self.ignore = refuse_host, ignore
        self.preferred = {}  # page -> location id
        self.calls = []

    def cudaMemAdvise(self, ptr, n, advice, loc):  # noqa: N802
        self.calls.append(("advise", advice, ptr, n, loc.type, loc.id))
        if loc.type == "host" and self.refuse_host:
            return (self.cudaError_t.cudaErrorInvalidDevice,)
        if advice == "preferred" and not self.ignore:
            for page in range(ptr // 4096, -(-(ptr + n) // 4096)):
                self.preferred[page] = -1 if loc.type == "host" else loc.id
        return (0,)

    def cudaMemPrefetchAsync(self, ptr, n, loc, flags, stream):  # noqa: N802
        self.calls.append(("prefetch", ptr, n, loc.type, loc.id))
        return (0,)

    def cudaMemRangeGetAttribute(self, size, attr, ptr, n):  # noqa: N802
        got = {self.preferred.get(p, -2) for p in range(ptr // 4096, (ptr + n) // 4096)}
        return (0, got.pop() if len(got) == 1 else -2)


def test_uvm_placement_advises_own_rows_to_the_gpu_and_verifies_it():
    bounds = np.array([0, 1000, 2500, 4000])  # 3 PEs; row = 64 floats = 256 B
    base, row = 1 << 21, 256
    rt = FakeRuntime()
    got = place_rows(rt, base, row, bounds, 1, device_id=2)
    assert got == {"verified": True, "detail": "as advised"}
    preferred = [c for c in rt.calls if c[:2] == ("advise", "preferred")]
    assert [(c[2], c[3], c[4]) for c in preferred] == [
        (base, 1000 * row, "host"),
        (base + 1000 * row, 1500 * row, "device"),
        (base + 2500 * row, 1500 * row, "host"),
    ]
    assert all(c[5] == 2 for c in preferred if c[4] == "device")
    accessed = [c for c in rt.calls if c[:2] == ("advise", "accessed")]
    assert len(accessed) == 3 and all(c[4:] == ("device", 2) for c in accessed)
    # refused (CUDA 13 rejecting a location) or silently ignored: not verified
    assert place_rows(FakeRuntime(refuse_host=True), base, row, bounds, 1, 2)["verified"] is False
    bad = place_rows(FakeRuntime(ignore=True), base, row, bounds, 0, 2)
    assert bad["verified"] is False and "prefer" in bad["detail"]


def test_uvm_hbm_placement_puts_every_row_on_the_gpu():
    """uvm_hbm's advice (advise_rows over all rows): preferred on, accessed by and
    prefetched to the GPU, verified by the read-back; empty ranges are skipped."""
    base, row, n = 1 << 21, 64 * 4, 5000
    rt = FakeRuntime()
    got = advise_rows(rt, base, row, [(0, n, 3), (n, n, "host")], 3)
    assert got == {"verified": True, "detail": "as advised"}
    assert [c for c in rt.calls if c[0] == "advise"] == [
        ("advise", "preferred", base, n * row, "device", 3),
        ("advise", "accessed", base, n * row, "device", 3),
    ]
    assert [c for c in rt.calls if c[0] == "prefetch"] == [("prefetch", base, n * row, "device", 3)]
    rt.preferred[(base + 4096 * 7) // 4096] = -1  # a page the driver kept on the host
    rt.cudaMemAdvise = lambda *a: (0,)
    bad = advise_rows(rt, base, row, [(0, n, 3)], 3)
    assert bad["verified"] is False and "prefer -2, not 3" in bad["detail"]


def test_a_bench_row_whose_uvm_hbm_placement_failed_fails_the_stage(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "bench" / "gpu"))
    import common_gpu

    monkeypatch.setattr(common_gpu, "GPU_RESULTS", tmp_path)
    monkeypatch.setattr(common_gpu, "device", lambda: {"device": "NVIDIA H200"})
    t = {
        "uvm_advice": {"verified": True, "detail": "as advised"},
        "uvm_hbm_advice": {"verified": False, "detail": "rows [0, 9) prefer -1, not 0"},
    }
    row = {"graph": "reddit", **common_gpu.uvm_columns(t), **common_gpu.uvm_columns(t, "uvm_hbm")}
    assert row["uvm_advice_verified"] is True and row["uvm_hbm_advice_verified"] is False
    res = common_gpu.Results("fake", {}, ["graph", "uvm_hbm_advice_verified"])
    res.add(row)
    assert res.finish() == 3
    assert "uvm_hbm placement not verified: rows [0, 9) prefer -1" in capsys.readouterr().out
    ok = common_gpu.Results("fine", {}, ["graph"])
    ok.add({**row, "uvm_hbm_advice_verified": True})
    assert ok.finish() == 0


# ---- on a GPU ------------------------------------------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("design", ["dgcl", "uvm_hbm"])
@pytest.mark.parametrize("op", ["sum", "mean", "gcn", "gin"])
def test_dgcl_and_uvm_hbm_equal_scipy(rng, design, op):
    import cupy

    for n, e in ((2000, 30_000), (9, 40)):  # hub sources and isolated nodes; a tiny graph
        g = random_graph(rng, n, e, hub_src=True, isolated=n // 20)
        if op == "gcn":
            g = g.gcn_norm()
        for dim in (1, 16, 30, 100, 128):
            x = rng.standard_normal((n, dim)).astype(np.float32)
            want = reference.aggregate(g, x, op, eps=0.25)
            for nprocs in (1, 2, 4):
                d = virtual_design(design, build_plan(g, nprocs, 16), x)
                assert_agg_close(cupy.asnumpy(d(op, 0.25)), want, g, x)


@gpu
@pytest.mark.gpu
def test_dgcl_gathers_each_pes_halo_in_one_launch(rng, monkeypatch):
    """One gather per PE per call, and it leaves in PE r's staging buffer exactly the
    rows its remote edges read (taken from the graph, not the plan's halo)."""
    import cupy

    from mgg.designs import virtual

    g = random_graph(rng, 1500, 20_000, hub_src=True)
    launches = []
    real = virtual.gather_rows
    monkeypatch.setattr(
        virtual, "gather_rows", lambda *a: (launches.append(a[1].size), real(*a))[1]
    )
    for dim in (1, 12, 64):
        x = rng.standard_normal((1500, dim)).astype(np.float32)
        for nprocs in (2, 4):
            plans = build_plan(g, nprocs, 16)
            d = virtual_design("dgcl", plans, x)
            launches.clear()
            d("sum")
            assert launches == [p.num_halo for p in plans]
            for p, (_, staging, _) in zip(plans, d.halo, strict=True):
                got = cupy.asnumpy(staging)[p.remote_slot]
                np.testing.assert_array_equal(got, x[remote_sources(g, p.lb, p.ub)])


@gpu
@pytest.mark.gpu
def test_gather_rows_any_width_and_alignment(rng):
    """gather_rows against numpy's take: widths on and off the 16-byte path, repeated
    and out-of-order rows, and an x whose rows start off 16-byte alignment."""
    import cupy

    from mgg.kernels.cuda.nn_ops import gather_rows

    for dim in (1, 3, 4, 16, 100, 130):
        x = rng.standard_normal((700, dim)).astype(np.float32)
        src = rng.integers(0, 700, 5000)
        for offset in (0, 1):  # 1: x starts 4 bytes into its buffer
            buf = cupy.zeros(700 * dim + offset, cupy.float32)
            xd = buf[offset:].reshape(700, dim)
            xd[...] = cupy.asarray(x)
            out = cupy.full((src.size, dim), cupy.nan, cupy.float32)
            gather_rows(xd, cupy.asarray(src), out)
            np.testing.assert_array_equal(cupy.asnumpy(out), x[src])


@gpu
@pytest.mark.gpu
def test_uvm_hbm_rows_are_managed_and_verified_on_the_gpu(rng):
    import cupy

    g = random_graph(rng, 3000, 30_000)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    d = virtual_design("uvm_hbm", build_plan(g, 4, 16), x)
    assert d.advice == {"verified": True, "detail": "as advised"}
    assert isinstance(d.x.data.mem, cupy.cuda.ManagedMemory)
    assert d.cfgs[0].dist == 1 and d.plans[0].ps == max(p.widest_row for p in d.plans)
