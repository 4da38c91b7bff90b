"""`mgg demo` (make demo): `mgg train` with the demo's defaults, a GCN on a generated
250,000-node graph with learnable labels."""

from __future__ import annotations

from .train import main, train_args

__all__ = ["add", "main"]


def add(sub):
    s = sub.add_parser("demo", help="4-rank GCN training on a generated graph (make demo)")
    train_args(
        s, dataset="planted:nodes=250000,classes=8,degree=12,features=32", epochs=40, eval_every=5
    )
    return s
