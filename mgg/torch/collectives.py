"""Reductions across the ranks, and the gradient sync: every rank's parameters get the
average of the ranks' gradients (DistributedDataParallel's contract), so any torch.optim
optimizer takes the same step on every rank. ``sync_gradients`` averages on call;
``GradSync`` at the end of each backward pass that reached a global value (mgg.torch.Rows)
or a DistributedModel's output."""

from __future__ import annotations

import numpy as np
import torch

from ..arrays import array_module, to_host
from ..errors import InputError
from .checks import check_graph
from .interop import Op, as_array, as_tensor


def _allreduce(comm, a):
    """a (numpy or cupy) summed over the ranks (on the host: MPI is not CUDA-aware), on
    a's device."""
    return array_module(a).asarray(comm.allreduce(np.ascontiguousarray(to_host(a))))


class _AllReduce(Op):
    @staticmethod
    def forward(ctx, t, comm):
        ctx.comm = comm
        return as_tensor(_allreduce(comm, as_array(t)))

    @staticmethod
    def backward(ctx, dt):
        return as_tensor(_allreduce(ctx.comm, as_array(dt))), None


def all_reduce(t: torch.Tensor, g) -> torch.Tensor:
    """The sum of ``t`` over the ranks of the job (differentiable: every rank's share of
    the loss depends on the sum, so the gradient is summed the same way)."""
    check_graph(g, "all_reduce")
    if g.comm is None or g.size == 1:
        return t
    return _AllReduce.apply(t, g.comm)


def allreduce_flat(comm, tensors, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Each tensor summed over the ranks, all in one allreduce of a flat buffer (in
    ``dtype``, default the first tensor's); each back in its shape, dtype and device."""
    dtype = tensors[0].dtype if dtype is None else dtype
    flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])
    total = as_tensor(_allreduce(comm, as_array(flat)))
    out, i = [], 0
    for t in tensors:
        k = t.numel()
        out.append(total[i : i + k].view_as(t).to(t.device, t.dtype).clone())
        i += k
    return out


def sync_gradients(params, comm) -> None:
    """Average every parameter's gradient over the ranks (DistributedDataParallel's
    contract), in one flat buffer (a parameter without a gradient counts as zeros), so any
    torch.optim optimizer then takes the same step on every rank. Call it between
    ``loss.backward()`` and ``optimizer.step()``. A loss that sums the ranks' parts (each
    over its rank's rows) gets its gradient where each rank backpropagates P x its part."""
    params = [p for p in params if p.requires_grad]
    if comm is None or comm.size == 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for p, total in zip(params, allreduce_flat(comm, grads), strict=True):
        p.grad = total / comm.size


class GradSync:
    """The gradient sync at the end of a backward pass, held by the graph whose dropout
    keys the pass advances (``g.keys.grad_sync``): the parameters the pass reached, each
    with its gradient before the pass, and whether the sync is queued."""

    def __init__(self):
        self.before: dict = {}  # parameter -> its gradient before this pass (None: none)
        self.queued = False

    @staticmethod
    def of(g) -> GradSync:
        """The sync of g's backward passes (its keys' graph's), made on first use."""
        keys = g.keys
        if keys.grad_sync is None:
            keys.grad_sync = GradSync()
        return keys.grad_sync

    def queue(self, g, params) -> None:
        """Remember ``params`` (with their gradients before this pass) for the sync at the
        end of this backward pass, and queue that sync once."""
        for p in params:
            if p not in self.before:
                self.before[p] = None if p.grad is None else p.grad.detach().clone()
        if not self.queued:
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self.run(g))

    def run(self, g) -> None:
        """End of a backward pass: average what it added to the parameters' gradients over
        the ranks, so every rank steps alike (a leaf that is no nn.Parameter, such as input
        rows, keeps its own rows' gradient), and advance the dropout step."""
        before, self.before, self.queued = self.before, {}, False
        keys = g.keys
        keys.step, keys.dropout_stream = keys.step + 1, 0
        if g.comm is None or g.size == 1 or not before:
            return
        for t in [t for t in before if not isinstance(t, torch.nn.Parameter)]:
            b = before.pop(t)  # a rank's own rows (an input that requires grad): its share
            if t.grad is not None:  # came back P-fold (the global value's rule): undone
                t.grad = (t.grad - b) / g.size + b if b is not None else t.grad / g.size
        if not before:
            return
        params = list(before)
        added = [
            torch.zeros_like(p) if p.grad is None else p.grad - b if b is not None else p.grad
            for p, b in zip(params, before.values(), strict=True)
        ]
        *sums, sig = allreduce_flat(g.comm, [*(a.double() for a in added), _signature(params)])
        if not torch.equal(sig, _signature(params) * g.size):
            raise InputError(
                "the ranks' backward passes reached different parameters (the ranks built "
                "different models or losses): every rank must run the same model on its rows"
            )
        for p, b, total in zip(params, before.values(), sums, strict=True):
            mean = (total / g.size).to(p.device, p.dtype)
            p.grad = mean if b is None else b + mean


def _signature(params) -> torch.Tensor:
    return torch.tensor(
        [float(len(params)), float(sum(p.numel() for p in params))], dtype=torch.float64
    )
