"""The knobs' one home (mgg.knobs): values refused where they enter, naming the flag or
key and what is allowed; what each backend and design takes; the JSON form; and the flags
of every command, which mean one thing."""

import json
from dataclasses import replace

import numpy as np
import pytest

from mgg.backend import get_backend
from mgg.cli import main
from mgg.distgraph import DistGraph
from mgg.graph.specs import resolve
from mgg.knobs import DEFAULTS, SPECS, KnobError, Knobs, space
from mgg.prepare import prepare
from mgg.tuner import cpu_device, known_gpu

from conftest import last_json, random_graph

PLANTED = "planted:nodes=600,classes=3,degree=6"


@pytest.mark.parametrize(
    "given, message",
    [
        ({"ps": 0}, r"^--ps: must be in \[1, 2147483647\], got 0$"),
        ({"ps": 10**20}, r"^--ps: must be in \[1, 2147483647\], got 100000000000000000000$"),
        (
            {"ps": 9 * 10**60},
            r"^--ps: must be in \[1, 2147483647\], got 9" + "0" * 36 + r"\.\.\.$",  # cut
        ),
        ({"dist": 2**31}, r"^--dist: must be in \[1, 2147483647\], got 2147483648$"),
        ({"ps": 2.5}, r"^--ps: must be an integer in \[1, 2147483647\], got 2.5$"),
        ({"dist": True}, r"^--dist: must be an integer in \[1, 2147483647\], got True$"),
        ({"wpb": 33}, r"^--wpb: must be in \[1, 32\], got 33$"),
        ({"threads": 10**6}, r"^--threads: must be in \[1, \d+\], got 1000000$"),
        ({"window": "ssh"}, r"^--window: must be one of shm, rma, msg or auto, got 'ssh'$"),
        ({"split": "halves"}, r"^--split: must be one of edges, nodes, mixed, got 'halves'$"),
        ({"remote": "dma"}, r"^--remote: must be one of p2p, get or auto, got 'dma'$"),
        ({"layers": 3}, r"^--layers is not a knob; the knobs are ps, dist, wpb, threads, "),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag_and_what_is_allowed(given, message):
    with pytest.raises(KnobError, match=message):
        Knobs.parse(given, label=lambda k: f"--{k}")


def test_a_value_enters_once_and_is_remembered_as_given():
    k = Knobs.parse({"ps": np.int64(8), "window": "rma", "dist": None})
    assert (k.ps, k.window, k.dist) == (8, "rma", DEFAULTS.dist)
    assert type(k.ps) is int and k.given == {"ps", "window"}
    assert replace(k, window="shm").given == {"ps", "window"}  # resolved, not given
    assert Knobs.parse({"split": "mixed"}, base=k).given == {"ps", "window", "split"}
    assert Knobs().given == set() and Knobs(wpb=8).given == {"wpb"}
    with pytest.raises(KnobError, match="^wpb: must be in"):
        Knobs(wpb=0)


def test_each_backend_and_design_takes_its_own_knobs():
    cpu, cuda = get_backend("cpu"), get_backend("cuda")
    assert cpu.takes("pipelined") == (
        "ps", "dist", "threads", "window", "split", "dtype", "order",
    )  # fmt: skip
    assert cpu.takes("bulk_halo") == ("ps", "threads", "window", "split", "dtype", "order")
    assert cpu.takes("bulk_halo", "pipelined") == cpu.takes("pipelined")
    assert cuda.takes("pipelined") == ("ps", "dist", "wpb", "split", "remote", "dtype", "order")
    for backend, knob in ((cpu, "wpb"), (cpu, "remote"), (cuda, "window"), (cuda, "threads")):
        with pytest.raises(KnobError, match=f"^{knob} is not a knob of the pipelined design"):
            Knobs.parse(
                {knob: _a_value(knob)},
                takes=backend.takes("pipelined"),
                job=backend.job("pipelined"),
            )
    with pytest.raises(KnobError, match="dist is not a knob of the bulk_halo design on cpu"):
        prepare(resolve(PLANTED), None, "gcn", design="bulk_halo", dist=2)


def _a_value(knob):
    spec = SPECS[knob]
    return spec.choices[0] if spec.choices else spec.low


def test_the_json_form_round_trips_and_names_its_keys(rng):
    for _ in range(20):
        k = Knobs(
            ps=int(rng.integers(1, 300)),
            dist=int(rng.integers(1, 20)),
            wpb=int(rng.integers(1, 33)),
            window=rng.choice([None, "shm", "rma", "msg"]),
            split=str(rng.choice(["edges", "nodes", "mixed"])),
            remote=rng.choice([None, "p2p", "get"]),
        )
        back = Knobs.from_json(json.dumps(k.to_json()))
        assert back == k and back.to_json() == k.to_json()
    with pytest.raises(KnobError, match=r"^x.json key 'ps': must be in \[1, 2147483647\], got -4$"):
        Knobs.from_json('{"ps": -4}', source="x.json")
    with pytest.raises(
        KnobError, match=r"^x.json key 'ps': must be in \[1, 2147483647\], got 1000"
    ):
        Knobs.from_json('{"ps": 100000000000000000000}', source="x.json")
    with pytest.raises(KnobError, match=r"^x.json: not JSON mgg reads \(Exceeds the limit"):
        Knobs.from_json('{"ps": %s}' % ("9" * 5000), source="x.json")
    with pytest.raises(KnobError, match=r"^--config: knobs are a JSON object"):
        Knobs.from_json("[16]")


def test_the_search_space_is_the_papers_per_device():
    h100 = known_gpu("H100")
    assert space(h100) == {
        "ps": [1, 2, 4, 8, 16, 32],
        "dist": [1, 2, 4, 8, 16],
        "wpb": [1, 2, 4, 8, 16],
    }
    six = space(cpu_device(6))
    assert six["threads"] == [1, 2, 4] and six["ps"][-1] == 128
    assert DEFAULTS.point(six) == {"ps": DEFAULTS.ps, "dist": DEFAULTS.dist, "threads": 4}
    assert Knobs(threads=1).point(six)["threads"] == 1


def test_distgraph_takes_knobs_and_rebuilds_only_what_changed(rng):
    g = random_graph(rng, 60, 400)
    dg = DistGraph.build(g, None, ps=3, split="mixed")
    assert dg.plan.ps == 3 and dg.knobs.split == "mixed" and dg.config["ps"] == 3
    plan = dg.plan
    dg.configure(dist=2)
    assert dg.plan is plan and dg.knobs.dist == 2
    dg.configure(ps=5)
    assert dg.plan.ps == 5 and dg.plan.local_indices is plan.local_indices  # CSRs kept
    dg.configure(Knobs(dist=3))  # what a Knobs was given; the rest stays
    assert (dg.plan.ps, dg.knobs.dist, dg.knobs.split) == (5, 3, "mixed")
    with pytest.raises(KnobError, match="wpb is not a knob of the pipelined design on cpu"):
        dg.configure(wpb=2)
    with pytest.raises(ValueError, match="split 'nodes': this graph was partitioned with split"):
        dg.configure(split="nodes")
    with pytest.raises(ValueError, match="order 'rcm': this graph was partitioned with order"):
        dg.configure(order="rcm")
    other = DistGraph(plan, None, knobs=Knobs(ps=7))
    assert other.plan.ps == 7 and other.plan.local_indptr is plan.local_indptr


def test_the_old_spelling_of_a_flag_warns_and_means_the_new_one(capsys, monkeypatch):
    monkeypatch.setenv("MGG_PROGRESS", "0")
    base = ["partition", "rmat:scale=9,ef=6", "--np", "3", "--json"]
    assert main([*base, "--split", "nodes"]) == 0
    new = capsys.readouterr()
    assert main([*base, "--mode", "nodes"]) == 0
    old = capsys.readouterr()
    assert "--mode is deprecated: it is --split now" in old.err and not new.err
    assert last_json(old.out)["digests"] == last_json(new.out)["digests"]
    assert main([*base]) == 0
    edges = last_json(capsys.readouterr().out)
    assert edges["nodes_per_rank"] != last_json(new.out)["nodes_per_rank"]


def test_tuned_knobs_are_a_config_that_training_takes(tmp_path, capsys, monkeypatch):
    """mgg tune writes the pick as STEM-knobs.json; mgg train --config FILE runs with it."""
    monkeypatch.setenv("MGG_PROGRESS", "0")
    out = tmp_path / "t"
    args = ["tune", PLANTED, "--budget", "3", "--repeat", "2", "--max-repeat", "2"]
    assert main([*args, "--confirm", "0", "--out", str(out), "--json"]) == 0
    res = last_json(capsys.readouterr().out)
    path = res["config_file"]
    tuned = json.loads(open(path).read())
    assert tuned == {k: res["best"].get(k, v) for k, v in tuned.items()}
    assert set(tuned) == {"ps", "dist", "threads", "window"}
    assert main(["train", "--dataset", PLANTED, "--epochs", "1", "--config", path, "--json"]) == 0
    got = last_json(capsys.readouterr().out)["graph_config"]
    assert {k: got[k] for k in ("ps", "dist", "threads")} == {
        k: tuned[k] for k in ("ps", "dist", "threads")
    }
    other = 2 if tuned["ps"] != 2 else 4
    argv = ["train", "--dataset", PLANTED, "--epochs", "1", "--config", path, "--ps", str(other)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--ps {other} and --config's ps {tuned['ps']} disagree" in err


def test_every_integer_flag_of_every_command_has_a_range():
    """An integer flag refuses a value past its range where argparse parses it (numpy or
    numba would overflow on it later), naming the range; --ps and --dist included."""
    import argparse

    from mgg.cli import parser

    huge, seen = str(10**20), []
    subs = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, sub in subs.choices.items():
        for action in sub._actions:
            if not callable(action.type):
                continue
            try:
                value = action.type(huge)
            except argparse.ArgumentTypeError as e:
                if "must be in [" in str(e):
                    seen.append((command, action.option_strings[0]))
                    assert str(e).endswith(f"], got {huge}"), (command, action, e)
                continue
            assert not isinstance(value, int), (command, action.option_strings, value)
    flags = {f for _, f in seen}
    assert {"--ps", "--dist", "--seed", "--epochs", "--dim", "--np", "--hidden"} <= flags, flags
    assert ("train", "--seed") in seen and ("check", "--seed") in seen
