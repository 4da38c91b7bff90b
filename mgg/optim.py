"""Adam and SGD for ``mgg train``: torch's fused kernels (``torch._fused_adam_``,
``torch._fused_sgd_``, CPU and CUDA) behind torch.optim's interface — ``param_groups``,
``state``, ``step``, ``zero_grad``, ``state_dict``, ``load_state_dict`` — with the same
numbers and the same state dicts as ``torch.optim.Adam(fused=True)`` and
``torch.optim.SGD(fused=True)``, so checkpoints of either read into the other.

Why not torch.optim itself: its first step (and its constructor) imports torch._dynamo
to opt out of torch.compile, which costs every rank 1-2 s of start-up and 67 MB.
"""

from __future__ import annotations

import torch

__all__ = ["Adam", "SGD"]


class _Fused:
    """What the two share: parameter groups over ``DEFAULTS``, state keyed by parameter."""

    DEFAULTS: dict = {}

    def __init__(self, params, **hyper):
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.defaults = {**self.DEFAULTS, **hyper}
        self.param_groups = [{**self.defaults, **g, "params": list(g["params"])} for g in groups]
        self.state: dict[torch.Tensor, dict] = {}
        for p in self.params():
            if not p.is_floating_point():
                raise ValueError(f"{type(self).__name__} takes floating-point parameters")

    def params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    def state_dict(self) -> dict:
        """torch.optim's form: state by parameter index, groups with the indices."""
        index = {id(p): i for i, p in enumerate(self.params())}
        groups, start = [], 0
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"}})
            groups[-1]["params"] = list(range(start, start + len(g["params"])))
            start += len(g["params"])
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """The groups' hyperparameters and the state, cast to each parameter's device and
        dtype (``step`` stays float32), copied."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the state dict's parameter groups do not match this optimizer's")
        params = self.params()
        for mine, theirs in zip(self.param_groups, groups, strict=True):
            mine.update({k: v for k, v in theirs.items() if k != "params"})
        self.state = {}
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            self.state[p] = {
                k: v.to(p.device, torch.float32 if k == "step" else p.dtype, copy=True)
                if isinstance(v, torch.Tensor)
                else v
                for k, v in s.items()
            }

    @torch.no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            ps = [p for p in g["params"] if p.grad is not None]
            if ps:
                self._step(g, ps, [p.grad for p in ps])


class Adam(_Fused):
    """torch.optim.Adam(fused=True) without amsgrad."""

    DEFAULTS = {
        "lr": 1e-3,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "amsgrad": False,
        "maximize": False,
        "foreach": None,
        "capturable": False,
        "differentiable": False,
        "fused": True,
        "decoupled_weight_decay": False,
    }

    def _step(self, g, ps, grads) -> None:
        if g["amsgrad"]:
            raise ValueError("mgg.optim.Adam has no amsgrad")
        for p in ps:
            if not self.state.get(p):
                self.state[p] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
        states = [self.state[p] for p in ps]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        fused = torch._fused_adamw_ if g["decoupled_weight_decay"] else torch._fused_adam_
        fused(
            ps,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            steps,
            amsgrad=False,
            lr=g["lr"],
            beta1=g["betas"][0],
            beta2=g["betas"][1],
            weight_decay=g["weight_decay"],
            eps=g["eps"],
            maximize=g["maximize"],
            grad_scale=None,
            found_inf=None,
        )


class SGD(_Fused):
    """torch.optim.SGD(fused=True); with momentum, its buffers are the state."""

    DEFAULTS = {
        "lr": 1e-3,
        "momentum": 0.0,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
        "maximize": False,
        "foreach": None,
        "differentiable": False,
        "fused": True,
    }

    def _step(self, g, ps, grads) -> None:
        buffers = []
        first = False
        if g["momentum"] != 0:
            first = all("momentum_buffer" not in self.state.get(p, {}) for p in ps)
            for p in ps:
                s = self.state.setdefault(p, {})
                if "momentum_buffer" not in s:
                    s["momentum_buffer"] = torch.empty_like(p)
                buffers.append(s["momentum_buffer"])
        torch._fused_sgd_(
            ps,
            grads,
            buffers,
            weight_decay=g["weight_decay"],
            momentum=g["momentum"],
            lr=g["lr"],
            dampening=g["dampening"],
            nesterov=g["nesterov"],
            maximize=g["maximize"],
            is_first_step=first,
            grad_scale=None,
            found_inf=None,
        )
