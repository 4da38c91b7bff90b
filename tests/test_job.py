"""The training job's one home (mgg.job): flags made from its fields, each value checked
once naming its flag, the memory plan's decisions returned as a Job, and a model built
from the Job, never changed after."""

import argparse

import pytest

from mgg.cli.common import job_args
from mgg.errors import InputError
from mgg.footprint import planned
from mgg.graph.generators import planted_partition
from mgg.job import Job
from mgg.prepare import prepare


def _flags(command: str) -> dict:
    p = argparse.ArgumentParser()
    job_args(p, command)
    return {a.dest: a for a in p._actions if a.dest != "help"}


def test_every_command_takes_its_job_flags_with_one_default_and_help():
    train, plan, check = _flags("train"), _flags("plan"), _flags("check")
    assert set(plan) < set(train)
    assert set(check) == {"backend"}
    for name in plan:  # the same flag wherever a command takes it
        assert plan[name].default == train[name].default
        assert plan[name].help == train[name].help
        assert plan[name].choices == train[name].choices
    assert train["backend"].choices == ("cpu", "cuda")
    assert train["optimizer"].default == Job().optimizer == "adam"


@pytest.mark.parametrize(
    "values, words",
    [
        ({"hidden": 0}, "--hidden must be an integer >= 1, got 0"),
        ({"dropout": 1.0}, "--dropout must be a number in [0, 1), got 1.0"),
        ({"lr": float("nan")}, "--lr must be a number > 0"),
        ({"optimizer": "lbfgs"}, "--optimizer must be one of adam, sgd"),
        ({"hiden": 8}, "unknown job parameter 'hiden'"),
        ({"model": "gcn", "heads": 4}, "--heads is an option of --model gat"),
        ({"model": "gat", "output_rows": "labeled"}, "--output-rows labeled: the last layer"),
        ({"model": "nope"}, "unknown model 'nope'"),
    ],
)
def test_a_bad_value_is_refused_naming_its_flag(values, words):
    with pytest.raises((InputError, ValueError)) as e:
        Job.parse(values)
    assert words in str(e.value)


def test_the_plan_returns_the_job_with_what_it_decided():
    job = Job.parse({"model": "sage"})
    out = {"per_rank": [{"device": {}}, {"device": {"stream_rows": 4096, "offload": True}}]}
    assert planned(job, out, 0) == job
    decided = planned(job, out, 1)
    assert (decided.stream_rows, decided.offload) == (4096, True)
    assert (job.stream_rows, job.offload) == (0, False)  # frozen: the given job unchanged
    assert planned(Job.parse({"offload": True}), out, 0).offload  # asked for, kept
    assert planned(job, None, 0) is job


def test_a_model_is_built_from_the_job_and_not_changed_after():
    job = Job.parse({"model": "gcn", "hidden": 12, "recompute": True, "offload": True})
    model = job.build_model(7, 3, seed=0)
    assert (model.recompute, model.offload) == (True, True)
    assert model.convs[0].out_channels == 12
    assert "recompute" not in model.config and "offload" not in model.config
    plain = Job.parse({"model": "gcn"}).build_model(7, 3, seed=0)
    assert (plain.recompute, plain.offload) == (False, False)
    opt = Job.parse({"model": "gcn", "lr": 0.05, "optimizer": "sgd"}).build_optimizer(plain)
    assert type(opt).__name__ == "SGD" and opt.param_groups[0]["lr"] == 0.05


def test_prepare_takes_a_job_or_keywords_not_both():
    ds = planted_partition(60, 3, num_features=5, seed=1)
    job = Job.parse({"model": "gcn"})
    g1, d1 = prepare(ds, None, job)
    g2, d2 = prepare(ds, None, "gcn")
    assert (g1.knobs, g1.design) == (g2.knobs, g2.design)
    assert d1.identity == d2.identity
    with pytest.raises(InputError, match="the Job carries its knobs and parameters; got ps"):
        prepare(ds, None, job, ps=8)
