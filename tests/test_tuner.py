import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest

from mgg.knobs import space
from mgg.tuner import (
    Protocol,
    Workload,
    estimate,
    exhaustive,
    known_gpu,
    model_guess,
    rank_configs,
    search,
    smem_bytes,
)
from mgg.tuner.search import median_interval

from conftest import ROOT

SPACE = {"ps": [1, 2, 4, 8, 16, 32], "dist": [1, 2, 4, 8, 16], "wpb": [1, 2, 4, 8, 16]}
CPU_SPACE = {"ps": [1, 2, 4, 8, 16, 32, 64, 128], "dist": [1, 2, 4, 8, 16], "threads": [1]}


def bowl(opt=(16, 4, 4), scale=(1.0, 0.6, 0.8)):
    """Convex in log2 space with its minimum at ``opt``."""

    def f(c):
        return 1.0 + sum(
            s * (math.log2(c[k]) - math.log2(o)) ** 2
            for k, o, s in zip(("ps", "dist", "wpb"), opt, scale, strict=True)
        )

    return f


def plateau(f, floor=1.2):
    """Flat wherever the bowl is within 20% of its minimum."""
    return lambda c: max(f(c), floor)


def infeasible(f, limit=64):
    """ps * wpb over a limit does not fit (like shared memory per block)."""
    return lambda c: math.inf if c["ps"] * c["wpb"] > limit else f(c)


# the shape measured on this machine (bench/results/tuner.md): ps matters up to 16-64,
# dist hardly
_CPU_PS = {1: 2.5, 2: 1.9, 4: 1.16, 8: 1.09, 16: 1.05, 32: 1.02, 64: 1.0, 128: 1.01}


def cpu_like(c):
    return _CPU_PS[c["ps"]] * (1 + 0.01 * abs(math.log2(c["dist"]) - 2))


def counted(f):
    calls = []

    def g(c):
        calls.append(dict(c))
        return f(c)

    g.calls = calls
    return g


LANDSCAPES = {
    "convex": (SPACE, bowl()),
    "convex, far corner": (SPACE, bowl(opt=(32, 16, 16))),
    "convex, near origin": (SPACE, bowl(opt=(2, 1, 2))),
    "plateau": (SPACE, plateau(bowl())),
    "infeasible region": (SPACE, infeasible(bowl(opt=(16, 4, 8)))),
    "ridge in ps": (SPACE, lambda c: bowl()(c) + (0.5 if c["ps"] == 8 else 0.0)),
    "cpu-like": (CPU_SPACE, cpu_like),
    "shallow": (SPACE, bowl(scale=(0.05, 0.03, 0.04))),  # neighbours 3-5% apart
}


def noisy(f, level, seed, kind):
    """Samples of ``f`` with noise of relative size ``level``: 'lognormal' (symmetric in
    log) or 'spiky' (one-sided, as a busy machine: 30% of the samples slowed by
    |N(0, level)|, the rest by |N(0, level / 5)|)."""
    rng = np.random.default_rng(seed)

    def g(c):
        v = f(c)
        if kind == "lognormal":
            return v * math.exp(level * rng.standard_normal())
        spike = rng.random() < 0.3
        return v * (1 + abs(rng.standard_normal()) * (level if spike else level / 5))

    return g


def shifted_model(space, f, shift):
    """A model that is wrong by ``shift`` steps on every knob: it predicts a config's
    latency as the truth's at the shifted point (feasibility it knows, like the
    occupancy model's shared-memory and thread limits)."""
    knobs, out = list(space), {}
    for vals in itertools.product(*space.values()):
        c = dict(zip(knobs, vals, strict=True))
        moved = {
            k: space[k][min(len(space[k]) - 1, max(0, space[k].index(c[k]) + shift))] for k in knobs
        }
        out[vals] = math.inf if math.isinf(f(c)) else min(f(moved), 100.0)
    return out


@pytest.mark.parametrize("name", list(LANDSCAPES))
def test_search_finds_the_optimum_within_5_percent(name):
    space, f = LANDSCAPES[name]
    truth = exhaustive(space, f)
    assert truth.measured == math.prod(len(v) for v in space.values())
    g = counted(f)
    res = search(space, g)
    assert f(res.best) <= 1.05 * truth.best_latency, (res.best, truth.best)
    assert res.measured == len({tuple(c.values()) for c in g.calls}) <= 15
    assert res.samples == len(g.calls)
    assert res.start == {k: v[0] for k, v in space.items()}  # the paper's (1, 1, 1)
    assert res.confidence == 1.0 and res.noise == 0.0


def test_the_walk_goes_knob_by_knob_from_the_origin():
    res = search(SPACE, bowl())
    phases = [t["phase"] for t in res.trace]
    assert phases[0] == "start"
    first = [t["config"]["ps"] for t in res.trace if t["phase"] == "move ps"][:5]
    assert first == [2, 4, 8, 16, 32]  # stops after 32 is worse
    assert phases.index("move ps") < phases.index("move dist") < phases.index("move wpb")
    assert res.best == {"ps": 16, "dist": 4, "wpb": 4}
    assert res.start_latency > res.best_latency


def test_starting_near_the_optimum_needs_fewer_measurements():
    f = bowl()
    from_origin = search(SPACE, f)
    from_near = search(SPACE, f, start={"ps": 8, "dist": 4, "wpb": 4})
    assert from_near.best == from_origin.best
    assert from_near.measured < from_origin.measured


def test_the_model_picks_the_start_and_orders_the_moves():
    f = bowl()
    model = shifted_model(SPACE, f, 1)
    guess = min(model, key=model.get)
    g = counted(f)
    res = search(SPACE, g, model=model)
    assert tuple(res.start.values()) == guess == (8, 2, 2)  # one step below (16, 4, 4)
    assert res.best == {"ps": 16, "dist": 4, "wpb": 4}
    # the first move is the neighbour the model ranks first
    moves = [m for m in g.calls if m != res.start]
    neighbours = [(16, 2, 2), (4, 2, 2), (8, 4, 2), (8, 1, 2), (8, 2, 4), (8, 2, 1)]
    assert tuple(moves[0].values()) == min(neighbours, key=model.get)
    # a model that rules a config out keeps the walk off it
    banned = {**model, (16, 4, 4): math.inf}
    res = search(SPACE, counted(f), model=banned)
    assert res.best != {"ps": 16, "dist": 4, "wpb": 4}
    assert all(tuple(t["config"].values()) != (16, 4, 4) for t in res.trace)


@pytest.mark.parametrize(
    "name", ["convex", "convex, near origin", "plateau", "infeasible region", "ridge in ps"]
)
def test_search_from_a_corner_walks_down_too(name):
    space, f = LANDSCAPES[name]
    truth = exhaustive(space, f)
    res = search(space, f, start={"ps": 32, "dist": 16, "wpb": 16})
    assert f(res.best) <= 1.05 * truth.best_latency, (res.best, truth.best)
    assert res.measured <= 15


NOISE_CASES = [
    (name, level, kind)
    for name in LANDSCAPES
    for level in (0.05, 0.10, 0.20)
    for kind in ("lognormal", "spiky")
    # 3-5% apart under 20% symmetric noise: telling them apart takes ~200 samples each
    if not (name == "shallow" and level == 0.20 and kind == "lognormal")
]


@pytest.mark.parametrize("name,level,kind", NOISE_CASES)
def test_under_noise_the_pick_is_near_best_in_9_of_10_runs(name, level, kind):
    """The issue's criteria on synthetic landscapes: within 5% of the true best in >= 9
    of 10 runs, never worse than 1.15x, <= 15 configurations; starting from a model
    that is one step off on every knob (up in odd runs, down in even ones)."""
    space, f = LANDSCAPES[name]
    truth = exhaustive(space, f).best_latency
    ratios = []
    for seed in range(10):
        model = shifted_model(space, f, 1 if seed % 2 else -1)
        res = search(space, noisy(f, level, seed, kind), model=model)
        assert res.measured <= 15
        assert all(
            t["samples"] <= Protocol().max_samples + 2 * Protocol().max_samples for t in res.trace
        )
        ratios.append(f(res.best) / truth)
    assert sum(r <= 1.05 for r in ratios) >= 9, ratios
    assert max(ratios) <= 1.15, ratios


def test_the_search_is_deterministic_under_a_seed():
    space, f = LANDSCAPES["cpu-like"]
    model = shifted_model(space, f, 1)
    a = search(space, noisy(f, 0.1, 3, "spiky"), model=model)
    b = search(space, noisy(f, 0.1, 3, "spiky"), model=model)
    assert a.to_json() == b.to_json()


def test_noise_and_confidence_are_reported():
    space, f = LANDSCAPES["convex"]
    model = shifted_model(space, f, 1)
    quiet = search(space, noisy(f, 0.01, 0, "lognormal"), model=model)
    loud = search(space, noisy(f, 0.2, 0, "lognormal"), model=model)
    assert 0.003 < quiet.noise < 0.02 and 0.06 < loud.noise < 0.3
    assert loud.samples > quiet.samples  # noise costs samples, not configurations
    # two configs 4% apart under 20% noise: the pick is a coin toss, and says so
    two = {"ps": [1, 2], "dist": [1], "wpb": [1]}
    near = search(two, noisy(lambda c: 1.0 + 0.04 * (c["ps"] == 2), 0.2, 1, "lognormal"))
    far = search(two, noisy(lambda c: 1.0 + 0.5 * (c["ps"] == 2), 0.2, 1, "lognormal"))
    assert far.best == {"ps": 1, "dist": 1, "wpb": 1} and far.confidence > 0.95
    assert near.confidence < far.confidence
    assert len(near.final) == 2 and all(t["samples"] >= 3 for t in near.final)


def test_median_interval_covers_the_median_as_stated():
    rng = np.random.default_rng(0)
    for n in (5, 8, 12, 20):
        covered = 0
        for _ in range(2000):
            lo, hi = median_interval(rng.lognormal(0.0, 0.3, n))
            covered += lo <= 1.0 <= hi  # the lognormal's median is exp(0) = 1
        assert 0.88 <= covered / 2000 <= 0.995, (n, covered)
    assert median_interval([3.0]) == (3.0, 3.0)
    assert median_interval([5, 1, 4, 2, 3]) == (1, 5)


def test_exhaustive_measures_every_config_round_robin_on_its_own():
    g = counted(bowl())
    grid = exhaustive(SPACE, g, rounds=3)
    n = math.prod(len(v) for v in SPACE.values())
    assert grid.measured == n and grid.samples == len(g.calls) == 3 * n
    assert g.calls[:n] == g.calls[n : 2 * n]  # round-robin: each round the whole grid
    assert grid.best == {"ps": 16, "dist": 4, "wpb": 4}


def test_budget_and_failures():
    def broken(c):
        if c["dist"] == 2:
            raise RuntimeError("kernel launch failed")
        return bowl()(c)

    g = counted(broken)
    res = search(SPACE, g, protocol=Protocol(max_configs=8))
    assert res.measured <= 8
    failed = [t for t in res.trace if t["config"]["dist"] == 2]
    assert failed and all(t["latency"] == math.inf and t["samples"] == 1 for t in failed)
    assert math.isfinite(res.best_latency) and res.best["dist"] != 2
    # nothing runs at ps = 1: from the paper's origin the walk still finds the way out
    res = search(SPACE, lambda c: math.inf if c["ps"] == 1 else bowl()(c))
    assert res.start_latency == math.inf and res.best == {"ps": 16, "dist": 4, "wpb": 4}
    res = search(SPACE, bowl(), protocol=Protocol(budget=10))
    assert res.samples <= 10
    with pytest.raises(ValueError, match="no candidate"):
        search({"ps": [], "dist": [1], "wpb": [1]}, bowl())
    with pytest.raises(ValueError, match="min_samples"):
        Protocol(min_samples=5, max_samples=3)


def test_a_tight_budget_never_picks_a_configuration_it_only_glimpsed():
    """A budget that runs out mid-comparison (a training run's epochs) must not leave a
    newly opened configuration with one lucky sample as the pick: every pick has
    ``min_samples`` samples, and configurations are opened only while room is left."""
    space, f = LANDSCAPES["cpu-like"]
    model = shifted_model(space, f, -1)
    for budget in range(3, 31):
        p = Protocol(min_samples=3, max_samples=5, max_configs=10, final_rounds=1, budget=budget)
        for seed in range(5):
            g = counted(noisy(f, 0.2, seed, "spiky"))
            res = search(space, g, model=model, protocol=p)
            n = Counter(tuple(c.values()) for c in g.calls)  # the measurements made
            assert len(g.calls) <= budget
            assert n[tuple(res.best.values())] >= p.min_samples, (budget, seed, res.trace)
            assert min(n.values()) >= p.min_samples, (budget, seed, res.trace)


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
    ranked = rank_configs(space(h100), work, h100)
    feasible = [c for c, est in ranked if est.feasible]
    assert ranked[-1][1].feasible is False and len(feasible) < len(ranked)
    assert model_guess(ranked) == feasible[0]
    with pytest.raises(ValueError, match="unknown GPU"):
        known_gpu("Voodoo 2")


FIG10 = ROOT / "bench" / "results" / "gpu" / "fig10" / "fig10_tuner.json"


@pytest.mark.skipif(not FIG10.exists(), reason="no recorded GPU landscape")
def test_model_ranks_the_recorded_gpu_landscape_as_the_gpu_did():
    """The model against every sample bench/gpu/fig10_tuner.py took on a real GPU (the
    whole grid, 5+ samples each): its ranking follows the measured medians and its guess
    is within 5% of the measured best. The model of 6a516fe fails both (rho 0.08; its
    guess (8, 16, 16) was 1.48x the best)."""
    from scipy.stats import spearmanr

    rec = json.loads(FIG10.read_text())
    times: dict[tuple, list] = {}
    for m in rec["measurements"]:
        times.setdefault((m["ps"], m["dist"], m["wpb"]), []).append(m["ms"])
    measured = {k: float(np.median(v)) for k, v in times.items()}
    assert len(measured) == math.prod(len(v) for v in SPACE.values())
    dev = known_gpu(rec["meta"]["device"])
    ranked = rank_configs(SPACE, Workload(**rec["workload"]), dev, "p2p")
    predicted = {tuple(cfg.values()): est.latency for cfg, est in ranked}
    keys = sorted(measured)
    rho = spearmanr([predicted[k] for k in keys], [measured[k] for k in keys]).statistic
    assert rho > 0.9
    guess = tuple(model_guess(ranked).values())
    assert measured[guess] <= 1.05 * min(measured.values())


def test_model_guess_is_a_reasonable_start_on_a_synthetic_device():
    h100 = known_gpu("H100")
    work = Workload(2_000_000, 6_000_000, 300_000, 16, 50_000)
    guess = model_guess(rank_configs(space(h100), work, h100))
    est = estimate(guess["ps"], guess["dist"], guess["wpb"], work, h100)
    origin = estimate(1, 1, 1, work, h100)
    # feasible, every SM busy with more warps than the origin's, and far ahead of it (the
    # guess may give up some occupancy to 'get' staging for fewer, longer partitions)
    assert est.feasible and est.blocks >= h100.sms
    assert origin.resident_warps_per_sm < h100.max_warps_per_sm  # 1-warp blocks cap it
    assert est.resident_warps_per_sm > origin.resident_warps_per_sm
    assert est.latency < origin.latency / 2
    # p2p kernels need no shared memory: every configuration under the thread limit fits
    ranked = rank_configs(space(h100), work, h100, mode="p2p")
    assert all(est.feasible for _, est in ranked)


def test_trainer_tunes_with_real_training_steps():
    from mgg.graph.generators import planted_partition
    from mgg.job import build_optimizer
    from mgg.prepare import prepare
    from mgg.torch import build_model
    from mgg.train import Trainer

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
        tune_budget=15,
        eval_every=0,
    )
    hist = t.fit(20)
    assert len(hist) == 20  # measured steps are training epochs too
    tuned = [h for h in hist if "config" in h]
    assert len(tuned) == t.tuning["samples"] <= 15 and 2 <= t.tuning["measured"] <= 6
    assert not any("config" in h for h in hist[15:])
    assert sum(h["config"] == t.tuning["best"] for h in tuned) >= 3  # the pick had a median
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

    args = ["mgg", "tune", "rmat:scale=12,ef=8", "--dim", "16", "--out", tmp_path, "--json"]
    r = mpirun(2, *args, "--exhaustive", "--grid-rounds", "3", "--confirm", "5", timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    grid = math.prod(len(v) for v in res["space"].values())
    assert res["start"] == res["model_guess"]  # the model's guess by default
    assert res["measured"] == len(res["trace"]) and 2 <= res["measured"] <= 15 < grid
    assert res["samples"] >= sum(t["samples"] for t in res["trace"]) - 1
    assert all(t["samples"] >= 1 and t["spread"] >= 0 for t in res["trace"])
    assert 0 <= res["noise"] < 1 and 0 <= res["confidence"] <= 1
    assert res["protocol"]["max_configs"] == 15
    assert res["exhaustive_measured"] == grid and res["exhaustive_rounds"] == 3
    # measured afresh, side by side: the tuned pick against the grid's best
    confirmed = res["confirmed_latency_s"]
    assert set(confirmed) == {"start", "default", "model_guess", "tuned", "exhaustive_best"}
    assert res["vs_exhaustive"] == pytest.approx(confirmed["tuned"] / confirmed["exhaustive_best"])
    # how close the pick comes to the grid's best is a speed claim, measured on a quiet
    # machine in bench/tuner.py: on this shared one a rank preempted mid-sample costs a
    # time slice (0.6 ms samples read 3-4 ms) whichever configuration it hits
    measured = [t["config"] for t in res["trace"]]
    assert res["best"] in measured and res["best_latency_s"] > 0 and min(confirmed.values()) > 0
    assert all(res["exhaustive_best"][k] in v for k, v in res["space"].items())
    assert list(tmp_path.glob("*.png")) and list(tmp_path.glob("*-trace.json"))
    r = mpirun(2, *args, "--start", "origin", "--budget", "6", "--max-repeat", "4")
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    assert res["start"] == {"ps": 1, "dist": 1, "threads": 1} and res["measured"] <= 6
    assert all(t["samples"] <= 4 + 2 * 4 for t in res["trace"])
    assert "exhaustive_best" not in res and "vs_exhaustive" not in res


def test_mgg_tune_without_confirmation_reports_the_grid_medians(tmp_path, capsys):
    from mgg.cli import main

    from conftest import last_json

    args = ["tune", "rmat:scale=8,ef=4", "--exhaustive", "--grid-rounds", "2", "--confirm", "0"]
    assert main([*args, "--out", str(tmp_path), "--json"]) == 0
    res = last_json(capsys.readouterr().out)
    # the grid's own medians: its best is the least of them, so nothing lies below it
    assert set(res["confirmed_latency_s"]) == {"start", "default", "model_guess", "tuned"} | {
        "exhaustive_best"
    }
    assert res["vs_exhaustive"] >= 1.0 and res["model_guess_vs_exhaustive"] >= 1.0
    assert res["default_latency_s"] >= res["exhaustive_best_latency_s"]
    # without the grid: only what the search measured (the default may not be)
    args = ["tune", "rmat:scale=8,ef=4", "--budget", "2", "--confirm", "0"]
    assert main([*args, "--out", str(tmp_path), "--json"]) == 0
    res = last_json(capsys.readouterr().out)
    assert set(res["confirmed_latency_s"]) == {"start", "tuned"}
    assert res["default_latency_s"] is None and "vs_exhaustive" not in res


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
        "window": "shm",  # one node: nothing to choose
    }
    assert "window_latency_s" not in res["tuning"]
    r = mpirun(2, *args, "--config", '{"ps": 64, "dist": 2}')
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    assert res["tuning"] is None and res["graph_config"]["ps"] == 64
    assert res["graph_config"]["dist"] == 2


def test_the_driver_measures_the_window_first_within_the_budget_then_walks():
    """drive (mgg tune's and the Trainer's one driver): across nodes it compares the
    windows at the configuration in force, counts those samples in the budget, and every
    sample of the walk then runs in the faster window; with no room for them, none."""
    from mgg.knobs import Knobs
    from mgg.tuner import cpu_device, drive

    dev, work = cpu_device(4), Workload(50_000, 20_000, 4_000, 16, 1_000)
    landscape = bowl((32, 4, 2))
    calls = []

    def measure(cfg):
        calls.append(dict(cfg))
        slow = 1.5 if cfg.get("window") == "rma" else 1.0
        return slow * landscape({"ps": cfg["ps"], "dist": cfg["dist"], "wpb": cfg["threads"]})

    knobs = Knobs(ps=8, dist=2, threads=1)
    protocol = Protocol(min_samples=3, max_samples=4, max_configs=6, budget=30)
    tuned = drive(measure, device=dev, work=work, knobs=knobs, windows=("msg", "rma"),
                  protocol=protocol)  # fmt: skip
    assert tuned.window == "msg" and set(tuned.window_latency) == {"msg", "rma"}
    assert calls[:6] == [
        {"ps": 8, "dist": 2, "threads": 1, "window": w} for w in ["msg", "rma"] * 3
    ]
    assert len(calls) <= 30 and all(c["window"] == "msg" for c in calls[6:])
    assert tuned.best == {**tuned.result.best, "window": "msg"}
    calls.clear()
    tight = Protocol(min_samples=3, max_samples=4, max_configs=6, budget=6)
    tuned = drive(measure, device=dev, work=work, windows=("msg", "rma"), protocol=tight)
    assert tuned.window is None and len(calls) <= 6 and all("window" not in c for c in calls)
    with pytest.raises(ValueError, match="start must be 'model', 'origin' or a configuration"):
        drive(measure, device=dev, work=work, start="guess")
