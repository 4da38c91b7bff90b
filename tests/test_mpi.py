"""Real mpiexec runs of the distributed runtime (oversubscribed on small machines)."""

import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

from mgg.graph.dataset import random_features
from mgg.graph.specs import resolve

from conftest import last_json, mpirun, shared_dataset

pytestmark = pytest.mark.mpi


OPS = ("sum", "mean", "gcn", "gin")
EPS = 0.1  # the eps mgg check runs GIN with


def oracle(graph, x, op):
    """What every design must give, computed here with scipy in float64."""
    g = graph.gcn_norm() if op == "gcn" else graph
    w = g.weights.astype(np.float64) if op == "gcn" else np.ones(g.num_edges)
    a = sp.csr_matrix((w, g.indices, g.indptr), shape=(g.num_nodes,) * 2)
    out = a @ x.astype(np.float64)
    if op == "mean":
        deg = np.diff(g.indptr)
        out[deg > 0] /= deg[deg > 0, None]
    if op == "gin":
        out += (1 + EPS) * x
    return out


def check(nprocs, graph, tmp_path, *extra, dim, seed=0, timeout=240, env=None):
    """Run `mgg check --op all --window all` with every output saved, and compare each
    with the scipy oracle computed here (not with the check's own verdict)."""
    r = mpirun(
        nprocs,
        "mgg",
        "check",
        graph,
        "--op",
        "all",
        "--window",
        "all",
        "--repeat",
        "1",
        "--dim",
        dim,
        "--seed",
        seed,
        "--outputs",
        tmp_path,
        "--json",
        *extra,
        timeout=timeout,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-2000:]
    res = last_json(r.stdout)
    g = resolve(graph, seed=seed).graph
    x = random_features(seed, 0, g.num_nodes, dim)
    want = {op: oracle(g, x, op) for op in OPS}
    for run in res["runs"]:
        got = np.load(tmp_path / f"{run['design']}-{run['op']}-{run['window']}.npy")
        assert got.shape == (g.num_nodes, dim)
        ref = want[run["op"]]
        err = np.abs(got - ref).max(initial=0) / max(1.0, np.abs(ref).max(initial=0))
        assert err < 1e-5, (run["design"], run["op"], run["window"], err)
    return res


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_every_design_equals_scipy_on_rmat(nprocs, tmp_path):
    res = check(nprocs, "rmat:scale=10,ef=8,seed=3", tmp_path, "--ps", "5", "--dist", "2", dim=12)
    assert res["np"] == nprocs
    assert set(res["designs"]) == {"pipelined", "bulk_halo", "direct"}
    runs = res["runs"]
    # designs x ops x windows (shm, rma; msg has no direct per-edge gets)
    assert {(r["design"], r["window"]) for r in runs} == {
        (d, w) for d in ("pipelined", "bulk_halo", "direct") for w in ("shm", "rma", "msg")
    } - {("direct", "msg")}
    assert len(runs) == 8 * 4
    assert all(r["seconds"] > 0 for r in runs)
    if nprocs > 1:
        by = {(r["design"], r["op"], r["window"]): r for r in runs}
        # each remote row crosses once per call in the pipelined and bulk designs, once per
        # edge in direct
        assert (
            by["pipelined", "sum", "rma"]["remote_bytes"]
            == by["bulk_halo", "sum", "rma"]["remote_bytes"]
        )
        assert (
            by["direct", "sum", "rma"]["remote_bytes"]
            > by["pipelined", "sum", "rma"]["remote_bytes"]
        )


@pytest.mark.parametrize("name, nprocs", [("cora", 3), ("amazon_photo", 2), ("pubmed", 4)])
def test_real_graphs(name, nprocs, tmp_path):
    check(nprocs, str(shared_dataset(name)), tmp_path, dim=8)


def test_more_ranks_than_nodes(tmp_path):
    check(4, "planted:nodes=3,classes=1,degree=2", tmp_path, dim=3)


def _script(tmp_path, body):
    p = tmp_path / "job.py"
    p.write_text(textwrap.dedent(body))
    return p


def test_an_exception_on_one_rank_aborts_the_job(tmp_path):
    job = _script(
        tmp_path,
        """
        import time
        from mgg.comm import get_comm
        comm = get_comm()
        if comm.rank == 1:
            raise ValueError("rank one is broken on purpose")
        comm.barrier()  # would wait forever without the abort
        time.sleep(60)
    """,
    )
    r = mpirun(3, "python", job, timeout=60)
    assert r.returncode != 0
    assert "rank one is broken on purpose" in r.stderr
    assert "aborting all 3 ranks" in r.stderr


def test_a_cli_error_on_one_rank_aborts_the_job(tmp_path):
    r = mpirun(2, "mgg", "check", "no-such-graph-kind:x=1", timeout=60)
    assert r.returncode != 0
    assert "no-such-graph-kind" in r.stderr


def test_plans_that_differ_across_ranks_are_detected(tmp_path):
    job = _script(
        tmp_path,
        """
        from mgg.comm import get_comm
        from mgg.graph.generators import rmat
        from mgg.partition import build_plan
        from mgg.designs.cpu import Pipelined
        comm = get_comm()
        g = rmat(8, 4)
        plan = build_plan(g, comm.size, 4 if comm.rank == 0 else 8, rank=comm.rank)
        Pipelined(plan, comm, 4)
    """,
    )
    r = mpirun(2, "python", job, timeout=60)
    assert r.returncode != 0
    assert "PlanMismatchError" in r.stderr and "plans of different partitions" in r.stderr


def test_plan_for_another_job_size_is_rejected(tmp_path):
    job = _script(
        tmp_path,
        """
        from mgg.comm import get_comm
        from mgg.graph.generators import rmat
        from mgg.partition import build_plan
        from mgg.designs.cpu import Pipelined
        comm = get_comm()
        plan = build_plan(rmat(8, 4), 3, 4, rank=0)
        Pipelined(plan, comm, 4)
    """,
    )
    r = mpirun(2, "python", job, timeout=60)
    assert r.returncode != 0 and "the plan is for 3 ranks but the job has 2" in r.stderr


def test_mggrun_tells_every_rank_the_size_it_asked_for(tmp_path):
    job = _script(
        tmp_path,
        """
        import os
        from mgg.comm import get_comm
        comm = get_comm()
        with open(f"{os.path.dirname(__file__)}/rank{comm.rank}", "w") as f:
            f.write(f"{comm.size} {os.environ['MGG_NP']}")
    """,
    )
    r = mpirun(3, "python", job, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [(tmp_path / f"rank{i}").read_text() for i in range(3)] == ["3 3"] * 3


def test_a_job_of_singletons_is_an_error_not_a_silent_run():
    """What a mismatched MPI looks like from inside (mpi4py bound to a library other than
    the launcher's): each rank sees a world of 1 although mggrun asked for 2."""
    from conftest import run_mgg

    r = run_mgg("check", "rmat:scale=6,ef=4", "--json", env={"MGG_NP": "2"})
    assert r.returncode == 2
    assert "mggrun started 2 ranks but MPI reports a world of 1" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_requested_size_is_read_from_the_launcher_options():
    from mgg.launch import requested_size

    assert requested_size(["-np", "4"]) == 4
    assert requested_size(["-n", "3", "-ppn", "2"]) == 3
    assert requested_size(["-np=6"]) == 6
    assert requested_size(["-f", "hosts"]) is None
    with pytest.raises(SystemExit, match="takes a number of ranks"):
        requested_size(["-np", "four"])


SLOW_READER = """
import json, sys, time
import numpy as np
from mgg.comm import get_comm
from mgg.distgraph import DistGraph
from mgg.graph.specs import resolve

comm = get_comm()
g = resolve("planted:nodes=400,classes=2,degree=8").graph
dg = DistGraph.build(g, comm, ps=4, window=sys.argv[1])
n = dg.num_local_nodes
des = dg._design(False, 3)  # set up; the next calls take the same width
if comm.rank == 1:  # this rank reads its peers' rows late
    run = des.run
    def late(*a, **k):
        time.sleep(0.3)
        return run(*a, **k)
    des.run = late
outs = []
for k in range(3):  # each layer's rows differ: a peer that overwrote early is seen
    x = np.full((n, 3), 10.0 * k + 1, np.float32) + np.arange(dg.lb, dg.ub)[:, None]
    outs.append(dg.aggregate(x, "sum").tolist())
print(json.dumps({"lb": dg.lb, "ub": dg.ub, "outs": outs, "windows": len(dg._designs[(False, 3)])}))
"""


@pytest.mark.parametrize("window", ["shm", "rma"])
def test_a_late_reader_sees_the_rows_of_its_layer(tmp_path, window):
    """One buffer per width on CPUs: a rank writes its next layer's rows only after every
    peer read the last layer's (rank 1 reads 0.3 s late)."""
    job = tmp_path / "job.py"
    job.write_text(SLOW_READER)
    r = mpirun(2, "python", job, window, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    g = resolve("planted:nodes=400,classes=2,degree=8").graph
    ranks = [
        __import__("json").loads(line) for line in r.stdout.splitlines() if line.startswith("{")
    ]
    assert len(ranks) == 2 and all(rk["windows"] == 1 for rk in ranks)
    for k in range(3):
        x = np.full((g.num_nodes, 3), 10.0 * k + 1) + np.arange(g.num_nodes)[:, None]
        want = oracle(g, x, "sum")
        for rk in ranks:
            np.testing.assert_allclose(rk["outs"][k], want[rk["lb"] : rk["ub"]], rtol=1e-6)


GATHER = """
import json
import numpy as np
from mgg.comm import get_comm
from mgg.harness import check
from mgg.precision import row_dtype
comm = get_comm("mpi")
rows = [7, 0, 4][comm.rank]  # a rank with none among them
x = 10.0 * comm.rank + np.arange(rows * 5, dtype=np.float32).reshape(rows, 5) / 4
got = {}
for how in ("one call", "rounds"):
    if how == "rounds":  # rounds of 2 rows per rank (5 values, 3 ranks: ROUND 30)
        check.ONE_CALL, check.ROUND = 0, 30
    got[how] = {
        "float32": check.gather_rows(comm, x),
        "bfloat16": check.gather_rows(comm, x.astype(row_dtype("bfloat16")), "bfloat16"),
    }
if comm.rank == 0:
    print(json.dumps({h: {k: [str(v.dtype), v.tolist()] for k, v in g.items()}
                      for h, g in got.items()}))
"""


def test_gather_rows_brings_every_ranks_rows_to_rank_0_in_order(tmp_path):
    """mgg check's gather: rank 0 receives each rank's rows in rank order, in one call or
    (where the rows are 2^31 values or more) in rounds through a bounded buffer."""
    job = tmp_path / "job.py"
    job.write_text(GATHER)
    r = mpirun(3, "python", job, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = last_json(r.stdout)
    ranks = ((0, 7), (2, 4))  # (rank, rows): rank 1 has none
    want = np.concatenate(
        [10.0 * k + np.arange(n * 5, dtype=np.float32).reshape(n, 5) / 4 for k, n in ranks]
    )  # quarters below 64: exact in bf16
    for how in ("one call", "rounds"):
        for dtype in ("float32", "bfloat16"):
            assert got[how][dtype][0] == "float32"  # bf16 widens to what it sums in
            np.testing.assert_array_equal(np.array(got[how][dtype][1]), want)
