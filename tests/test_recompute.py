"""--recompute: layers keep only their inputs and run again in the backward pass; the
same dropout masks, batch statistics and gradients, so training is bit for bit the same."""

import pytest
import torch

import mgg.torch as mt
from mgg.graph.specs import resolve
from mgg.job import build_optimizer
from mgg.prepare import prepare
from mgg.torch import MODELS, build_model
from mgg.train import Trainer

from conftest import mpi_runs


def _train(ds, name: str, recompute: bool, layers: int = 2, running: bool = False):
    dg, data = prepare(ds, None, name)
    spec = MODELS[name]
    net = build_model(
        name, data.num_features, data.num_classes, layers=layers, seed=1, recompute=recompute
    )
    if running:  # GIN's norms keeping running statistics, which the second run restores
        for conv in net.convs:
            norms = conv.nn.norms
            for i, norm in enumerate(norms):
                norms[i] = mt.BatchNorm(norm.num_features)
    opt = build_optimizer("adam", net, spec.lr, spec.weight_decay)
    t = Trainer(dg, data, net, opt, eval_every=0)
    t.fit(3)
    return [h["loss"] for h in t.history], list(net.parameters()), list(net.buffers())


@pytest.mark.parametrize("name", list(MODELS))
def test_recomputed_layers_train_bit_for_bit_alike(name):
    ds = resolve("planted:nodes=600,classes=4")
    layers = 3 if name == "gcn" else 2
    kept, again = (_train(ds, name, rc, layers) for rc in (False, True))
    assert kept[0] == again[0], name  # the losses
    for a, b in zip(kept[1] + kept[2], again[1] + again[2], strict=True):
        assert torch.equal(a, b), name  # the weights


def test_recomputed_layers_restore_running_statistics():
    ds = resolve("planted:nodes=600,classes=4")
    kept, again = (_train(ds, "gin", rc, running=True) for rc in (False, True))
    assert kept[0] == again[0]
    assert len(kept[2]) == 6  # running mean, variance and count of two norms
    for a, b in zip(kept[1] + kept[2], again[1] + again[2], strict=True):
        assert torch.equal(a, b)


@pytest.mark.mpi
def test_recompute_across_ranks_gives_the_same_losses():
    args = ["train", "--dataset", "planted:nodes=500,classes=3", "--model", "gat", "--epochs",
            "3", "--json"]  # fmt: skip
    runs = mpi_runs(2, args, [[], ["--recompute"]])
    assert len(runs) == 2 and runs[0]["np"] == 2
    assert runs[0]["losses"] == runs[1]["losses"]
