"""Row precision: the dtype node rows are stored, exchanged and aggregated in.

``float32``, or ``bfloat16``: rows (features, layer inputs and outputs, symmetric buffers,
halo rows, messages) in bf16, summed in float32 and rounded once, to nearest even, on
store; weights, optimizer state, losses, softmax and batch statistics stay float32. On
the host a bf16 array has ml_dtypes' numpy dtype (``BF16``); where a library has no bf16
(numba, MPI, cupy) it goes as its 16-bit words, ``uint16`` (:func:`bits`).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from .errors import InputError

DTYPES = ("float32", "bfloat16")  # the values of the dtype knob
BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
# the smallest magnitude that rounds to inf in bf16: max plus half its last step
BF16_OVERFLOW = BF16_MAX + float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps) * 2.0**127 / 2


def row_dtype(dtype) -> np.dtype:
    """The numpy dtype of rows of ``dtype`` (a knob's name, a numpy or torch dtype);
    TypeError for anything else."""
    if isinstance(dtype, str) or type(dtype).__module__ == "torch":
        text = str(dtype).removeprefix("torch.")
        return BF16 if text in ("bfloat16", "bf16") else np.dtype(text)
    return np.dtype(dtype)


def name(dtype) -> str:
    """The knob's name of a row dtype: 'float32' or 'bfloat16' (else numpy's name)."""
    d = row_dtype(dtype)
    return "bfloat16" if d == BF16 else d.name


def is_bf16(dtype) -> bool:
    return row_dtype(dtype) == BF16


def accumulator(dtype) -> np.dtype:
    """What rows of ``dtype`` are summed in: float32 for bf16, else the dtype itself."""
    d = row_dtype(dtype)
    return np.dtype(np.float32) if d == BF16 else d


def storage(dtype) -> np.dtype:
    """The dtype a library without bf16 holds rows of ``dtype`` in: uint16 for bf16."""
    d = row_dtype(dtype)
    return np.dtype(np.uint16) if d == BF16 else d


def bits(a):
    """a as numba, MPI and cupy take it: a bf16 array's 16-bit words (a view), else a."""
    return a.view(np.uint16) if a.dtype == BF16 else a


def as_rows(x, dtype, what: str):
    """Features x [n, F] as rows of ``dtype``: dense ones converted (bf16: range-checked,
    naming ``what``, and rounded to nearest even); sparse ones stay float32 (scipy has no
    bf16; the first layer's product with them is float32, rounded on aggregation)."""
    if x is None or hasattr(x, "tocsr"):
        return x
    check_range(x, what, dtype)
    return np.asarray(x).astype(row_dtype(dtype), copy=False)


def holds_bf16(a) -> bool:
    """Whether array a holds bf16 rows: BF16 (numpy), or their uint16 words (cupy, which
    has no bf16; mgg holds no other uint16 rows)."""
    return a.dtype in (BF16, np.uint16)


def from_storage(a, dtype):
    """Rows of ``dtype`` held as ``storage(dtype)`` (a GPU's uint16 words, on the host)
    seen as ``dtype`` again: a view."""
    d = row_dtype(dtype)
    return a.view(BF16) if d == BF16 and a.dtype == np.uint16 else a


def torch_dtype(dtype):
    """The torch dtype of rows of ``dtype``."""
    return _torch_dtype(row_dtype(dtype))


@functools.cache
def _torch_dtype(d: np.dtype):
    import torch

    return torch.bfloat16 if d == BF16 else torch.from_numpy(np.empty(0, d)).dtype


def check_range(x, what: str, dtype) -> None:
    """InputError naming ``what`` and its largest value when x (dense or scipy.sparse,
    float) holds a finite value that ``dtype`` rounds to inf (bf16: beyond about 3.39e38)."""
    data = x.data if hasattr(x, "tocsr") else np.asarray(x)
    if not is_bf16(dtype) or data.dtype == BF16 or data.size == 0:  # bf16 holds bf16
        return
    finite = np.isfinite(data)
    if not finite.all():
        data = data[finite]
    top = max(float(data.max(initial=0)), -float(data.min(initial=0)))  # no |data| copy
    if top >= BF16_OVERFLOW:
        raise InputError(
            f"{what}: values up to {top:.4g} in magnitude are beyond bfloat16's range "
            f"(largest {BF16_MAX:.4g}): they would become inf; scale them (--row-normalize) "
            "or use --dtype float32"
        )


__all__ = [
    "BF16",
    "BF16_MAX",
    "DTYPES",
    "accumulator",
    "as_rows",
    "bits",
    "check_range",
    "from_storage",
    "holds_bf16",
    "is_bf16",
    "name",
    "row_dtype",
    "storage",
    "torch_dtype",
]
