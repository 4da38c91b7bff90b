"""Layers with explicit forward and backward over the distributed aggregation.

Every layer works on this rank's rows: x [n_local, in]. ``forward(x, g)`` keeps what
``backward(dy)`` needs; ``backward`` accumulates parameter gradients (this rank's share:
the Trainer sums them over ranks) and returns dx, or None when the layer's input needs
no gradient (``input_grad = False``, e.g. the features), which saves an aggregation.
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import backend_of, get_backend, is_sparse
from ..hashing import key64


class Parameter:
    """A trainable array with its gradient. ``decay``: subject to weight decay."""

    __slots__ = ("value", "grad", "decay", "name")

    def __init__(self, value, decay: bool = True, name: str = ""):
        self.value = value
        self.grad = np.zeros_like(value)
        self.decay = decay
        self.name = name

    def __repr__(self):
        return f"Parameter({self.name}, shape={self.value.shape})"


class Module:
    training = True
    input_grad = True

    def children(self) -> list[Module]:
        out = []
        for v in vars(self).values():
            if isinstance(v, Module):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out.extend(m for m in v if isinstance(m, Module))
        return out

    def own_parameters(self) -> list[Parameter]:
        return [v for v in vars(self).values() if isinstance(v, Parameter)]

    def parameters(self) -> list[Parameter]:
        """Every Parameter of this module and its children, in a fixed order."""
        ps = list(self.own_parameters())
        for c in self.children():
            ps.extend(c.parameters())
        return ps

    def named_parameters(self, prefix: str = "") -> dict[str, Parameter]:
        out = {f"{prefix}{k}": v for k, v in vars(self).items() if isinstance(v, Parameter)}
        for k, v in vars(self).items():
            if isinstance(v, Module):
                out.update(v.named_parameters(f"{prefix}{k}."))
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        out.update(m.named_parameters(f"{prefix}{k}.{i}."))
        return out

    def train(self, mode: bool = True) -> Module:
        self.training = mode
        for c in self.children():
            c.train(mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad[...] = 0

    def to(self, backend) -> Module:
        """Move every parameter to ``backend`` ('cpu': numpy, 'cuda': cupy); returns self."""
        move = get_backend(backend).to_device
        for p in self.parameters():
            p.value, p.grad = move(p.value), move(p.grad)
        return self


def glorot(rng: np.random.Generator, fan_in: int, fan_out: int, dtype) -> np.ndarray:
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-a, a, (fan_in, fan_out)).astype(dtype)


def weight_and_bias(rng, in_dim: int, out_dim: int, dtype, decay: bool, bias: bool):
    """Glorot W [in, out] and zero b [out] (None without bias) from ``rng`` (seed 0 if None)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    w = Parameter(glorot(rng, in_dim, out_dim, dtype), decay, "weight")
    return w, (Parameter(np.zeros(out_dim, dtype), decay, "bias") if bias else None)


def _matmul(x, w):
    return x @ w


def _tmatmul(x, dy):
    """x.T @ dy for dense or sparse x, never densifying x."""
    return x.T @ dy


class Linear(Module):
    """y = x W + b.  x [n, in] dense or scipy CSR; W [in, out]; b [out]."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        bias: bool = True,
        rng=None,
        dtype=np.float32,
        decay: bool = True,
    ):
        self.weight, self.bias = weight_and_bias(rng, in_dim, out_dim, dtype, decay, bias)
        self._x = None

    def forward(self, x, g=None):
        self._x = x
        y = _matmul(x, self.weight.value)
        if self.bias is not None:
            y += self.bias.value
        return y

    def backward(self, dy):
        self.weight.grad += _tmatmul(self._x, dy)
        if self.bias is not None:
            self.bias.grad += dy.sum(0)
        return dy @ self.weight.value.T if self.input_grad else None


class ReLU(Module):
    def forward(self, x, g=None):
        self._mask = x > 0
        return x * self._mask

    def backward(self, dy):
        return dy * self._mask


class Dropout(Module):
    """Zero each entry with probability p, scale the rest by 1/(1-p), in training mode.

    Whether entry (v, j) survives depends only on (seed, epoch, stream, global row v, j),
    never on the number of ranks, so a P-rank run draws exactly the masks of the
    single-process run. The mask is recomputed in backward instead of being stored.
    """

    def __init__(self, p: float, *, seed: int = 0, stream: int = 0):
        if not 0 <= p < 1:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p, self.seed, self.stream, self.epoch = p, seed, stream, 0
        self._active = False

    def _args(self, x, lb: int):
        """(key, lb, threshold, scale): the kernels' arguments for this epoch's mask."""
        key = key64(self.seed, self.epoch, self.stream)
        threshold = np.uint32(min(int(self.p * 2**32), 2**32 - 1))
        return key, lb, threshold, x.dtype.type(1.0 / (1.0 - self.p))

    def forward(self, x, g):
        self._active = self.training and self.p > 0
        if not self._active:
            return x
        self._lb = g.lb
        kernels = backend_of(x).nn
        drop = kernels.dropout_csr if is_sparse(x) else kernels.dropout_dense
        return drop(x, *self._args(x, g.lb))

    def backward(self, dy):
        if not self._active:
            return dy
        return backend_of(dy).nn.dropout_dense(dy, *self._args(dy, self._lb))


class GCNConv(Module):
    """Kipf & Welling: y = Â x W + b with Â = D^-1/2 (A+I) D^-1/2 (the 'gcn' weights of
    the graph's plan).  x [n, in] -> y [n, out].

    Aggregates at the smaller width: when out < in (or x is sparse) it transforms first,
    Â(xW), else it aggregates first, (Âx)W; the backward pass mirrors the choice.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        bias: bool = True,
        rng=None,
        dtype=np.float32,
        decay: bool = True,
    ):
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight, self.bias = weight_and_bias(rng, in_dim, out_dim, dtype, decay, bias)

    def transform_first(self, x) -> bool:
        return is_sparse(x) or self.out_dim < self.in_dim

    def forward(self, x, g):
        self._g = g
        self._first = self.transform_first(x)
        if self._first:
            self._x = x
            y = g.aggregate(_matmul(x, self.weight.value), "gcn")
        else:
            self._ax = g.aggregate(x, "gcn")
            y = self._ax @ self.weight.value
        if self.bias is not None:
            y += self.bias.value
        return y

    def backward(self, dy):
        g, w = self._g, self.weight.value
        if self.bias is not None:
            self.bias.grad += dy.sum(0)
        if self._first:  # y = Â t, t = x W
            dt = g.aggregate(dy, "gcn", transpose=True)
            self.weight.grad += _tmatmul(self._x, dt)
            return dt @ w.T if self.input_grad else None
        # y = a W, a = Â x
        self.weight.grad += self._ax.T @ dy
        if not self.input_grad:
            return None
        return g.aggregate(dy @ w.T, "gcn", transpose=True)


class GINConv(Module):
    """Xu et al.: y = MLP((1+eps) x_v + sum_u x_u), MLP = Linear -> ReLU -> Linear.
    x [n, in] -> y [n, out]; eps learnable when ``train_eps``.

    The MLP's first Linear commutes with the aggregation, so when its width is below in
    (or x is sparse) it is applied first and the aggregation runs at the smaller width.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden: int | None = None,
        *,
        eps: float = 0.0,
        train_eps: bool = False,
        rng=None,
        dtype=np.float32,
    ):
        rng = rng if rng is not None else np.random.default_rng(0)
        hidden = hidden or out_dim
        self.in_dim, self.hidden, self.out_dim = in_dim, hidden, out_dim
        self.lin1 = Linear(in_dim, hidden, rng=rng, dtype=dtype)
        self.act = ReLU()
        self.lin2 = Linear(hidden, out_dim, rng=rng, dtype=dtype)
        self.train_eps = train_eps
        self.eps = Parameter(np.array([eps], dtype), False, "eps") if train_eps else None
        self._eps_fixed = eps

    def eps_value(self) -> float:
        return float(self.eps.value[0]) if self.train_eps else self._eps_fixed

    def transform_first(self, x) -> bool:
        return is_sparse(x) or self.hidden < self.in_dim

    def forward(self, x, g):
        self._g = g
        self._first = self.transform_first(x)
        eps = self.eps_value()
        if self._first:
            self._x = x
            self._t = _matmul(x, self.lin1.weight.value)
            h = g.aggregate(self._t, "gin", eps=eps) + self.lin1.bias.value
        else:
            self._t = x
            h = self.lin1.forward(g.aggregate(x, "gin", eps=eps))
        return self.lin2.forward(self.act.forward(h))

    def backward(self, dy):
        g, eps = self._g, self.eps_value()
        dh = self.act.backward(self.lin2.backward(dy))
        if self._first:  # h = (1+eps) t + A t + b1, t = x W1
            self.lin1.bias.grad += dh.sum(0)
            da = dh
        else:  # h = a W1 + b1, a = (1+eps) x + A x
            da = self.lin1.backward(dh)
        if self.train_eps:
            self.eps.grad += (self._t * da).sum()
        if self._first:
            dt = g.aggregate(da, "gin", transpose=True, eps=eps)
            self.lin1.weight.grad += _tmatmul(self._x, dt)
            return dt @ self.lin1.weight.value.T if self.input_grad else None
        if not self.input_grad:
            return None
        return g.aggregate(da, "gin", transpose=True, eps=eps)
