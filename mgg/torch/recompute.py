"""Recomputation (NGra's): a layer whose intermediate tensors are not kept for the
backward pass but computed again there, with the dropout keys and batch statistics of
the first run."""

from __future__ import annotations

import torch

from .interop import Op


class _Recompute(Op):
    """y = fn(x), keeping only x: fn runs again in the backward pass, with the dropout keys
    and ``module``'s buffers (batch statistics) it had, and its parameters' gradients
    accumulate from there."""

    @staticmethod
    def forward(ctx, x, fn, module, g, *params):
        ctx.fn, ctx.module, ctx.g, ctx.stream = fn, module, g, g.keys.dropout_stream
        if isinstance(x, torch.Tensor):
            ctx.save_for_backward(x)
        else:
            ctx.x = x  # InputRows: no gradient
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, dy):
        x = ctx.saved_tensors[0] if ctx.saved_tensors else ctx.x
        wants = isinstance(x, torch.Tensor) and ctx.needs_input_grad[0]
        if isinstance(x, torch.Tensor):
            x = x.detach().requires_grad_(wants)
        buffers = [b.clone() for b in ctx.module.buffers()]
        keys = ctx.g.keys
        stream, keys.dropout_stream = keys.dropout_stream, ctx.stream
        try:
            try:
                with torch.enable_grad():
                    y = ctx.fn(x)
            finally:
                keys.dropout_stream = stream
            torch.autograd.backward(y, dy)  # first: torch's batch norm saved its buffers
        finally:
            with torch.no_grad():
                for b, saved in zip(ctx.module.buffers(), buffers, strict=True):
                    b.copy_(saved)
        return (
            x.grad if wants else None,
            None,
            None,
            None,
            *[None] * (len(ctx.needs_input_grad) - 4),
        )


def recompute(fn, x, module: torch.nn.Module, g) -> torch.Tensor:
    """``fn(x)`` (x [n, D] or InputRows) whose intermediate tensors are not kept for the
    backward pass but computed again there (NGra's recomputation): a layer's memory falls
    to its input, for one more forward of the layer, aggregation included, per step.
    ``module``: what fn runs (its parameters get their gradients; its buffers are restored
    after the second run)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return _Recompute.apply(x, fn, module, g, *params)
