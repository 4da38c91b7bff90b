"""mgg.optim: torch's fused Adam and SGD without torch.optim (whose first use imports
torch._dynamo): the same parameters after every step and the same state dicts, both ways."""

import subprocess
import sys

import pytest
import torch

from mgg import optim

KINDS = [
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "decoupled_weight_decay": True}),
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
]


def _params():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).requires_grad_(True) for s in ((7, 5), (5,))]


def _steps(opt, params, steps: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def _groups(params):  # as GCN's: weight decay on the first group only
    return [{"params": [params[0]], "weight_decay": 5e-4}, {"params": [params[1]]}]


@pytest.mark.parametrize(("name", "kw"), KINDS)
def test_each_step_equals_torch_fused_and_state_dicts_cross(name, kw):
    mine_p, theirs_p = _params(), _params()
    mine = getattr(optim, name)(_groups(mine_p), **kw)
    theirs = getattr(torch.optim, name)(_groups(theirs_p), fused=True, **kw)
    for seed in (1, 2, 3):
        _steps(mine, mine_p, 2, seed)
        _steps(theirs, theirs_p, 2, seed)
        for a, b in zip(mine_p, theirs_p, strict=True):
            assert torch.equal(a, b), (name, kw, seed)
    a, b = mine.state_dict(), theirs.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys()
        for k, v in a["state"][i].items():
            assert torch.equal(v, b["state"][i][k]), (i, k)
    # torch's state continues in mine and mine in torch's: the same next step
    again_p, back_p = ([p.detach().clone().requires_grad_(True) for p in mine_p] for _ in "ab")
    again = getattr(optim, name)(_groups(again_p), **kw)
    again.load_state_dict(b)
    back = getattr(torch.optim, name)(_groups(back_p), fused=True, **kw)
    back.load_state_dict(a)
    _steps(again, again_p, 1, 9)
    _steps(back, back_p, 1, 9)
    _steps(theirs, theirs_p, 1, 9)
    for x, y, z in zip(again_p, back_p, theirs_p, strict=True):
        assert torch.equal(x, z) and torch.equal(y, z)


def test_a_state_dict_of_other_groups_is_refused():
    p = _params()
    with pytest.raises(ValueError, match="parameter groups do not match"):
        optim.Adam(_groups(p)).load_state_dict(optim.Adam(p).state_dict())
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([])


def test_mgg_train_never_imports_torch_dynamo():
    code = (
        "import sys\nfrom mgg.cli import main\n"
        "assert main(['train', '--dataset', 'planted:nodes=200,classes=2', '--epochs', '2',"
        " '--json']) == 0\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "False", out.stdout
