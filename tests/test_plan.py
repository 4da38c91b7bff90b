"""`mgg plan`: a job's bytes per rank, part by part, before anything is allocated; a
generated graph planned from its spec alone; fixes that do fit."""

import json

import pytest

from mgg.cli import main
from mgg.footprint import plan as memory_plan
from mgg.graph.facts import job_facts
from mgg.graph.specs import resolve
from mgg.memory import LIMIT_ENV
from mgg.torch import MODELS

from conftest import last_json


def plan(capsys, *args) -> dict:
    assert main(["plan", *map(str, args), "--json"]) == 0
    return last_json(capsys.readouterr().out)


def test_a_spec_is_planned_as_the_graph_it_makes(capsys):
    """papers100m and a stand-in planned from their specs (nothing drawn) as the datasets
    they make, read and planned: within the few % the draws overshoot."""
    for spec in ("papers100m:scale=0.0002", "products:scale=0.002"):
        fast = plan(capsys, spec, "--np", 2, "--host-memory", "1T")
        ds = resolve(spec)
        slow = memory_plan(job_facts(ds), 2, budget={"host": 2**40}, model=MODELS["gcn"])
        assert len(fast["per_rank"]) == 2 and fast["fits"]
        for a, b in zip(fast["per_rank"], slow["per_rank"], strict=True):
            assert a["rows"] == b["rows"]
            assert 0.97 <= a["total_bytes"] / b["total_bytes"] <= 1.01, (spec, a, b)
            assert set(a["parts"]) == set(b["parts"])
            for k in ("dataset", "activations"):  # the features, classes and labeled rows
                assert 0.97 <= a["parts"][k] / b["parts"][k] <= 1.01, (spec, k)


def test_papers100m_at_scale_one_is_planned_without_being_drawn(capsys, monkeypatch):
    monkeypatch.setenv(LIMIT_ENV, "4G")  # drawing it would be refused; planning it is not
    out = plan(capsys, "papers100m", "--np", 8, "--backend", "cuda", "--sharded")
    assert out["graph"] == "papers100m" and len(out["per_rank"]) == 8
    rows = [r["rows"] for r in out["per_rank"]]
    assert sum(rows) == 111_059_956 and max(rows) - min(rows) <= 1
    gpu = out["per_rank"][0]["device"]
    assert gpu["total_bytes"] == sum(gpu["parts"].values())
    assert gpu["parts"]["activations"] > gpu["parts"]["model"]
    host = out["per_rank"][0]
    assert "activations" not in host["parts"]  # a cuda rank's host holds data and plan
    assert out["budget"]["device"] == 80 * 2**30  # no GPU here: an H100's, said so
    assert "assumed" in out["budget_how"]["device"]


def test_every_fix_it_names_fits_and_the_plan_refuses_without_one(capsys):
    base = ["planted:nodes=60000,classes=8", "--np", 2, "--hidden", 512]
    tight = plan(
        capsys, *base, "--host-memory", "900M"
    )  # compile 296 MiB counted: at 600M nothing fits
    assert not tight["fits"] and tight["fixes"], tight["fixes"]

    def fits(flag, value) -> bool:
        args = list(base)
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
        return plan(capsys, *args, "--host-memory", "900M")["fits"]

    for fix in tight["fixes"]:
        assert fits(*fix.split()), fix
        if fix.startswith("--hidden"):  # the widest that fits: twice as wide does not
            assert int(fix.split()[1]) < 512 and not fits("--hidden", 2 * int(fix.split()[1]))
    if "--dtype bfloat16" not in tight["fixes"]:
        assert not fits("--dtype", "bfloat16")
    assert main(["plan", *map(str, base), "--host-memory", "900M"]) == 0
    text = capsys.readouterr().out
    assert "does not fit; it would with" in text and "activations" in text


def test_a_sharded_dataset_is_planned_by_its_own_split(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["partition", "planted:nodes=3000,classes=4", "--np", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    bounds = json.loads((out / "manifest.json").read_text())["bounds"]
    got = plan(capsys, out, "--np", 3)
    assert [r["rows"] for r in got["per_rank"]] == [
        b - a for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    assert (
        got["per_rank"][0]["parts"]["dataset"]
        < plan(capsys, "planted:nodes=3000,classes=4", "--np", 3)["per_rank"][0]["parts"]["dataset"]
    )  # a shard, not the whole dataset
    assert main(["plan", str(out), "--np", "2"]) == 2
    assert "partitioned for 3 ranks, not --np 2" in capsys.readouterr().err


def test_train_plans_what_mgg_plan_says(capsys):
    spec = "planted:nodes=5000,classes=6"
    for model in ("gcn", "gat"):
        args = ["--model", model, "--hidden", "32"]
        assert main(["train", "--dataset", spec, "--epochs", "1", *args, "--json"]) == 0
        trained = last_json(capsys.readouterr().out)
        planned = plan(capsys, spec, "--np", 1, *args, "--host-memory", "1T")
        assert trained["planned_bytes"] == planned["per_rank"][0]["total_bytes"], model
        assert trained["peak_bytes"] > 0


def test_bad_flags_are_one_line_naming_mgg_plan(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "papers100m", "--host-memory", "12X"])
    assert e.value.code == 2
    assert "argument --host-memory: expected a size like 2G" in capsys.readouterr().err
    assert main(["plan", "papers100m", "--model", "foo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mgg plan: error: unknown model 'foo'; choose one of gcn, sage, gin, gat"]


def test_a_rank_that_returns_freed_memory_is_planned_for_it_and_wider_is_never_smaller():
    """Past RETURN_ABOVE bytes of activations a rank gives freed blocks back
    (mgg.process.fit_allocator) and holds a calibrated share of them; the plan grows with
    the hidden width on both sides of that line."""
    from mgg.footprint import estimate
    from mgg.footprint.estimate import RETURN_ABOVE

    totals, returns = [], []
    for hidden in range(16, 2049, 16):
        part = estimate(200_000, 4_000_000, 2, hidden=hidden, features=128, classes=40)
        totals.append(part["total"])
        returns.append(part.returns_freed)
        assert not part.returns_freed or part["activations"] >= RETURN_ABOVE
    assert not returns[0] and returns[-1]
    assert all(b >= a for a, b in zip(totals, totals[1:], strict=False))
