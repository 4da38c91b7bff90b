"""Layers with explicit forward and backward over the distributed aggregation.

Every layer works on this rank's rows: x [n_local, in]. ``forward(x, g)`` keeps what
``backward(dy)`` needs; ``backward`` accumulates parameter gradients (this rank's share:
the Trainer sums them over ranks) and returns dx, or None when the layer's input needs
no gradient (``input_grad = False``, e.g. the features), which saves an aggregation.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import scipy.sparse as sp

from .backend import is_sparse, on_gpu, to_device, to_host


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

    def to(self, device: str) -> Module:
        """Move every parameter to 'cpu' (numpy) or 'cuda' (cupy); returns self."""
        move = to_device if device == "cuda" else to_host
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

    def _args(self, x):
        key = _key64(self.seed, self.epoch, self.stream)
        threshold = np.uint32(min(int(self.p * 2**32), 2**32 - 1))
        return key, threshold, x.dtype.type(1.0 / (1.0 - self.p))

    def forward(self, x, g):
        self._active = self.training and self.p > 0
        if not self._active:
            return x
        self._lb = g.lb
        key, threshold, scale = self._args(x)
        if on_gpu(x):
            from ..kernels.cuda import nn_ops

            if is_sparse(x):
                return nn_ops.dropout_csr(x, key, g.lb, threshold, scale)
            return nn_ops.dropout_dense(x, key, g.lb, threshold, scale)
        if sp.issparse(x):  # the input features: no backward pass through here
            y = x.copy()
            _dropout_sparse(y.indptr, y.indices, y.data, key, g.lb, x.shape[1], threshold, scale)
            return y
        y = np.empty_like(x)
        _dropout_dense(x, y, key, g.lb, threshold, scale)
        return y

    def backward(self, dy):
        if not self._active:
            return dy
        key, threshold, scale = self._args(dy)
        if on_gpu(dy):
            from ..kernels.cuda import nn_ops

            return nn_ops.dropout_dense(dy, key, self._lb, threshold, scale)
        dx = np.empty_like(dy)
        _dropout_dense(dy, dx, key, self._lb, threshold, scale)
        return dx


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
            y = g.propagate(_matmul(x, self.weight.value), "gcn")
        else:
            self._ax = g.propagate(x, "gcn")
            y = self._ax @ self.weight.value
        if self.bias is not None:
            y += self.bias.value
        return y

    def backward(self, dy):
        g, w = self._g, self.weight.value
        if self.bias is not None:
            self.bias.grad += dy.sum(0)
        if self._first:  # y = Â t, t = x W
            dt = g.propagate(dy, "gcn", transpose=True)
            self.weight.grad += _tmatmul(self._x, dt)
            return dt @ w.T if self.input_grad else None
        # y = a W, a = Â x
        self.weight.grad += self._ax.T @ dy
        if not self.input_grad:
            return None
        return g.propagate(dy @ w.T, "gcn", transpose=True)


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
            h = g.propagate(self._t, "gin", eps=eps) + self.lin1.bias.value
        else:
            self._t = x
            h = self.lin1.forward(g.propagate(x, "gin", eps=eps))
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
            dt = g.propagate(da, "gin", transpose=True, eps=eps)
            self.lin1.weight.grad += _tmatmul(self._x, dt)
            return dt @ self.lin1.weight.value.T if self.input_grad else None
        if not self.input_grad:
            return None
        return g.propagate(da, "gin", transpose=True, eps=eps)


_M64 = 0xFFFFFFFFFFFFFFFF


def _key64(*parts: int) -> np.uint64:
    """A 64-bit key from small integers (splitmix64 over the parts)."""
    k = 0x243F6A8885A308D3
    for p in parts:
        z = (k ^ int(p)) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        k = z ^ (z >> 31)
    return np.uint64(k)


@numba.njit(cache=True, inline="always")
def _mix(z):
    """splitmix64's finalizer: a well-mixed 64-bit value for any counter."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, inline="always")
def _keep(key, row, col, ncols, threshold):
    """Entry (global row, col) survives dropout: a hash of (key, row, col) vs threshold."""
    z = _mix(
        key
        + (np.uint64(row) * np.uint64(ncols) + np.uint64(col) + np.uint64(1))
        * np.uint64(0x9E3779B97F4A7C15)
    )
    return np.uint32(z >> np.uint64(32)) >= threshold


@numba.njit(cache=True, parallel=True)
def _dropout_dense(x, out, key, lb, threshold, scale):
    n, d = x.shape
    for i in numba.prange(n):
        for j in range(d):
            out[i, j] = x[i, j] * scale if _keep(key, lb + i, j, d, threshold) else 0


@numba.njit(cache=True, parallel=True)
def _dropout_sparse(indptr, indices, data, key, lb, ncols, threshold, scale):
    for i in numba.prange(indptr.size - 1):
        for e in range(indptr[i], indptr[i + 1]):
            data[e] = data[e] * scale if _keep(key, lb + i, indices[e], ncols, threshold) else 0
