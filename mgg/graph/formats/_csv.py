"""Rows of comma-separated numbers (plain or gzip), parsed in chunks by a numba kernel.

The file is read in blocks of whole lines (as the edge list reader does); each block is
parsed in a worker thread straight into its rows of one preallocated array, so memory stays
at the output plus a few blocks. Decimal text becomes float64 correctly rounded for up to 15
significant digits and |exponent| <= 22 (Clinger's fast path; longer or larger numbers
within an ulp or two), then float32 by one more rounding.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ...memory import require
from ._common import err, open_binary, show
from .textlines import num_workers, read_chunks

__all__ = ["csv_row_blocks", "read_csv_rows"]

_OK, _COLUMNS, _TOKEN, _EXTRA = 0, 1, 2, 3
_POW10 = np.array([10.0**k for k in range(23)])
_INITY = np.frombuffer(b"inity", np.uint8)
_MANT_MAX = 10**17


@numba.njit(nogil=True, cache=True)
def _parse_block(buf, out, row0, allow_empty, pow10, inity):
    """Parse the whole lines of ``buf`` (uint8, ends with a newline) into out[row0:, :].

    Returns (status, line in block, column): _OK with the line count, _COLUMNS with the
    values found on a line of the wrong width, _TOKEN at a field that is no number,
    _EXTRA when the block holds more lines than ``out`` has rows left.
    """
    n = buf.size
    ncol = out.shape[1]
    i = 0
    r = 0
    while i < n:
        if row0 + r >= out.shape[0]:
            return _EXTRA, r, 0
        c = 0
        while True:
            while buf[i] == 32 or buf[i] == 9:
                i += 1
            neg = False
            if buf[i] == 45 or buf[i] == 43:
                neg = buf[i] == 45
                i += 1
            start = i
            mant = 0
            exp10 = 0
            digits = False
            while 48 <= buf[i] <= 57:
                if mant < _MANT_MAX:
                    mant = mant * 10 + (buf[i] - 48)
                else:
                    exp10 += 1
                digits = True
                i += 1
            if buf[i] == 46:
                i += 1
                while 48 <= buf[i] <= 57:
                    if mant < _MANT_MAX:
                        mant = mant * 10 + (buf[i] - 48)
                        exp10 -= 1
                    digits = True
                    i += 1
            if digits:
                if buf[i] == 101 or buf[i] == 69:
                    i += 1
                    eneg = False
                    if buf[i] == 45 or buf[i] == 43:
                        eneg = buf[i] == 45
                        i += 1
                    if not 48 <= buf[i] <= 57:
                        return _TOKEN, r, c
                    e = 0
                    while 48 <= buf[i] <= 57:
                        if e < 100000:
                            e = e * 10 + (buf[i] - 48)
                        i += 1
                    exp10 += -e if eneg else e
                if mant == 0:
                    v = 0.0
                elif 0 <= exp10 <= 22:
                    v = mant * pow10[exp10]
                elif -22 <= exp10 < 0:
                    v = mant / pow10[-exp10]
                elif exp10 > 0:
                    v = mant * 10.0**exp10
                else:
                    v = (mant * 1e-22) * 10.0 ** (exp10 + 22)
            elif i > start + neg:  # a lone "." or "+."
                return _TOKEN, r, c
            elif (buf[i] | 32) == 110 and i + 2 < n and (buf[i + 1] | 32) == 97:
                if (buf[i + 2] | 32) != 110:
                    return _TOKEN, r, c
                v = np.nan
                i += 3
            elif (buf[i] | 32) == 105 and i + 2 < n and (buf[i + 1] | 32) == 110:
                if (buf[i + 2] | 32) != 102:
                    return _TOKEN, r, c
                i += 3
                k = 0
                while k < 5 and i + k < n and (buf[i + k] | 32) == inity[k]:
                    k += 1
                if k == 5:  # "infinity"
                    i += 5
                v = np.inf
            elif allow_empty and not neg:
                while buf[i] == 32 or buf[i] == 9:
                    i += 1
                if buf[i] != 44 and buf[i] != 10 and buf[i] != 13:
                    return _TOKEN, r, c
                v = np.nan
            else:
                return _TOKEN, r, c
            if neg:
                v = -v
            while buf[i] == 32 or buf[i] == 9:
                i += 1
            if c < ncol:
                out[row0 + r, c] = v
            c += 1
            if buf[i] == 44:
                i += 1
                continue
            if buf[i] == 13:
                i += 1
            if buf[i] == 10:
                i += 1
                break
            return _TOKEN, r, c - 1
        if c != ncol:
            return _COLUMNS, r, c
        r += 1
    return _OK, r, 0


def _line(block: bytes, r: int) -> bytes:
    return block.split(b"\n", r + 1)[r]


def read_csv_rows(path, nrows: int, *, dtype=np.float32, allow_empty=False, unit="node"):
    """``dtype`` [nrows, C]: a file of ``nrows`` lines of C comma-separated numbers (C from
    the first line; ``nan``/``inf`` accepted, empty fields too when ``allow_empty``, as NaN).

    A line of another width, a field that is no number or a row count other than ``nrows``
    raises GraphError naming the file and the line; ``unit`` names what a row stands for.
    """
    path = os.fspath(path)
    out = None

    def allocate(cols: int):
        nonlocal out
        require(
            nrows * cols * np.dtype(dtype).itemsize,
            f"line 1: {cols:,} columns, so {nrows:,} rows of {np.dtype(dtype)}",
            path,
            f"check the row count ({unit}s) and the first line",
        )
        out = np.empty((nrows, cols), dtype)
        return out

    for _ in csv_row_blocks(
        path, nrows, dtype=dtype, allow_empty=allow_empty, unit=unit, into=allocate
    ):
        pass
    return np.empty((0, 0), dtype) if out is None else out


def csv_row_blocks(
    path, nrows: int, *, dtype=np.float32, allow_empty=False, unit="node", into=None
):
    """The rows of :func:`read_csv_rows`, block by block in order (``dtype`` [k, C] each,
    parsed ahead in threads), with its checks. ``into(C)``: an array [nrows, C] to parse
    into, allocated when the first line gives C (the blocks are then views of it)."""
    path = os.fspath(path)
    cols = None
    line0 = 1
    pending: deque = deque()
    workers = num_workers()

    def collect():
        job, block, first, out = pending.popleft()
        status, r, c = job.result()
        if status == _COLUMNS:
            raise err(
                path,
                f"line {first + r}",
                f"expected {cols} comma-separated values (as on line 1), found {c}",
            )
        if status == _TOKEN:
            fields = _line(block, r).split(b",")
            tok = fields[c].strip() if c < len(fields) else b""
            raise err(path, f"line {first + r}", f"column {c + 1}: {show(tok)} is not a number")
        return out

    with open_binary(path) as f, ThreadPoolExecutor(workers) as pool:
        try:
            for block in read_chunks(f, path):
                lines = block.count(b"\n")
                if cols is None:
                    cols = block[: block.find(b"\n")].count(b",") + 1
                    whole = into(cols) if into is not None else None
                if line0 - 1 + lines > nrows:
                    while pending:
                        collect()
                    raise err(
                        path,
                        f"line {nrows + 1}",
                        f"more than {nrows} lines: expected one row per {unit} ({nrows} {unit}s)",
                    )
                if whole is None:
                    out = np.empty((lines, cols), dtype)
                else:
                    out = whole[line0 - 1 : line0 - 1 + lines]
                buf = np.frombuffer(block, np.uint8)
                job = pool.submit(_parse_block, buf, out, 0, allow_empty, _POW10, _INITY)
                pending.append((job, block, line0, out))
                line0 += lines
                if len(pending) > workers:
                    yield collect()
            while pending:
                yield collect()
        finally:
            for job, *_ in pending:
                job.cancel()
    rows = line0 - 1
    if rows != nrows:
        raise err(
            path,
            f"line {max(rows, 1)}",
            f"{rows} lines, expected one row per {unit} ({nrows} {unit}s)",
        )
