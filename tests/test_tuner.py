import math

import numpy as np
import pytest

from mgg.tuner import (
    Workload,
    default_space,
    estimate,
    exhaustive,
    known_gpu,
    model_guess,
    rank_configs,
    search,
    smem_bytes,
)

SPACE = {"ps": [1, 2, 4, 8, 16, 32], "dist": [1, 2, 4, 8, 16], "wpb": [1, 2, 4, 8, 16]}


def bowl(opt=(16, 4, 4), scale=(1.0, 0.6, 0.8)):
    """Convex in log2 space with its minimum at ``opt``."""

    def f(c):
        return 1.0 + sum(
            s * (math.log2(c[k]) - math.log2(o)) ** 2
            for k, o, s in zip(("ps", "dist", "wpb"), opt, scale, strict=True)
        )

    return f


def noisy(f, level=0.03, seed=0):
    rng = np.random.default_rng(seed)
    return lambda c: f(c) * (1 + level * rng.standard_normal())


def plateau(f, floor=1.2):
    """Flat wherever the bowl is within 20% of its minimum."""
    return lambda c: max(f(c), floor)


def infeasible(f, limit=64):
    """ps * wpb over a limit does not fit (like shared memory per block)."""
    return lambda c: math.inf if c["ps"] * c["wpb"] > limit else f(c)


def counted(f):
    calls = []

    def g(c):
        calls.append(dict(c))
        return f(c)

    g.calls = calls
    return g


LANDSCAPES = {
    "convex": bowl(),
    "convex, far corner": bowl(opt=(32, 16, 16)),
    "convex, near origin": bowl(opt=(2, 1, 2)),
    "noisy": noisy(bowl()),
    "plateau": plateau(bowl()),
    "infeasible region": infeasible(bowl(opt=(16, 4, 8))),
    "ridge in ps": lambda c: bowl()(c) + (0.5 if c["ps"] == 8 else 0.0),
}


@pytest.mark.parametrize("name", list(LANDSCAPES))
def test_search_finds_the_optimum_within_5_percent(name):
    f = LANDSCAPES[name]
    truth = exhaustive(SPACE, f)
    assert truth.measured == 6 * 5 * 5
    g = counted(f)
    res = search(SPACE, g)
    assert res.best_latency <= 1.05 * truth.best_latency, (res.best, truth.best)
    assert res.measured == len(g.calls) == len({tuple(c.values()) for c in g.calls})
    assert res.measured <= 30, res.measured  # vs 150 for the exhaustive search
    assert res.start == {"ps": 1, "dist": 1, "wpb": 1}


def test_the_walk_follows_the_paper():
    res = search(SPACE, bowl())
    phases = [t["phase"] for t in res.trace]
    assert phases[0] == "start"
    first_grow = [t["config"] for t in res.trace if t["phase"] == "grow ps"]
    assert [c["ps"] for c in first_grow] == [2, 4, 8, 16, 32]  # stops after 32 is worse
    assert phases.index("grow ps") < phases.index("grow dist") < phases.index("grow wpb")
    assert "retry ps" in phases
    assert res.best == {"ps": 16, "dist": 4, "wpb": 4}
    assert res.start_latency > res.best_latency


def test_starting_from_the_model_guess_needs_fewer_measurements():
    f = bowl()
    from_origin = search(SPACE, f)
    from_near = search(SPACE, f, start={"ps": 8, "dist": 4, "wpb": 4})
    assert from_near.best == from_origin.best
    assert from_near.measured < from_origin.measured


@pytest.mark.parametrize(
    "name", ["convex", "convex, near origin", "plateau", "infeasible region", "ridge in ps"]
)
def test_search_from_a_corner_walks_down_too(name):
    f = LANDSCAPES[name]
    truth = exhaustive(SPACE, f)
    res = search(SPACE, f, start={"ps": 32, "dist": 16, "wpb": 16})
    assert res.best_latency <= 1.05 * truth.best_latency, (res.best, truth.best)
    assert res.measured < 30


def test_budget_and_failures():
    def broken(c):
        if c["dist"] == 2:
            raise RuntimeError("kernel launch failed")
        return bowl()(c)

    res = search(SPACE, broken, max_measurements=8)
    assert res.measured <= 8
    assert all(t["latency"] == math.inf for t in res.trace if t["config"]["dist"] == 2)
    assert math.isfinite(res.best_latency)
    with pytest.raises(ValueError, match="no candidate"):
        search({"ps": [], "dist": [1], "wpb": [1]}, bowl())


def test_smem_formula_is_listing_2():
    # ps*wpb*IntS + 2*ps*wpb*D*FloatS
    assert smem_bytes(16, 4, 32) == 16 * 4 * 4 + 2 * 16 * 4 * 32 * 4
    assert smem_bytes(16, 4, 32, mode="p2p") == 0


def test_model_prunes_infeasible_configurations():
    h100 = known_gpu("NVIDIA H100 80GB HBM3")
    work = Workload(
        local_edges=5_000_000, remote_edges=15_000_000, halo_rows=400_000, dim=128, nodes=60_000
    )
    # ps=32, wpb=16, D=128: 2*32*16*128*4 = 512 KiB of staging -> does not fit
    e = estimate(32, 1, 16, work, h100)
    assert not e.feasible and "shared memory" in e.reason
    e = estimate(1, 1, 64, work, h100)
    assert not e.feasible and "threads per block" in e.reason
    e = estimate(16, 4, 4, work, h100)
    assert e.feasible and e.wpw == 2 * 16 * 128 * 4
    assert e.warps == math.ceil(max(5_000_000 / 16, 15_000_000 / 16) / 4)
    assert e.blocks == math.ceil(e.warps / 4)
    ranked = rank_configs(default_space(h100), work, h100)
    feasible = [c for c, est in ranked if est.feasible]
    assert ranked[-1][1].feasible is False and len(feasible) < len(ranked)
    assert model_guess(ranked) == feasible[0]
    with pytest.raises(ValueError, match="unknown GPU"):
        known_gpu("Voodoo 2")


def test_model_guess_is_a_reasonable_start_on_a_synthetic_device():
    h100 = known_gpu("H100")
    work = Workload(2_000_000, 6_000_000, 300_000, 16, 50_000)
    guess = model_guess(rank_configs(default_space(h100), work, h100))
    est = estimate(guess["ps"], guess["dist"], guess["wpb"], work, h100)
    origin = estimate(1, 1, 1, work, h100)
    # feasible, every SM busy at full occupancy, and far ahead of the paper's start
    assert est.feasible and est.blocks >= h100.sms
    assert est.resident_warps_per_sm == h100.max_warps_per_sm
    assert origin.resident_warps_per_sm < h100.max_warps_per_sm  # 1-warp blocks cap it
    assert est.latency < origin.latency / 2
    # p2p kernels need no shared memory: every configuration under the thread limit fits
    ranked = rank_configs(default_space(h100), work, h100, mode="p2p")
    assert all(est.feasible for _, est in ranked)


def test_trainer_tunes_with_real_training_steps():
    from mgg.graph.generators import planted_partition
    from mgg.torch import build_model
    from mgg.train import Trainer, build_optimizer, prepare

    ds = planted_partition(3000, 4, avg_degree=8, num_features=16, seed=0)
    dg, data = prepare(ds, None, "gcn")
    model = build_model("gcn", data.num_features, data.num_classes)
    space = {"ps": [4, 16, 64], "dist": [1, 4], "threads": [1]}
    t = Trainer(
        dg,
        data,
        model,
        build_optimizer("adam", model, 0.01, 5e-4),
        tune=True,
        tune_space=space,
        eval_every=0,
    )
    hist = t.fit(20)
    assert len(hist) == 20  # measured steps are training epochs too
    tuned = [h for h in hist if "config" in h]
    assert 2 <= len(tuned) == t.tuning["measured"] <= 6
    assert dg.config["ps"] == t.tuning["best"]["ps"]
    assert hist[-1]["loss"] < hist[0]["loss"]
    # a tuned configuration can be passed back in: no search then
    dg2, data2 = prepare(ds, None, "gcn")
    m2 = build_model("gcn", data2.num_features, data2.num_classes)
    t2 = Trainer(
        dg2,
        data2,
        m2,
        build_optimizer("adam", m2, 0.01, 5e-4),
        config=t.tuning["best"],
        eval_every=0,
    )
    t2.fit(2)
    assert t2.tuning is None and dg2.config["ps"] == t.tuning["best"]["ps"]


@pytest.mark.mpi
def test_mgg_tune_reports_search_and_exhaustive_best(tmp_path):
    from conftest import last_json, mpirun

    r = mpirun(
        2,
        "mgg",
        "tune",
        "rmat:scale=12,ef=8",
        "--dim",
        "16",
        "--exhaustive",
        "--repeat",
        "3",
        "--confirm",
        "5",
        "--out",
        tmp_path,
        "--json",
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    grid = math.prod(len(v) for v in res["space"].values())
    assert res["start"] == {"ps": 1, "dist": 1, "threads": 1}
    assert res["measured"] == len(res["trace"]) and 2 <= res["measured"] < grid
    assert res["exhaustive_measured"] == grid  # the whole grid, measured on its own
    # re-measured side by side, the search's pick is close to the best of them all (at two
    # ranks on two cores the start, one thread each, can be that best: a 0.4 ms
    # aggregation, where noise decides "ahead of the start"; issue 18's ground)
    confirmed = res["confirmed_latency_s"]
    assert set(confirmed) == {"start", "default", "tuned", "exhaustive_best"}
    assert confirmed["tuned"] <= 1.5 * min(confirmed.values()), confirmed
    assert list(tmp_path.glob("*.png")) and list(tmp_path.glob("*-trace.json"))


@pytest.mark.mpi
def test_mgg_train_tunes_and_takes_a_config():
    from conftest import last_json, mpirun

    args = [
        "mgg",
        "train",
        "--dataset",
        "planted:nodes=2000,classes=3,degree=6",
        "--epochs",
        "16",
        "--eval-every",
        "0",
        "--json",
    ]
    r = mpirun(2, *args, "--tune")
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    assert res["tuning"]["measured"] >= 2 and res["graph_config"] == {
        **res["tuning"]["best"],
        "threads": res["graph_config"]["threads"],
    }
    r = mpirun(2, *args, "--config", '{"ps": 64, "dist": 2}')
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    assert res["tuning"] is None and res["graph_config"]["ps"] == 64
    assert res["graph_config"]["dist"] == 2
