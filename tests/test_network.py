"""Across nodes: real mpiexec jobs with MPIR_CVAR_NOLOCAL=1, so that MPICH treats every
rank as its own node and all traffic takes its network path (no shared-memory window).
Every design is compared with an oracle computed here, and training across such nodes
with training on one."""

import numpy as np
import pytest
from test_mpi import EPS, check, oracle

from mgg.graph.dataset import random_features
from mgg.graph.specs import resolve

from conftest import last_json, mpirun

pytestmark = pytest.mark.mpi

NOLOCAL = {"MPIR_CVAR_NOLOCAL": "1"}
PLANTED = "planted:nodes=1500,classes=4,degree=8,features=24"


@pytest.mark.parametrize("nprocs", [2, 4])
def test_every_design_equals_scipy_across_nodes(nprocs, tmp_path):
    res = check(nprocs, "rmat:scale=10,ef=8,seed=5", tmp_path, "--ps", "4", dim=9, env=NOLOCAL)
    # no shared window across nodes; direct's per-edge gets need one-sided ones
    assert {(r["design"], r["window"]) for r in res["runs"]} == {
        ("pipelined", "rma"), ("bulk_halo", "rma"), ("direct", "rma"),
        ("pipelined", "msg"), ("bulk_halo", "msg"),
    }  # fmt: skip
    by = {(r["design"], r["op"], r["window"]): r for r in res["runs"]}
    assert (
        by["pipelined", "sum", "msg"]["remote_bytes"]
        == by["bulk_halo", "sum", "msg"]["remote_bytes"]
    )  # each remote row crosses once per call


def test_auto_window_is_msg_across_nodes_and_shm_on_one():
    across = {"pipelined": "msg", "bulk_halo": "msg", "direct": "rma"}  # direct: no msg
    one = dict.fromkeys(across, "shm")
    for env, want in ((NOLOCAL, across), ({}, one)):
        r = mpirun(2, "mgg", "check", "rmat:scale=8,ef=4", "--json", "--repeat", "1", env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert {run["design"]: run["window"] for run in last_json(r.stdout)["runs"]} == want


PUSH_JOB = """
import numpy as np
from mgg.comm import get_comm
from mgg.designs import get_design
from mgg.graph.dataset import random_features
from mgg.graph.specs import resolve
from mgg.partition import build_plan

import mgg.designs.cpu

mgg.designs.cpu.MIN_MESSAGE = 1  # chunks as many as asked, however small the graph
comm = get_comm()
g = resolve("{spec}").graph
out = {{}}
for op in ("sum", "mean", "gcn", "gin"):
    gg = g.gcn_norm() if op == "gcn" else g
    plan = build_plan(gg, comm.size, 3, rank=comm.rank, transposed=False)
    x = random_features(0, plan.lb, plan.ub, {dim})
    for dist in (1, 2, 5, 100000):  # 100000 chunks: one RNP each, most peers idle
        d = get_design("cpu", "pipelined")(plan, comm, {dim}, window="msg", dist=dist)
        for call in range(2):  # the second call reuses every buffer and message
            d.x[...] = x * (call + 1)
            y = d(op, eps={eps}) / (call + 1)
        whole = comm.gather(y, root=0)
        if comm.rank == 0:
            out[f"{{op}}-{{dist}}"] = np.concatenate(whole)
        d.free()
if comm.rank == 0:
    np.savez("{out}", **out)
"""


@pytest.mark.parametrize(
    "spec, nprocs",
    [
        ("rmat:scale=9,ef=8,seed=2", 3),  # hubs: R-MAT's skewed degrees
        ("planted:nodes=3,classes=1,degree=2", 4),  # a rank with no nodes
        ("planted:nodes=400,classes=2,degree=8,p_in=0.95", 2),  # more LNPs than RNPs
    ],
)
def test_pushed_batches_and_distances_equal_scipy(spec, nprocs, tmp_path):
    """One chunk, a few, and one per RNP (most messages empty, so not sent), and a
    second call on the same buffers: each equals scipy."""
    dim = 5
    job = tmp_path / "job.py"
    job.write_text(PUSH_JOB.format(spec=spec, dim=dim, eps=EPS, out=tmp_path / "out.npz"))
    r = mpirun(nprocs, "python", job, env=NOLOCAL)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    g = resolve(spec).graph
    x = random_features(0, 0, g.num_nodes, dim)
    assert len(got.files) == 16
    for key in got.files:
        want = oracle(g, x, key.split("-")[0])
        np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-5 * max(1, abs(want).max()))


TRAIN_JOB = """
import json
import mgg.torch as mt
from mgg.comm import get_comm
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.train import Trainer

comm = get_comm()
ds = resolve("{spec}")
out = {{}}
for window in {windows}:
    for name in ("gcn", "sage", "gat"):
        spec = mt.MODELS[name]
        dg, data = prepare(ds, comm, name, window=window)
        model = mt.build_model(name, data.num_features, data.num_classes)
        opt = build_optimizer("adam", model, spec.lr, spec.weight_decay)
        t = Trainer(dg, data, model, opt, eval_every=0, check_sync=True)
        losses = [h["loss"] for h in t.fit(5)]
        out[window + " " + name] = {{"losses": losses, "window": dg.config["window"]}}
        dg.free()
if comm.rank == 0:
    print(json.dumps(out))
"""


def test_training_across_nodes_equals_training_on_one(tmp_path):
    """GCN, SAGE and GAT (per-call edge weights), forward and backward (the transposed
    plan), over pushed messages and over one-sided gets: the losses of a run on one node."""
    runs = {}
    for label, windows, env in (("one", ["shm"], {}), ("across", ["msg", "rma"], NOLOCAL)):
        job = tmp_path / f"{label}.py"
        job.write_text(TRAIN_JOB.format(spec=PLANTED, windows=windows))
        r = mpirun(3, "python", job, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.update(last_json(r.stdout))
    for name in ("gcn", "sage", "gat"):
        one = runs["shm " + name]
        assert one["window"] == "shm" and one["losses"][-1] < one["losses"][0], name
        for window in ("msg", "rma"):
            other = runs[f"{window} {name}"]
            assert other["window"] == window
            np.testing.assert_allclose(other["losses"], one["losses"], rtol=0, atol=1e-6)


def test_window_shm_across_nodes_is_one_clear_error():
    r = mpirun(3, "mgg", "train", "--dataset", PLANTED, "--epochs", "1", "--window", "shm",
               env=NOLOCAL)  # fmt: skip
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "--window shm needs every rank on one node" in lines[0] and "on 3" in lines[0]
    assert "Traceback" not in r.stderr


def test_direct_over_messages_is_refused_by_name_and_auto_gives_it_rma():
    r = mpirun(2, "mgg", "check", "rmat:scale=8,ef=4", "--designs", "direct", "--window", "msg",
               env=NOLOCAL)  # fmt: skip
    assert r.returncode == 2
    assert "the direct design takes window shm or rma, not msg" in r.stderr
    r = mpirun(2, "mgg", "check", "rmat:scale=8,ef=4", "--designs", "direct,pipelined",
               "--json", "--repeat", "1", env=NOLOCAL)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    runs = last_json(r.stdout)["runs"]
    assert {(run["design"], run["window"]) for run in runs} == {
        ("direct", "rma"),
        ("pipelined", "msg"),
    }
    r = mpirun(2, "mgg", "train", "--dataset", PLANTED, "--epochs", "2", "--design", "direct",
               "--json", env=NOLOCAL)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_json(r.stdout)["graph_config"]["window"] == "rma"


def test_tune_and_train_choose_the_window_by_measurement(tmp_path):
    r = mpirun(2, "mgg", "tune", "rmat:scale=11,ef=8", "--budget", "8", "--confirm", "0",
               "--out", tmp_path, "--json", env=NOLOCAL)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    lat = res["window_latency_s"]
    assert set(lat) == {"msg", "rma"} and all(t > 0 for t in lat.values())
    assert res["window"] == min(lat, key=lat.get)
    r = mpirun(2, "mgg", "train", "--dataset", PLANTED, "--epochs", "14", "--tune", "--json",
               env=NOLOCAL)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    tuning = res["tuning"]
    lat = tuning["window_latency_s"]
    assert tuning["window"] == min(lat, key=lat.get) == res["graph_config"]["window"]
    one = mpirun(2, "mgg", "tune", "rmat:scale=9,ef=8", "--budget", "4", "--confirm", "0",
                 "--out", tmp_path, "--json")  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]
    res = last_json(one.stdout)
    assert res["window"] == "shm" and res["window_latency_s"] is None


def test_a_transport_that_cannot_start_fails_fast():
    """A network MPI cannot bring up (here: UCX told to use a transport that does not
    exist) ends the job at start-up with MPI's reason, never a hang."""
    r = mpirun(2, "mgg", "check", "rmat:scale=6,ef=4", timeout=60,
               env={**NOLOCAL, "UCX_TLS": "no_such_transport"})  # fmt: skip
    assert r.returncode != 0
    assert "ucx" in r.stderr.lower() and "Traceback" not in r.stderr
