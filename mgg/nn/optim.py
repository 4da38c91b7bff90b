"""Optimizers. They run identically on every rank on already-summed gradients, so the
weights never diverge."""

from __future__ import annotations

import numpy as np

from ..backend import assign
from .layers import Parameter


class Optimizer:
    def __init__(self, params: list[Parameter], lr: float, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        self.params, self.lr, self.weight_decay = list(params), lr, weight_decay
        self.t = 0

    def _grad(self, p: Parameter):
        """The gradient with L2 weight decay added (for parameters marked ``decay``)."""
        if self.weight_decay and p.decay:
            return p.grad + self.weight_decay * p.value
        return p.grad

    def state_dict(self) -> dict:
        return {"t": self.t}

    def load_state_dict(self, state: dict) -> None:
        self.t = int(state["t"])


class SGD(Optimizer):
    """p -= lr * (g + momentum buffer)."""

    def __init__(self, params, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr, weight_decay)
        self.momentum = momentum
        self.buf = [np.zeros_like(p.value) for p in self.params]

    def step(self) -> None:
        self.t += 1
        for p, b in zip(self.params, self.buf, strict=True):
            g = self._grad(p)
            if self.momentum:
                b *= self.momentum
                b += g
                g = b
            p.value -= self.lr * g

    def state_dict(self) -> dict:
        return {"t": self.t, **{f"buf{i}": b for i, b in enumerate(self.buf)}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for i, b in enumerate(self.buf):
            assign(b, state[f"buf{i}"])


class Adam(Optimizer):
    """Kingma & Ba, with L2 weight decay added to the gradient (as Kipf's GCN)."""

    def __init__(
        self,
        params,
        lr: float = 0.01,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr, weight_decay)
        self.b1, self.b2 = betas
        self.eps = eps
        self.m = [np.zeros_like(p.value) for p in self.params]
        self.v = [np.zeros_like(p.value) for p in self.params]

    def step(self) -> None:
        self.t += 1
        c1 = 1 - self.b1**self.t
        c2 = 1 - self.b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            g = self._grad(p)
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p.value -= self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)

    def state_dict(self) -> dict:
        out = {"t": self.t}
        out.update({f"m{i}": m for i, m in enumerate(self.m)})
        out.update({f"v{i}": v for i, v in enumerate(self.v)})
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for i, (m, v) in enumerate(zip(self.m, self.v, strict=True)):
            assign(m, state[f"m{i}"])
            assign(v, state[f"v{i}"])


OPTIMIZERS = {"adam": Adam, "sgd": SGD}
