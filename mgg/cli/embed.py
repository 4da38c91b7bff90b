"""`mgg embed`: every node's embedding, the output of one layer of a model that `mgg train
--save` wrote (default: its last hidden layer), full-graph at any rank count; run by
`mgg predict`'s main (cli/predict.py)."""

from __future__ import annotations

from .common import integer
from .predict import inference_args, main

__all__ = ["add", "main"]


def add(sub):
    s = sub.add_parser("embed", help="every node's embedding from a saved model (mggrun)")
    inference_args(s, "embed")
    s.add_argument(
        "--layer",
        type=integer(1),
        default=None,
        help="the layer whose output to write, 1..L (default: L-1, the last hidden one); "
        "--dtype bfloat16 writes bf16",
    )
    return s
