"""The ``.npy`` members of an npz (zip) archive, read by element or row ranges from their
streams, so that a rank reads its slice of an archive, and a converter a member, without
loading all of it."""

from __future__ import annotations

import zipfile

import numpy as np

from ._common import err, npy_header

__all__ = ["TAKE_BYTES", "Member", "open_zip", "take_csr_rows"]

TAKE_BYTES = 1 << 26  # a block of node rows read by id (an order's) from a member


class Member:
    """An .npy member of an npz archive, read by element ranges from its stream;
    ``fortran``: a Fortran-ordered member is taken too (``flat`` reads it in memory
    order)."""

    def __init__(self, z: zipfile.ZipFile, path: str, key: str, fortran: bool = False):
        self.path, self.key = path, key
        try:
            self.f = z.open(key + ".npy")
            self.shape, self.fortran, self.dtype = npy_header(self.f)
        except (KeyError, ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise err(path, f"key {key!r}", f"cannot be read ({e})") from e
        if (self.fortran and not fortran and len(self.shape) > 1) or self.dtype.hasobject:
            raise err(path, f"key {key!r}", "expected a C-ordered numeric array")
        self.start = self.f.tell()

    def flat(self, a: int, b: int) -> np.ndarray:
        """Elements a..b-1 in the order the file holds them."""
        size = self.dtype.itemsize
        try:
            self.f.seek(self.start + a * size)
            data = self.f.read((b - a) * size)
        except (OSError, zipfile.BadZipFile, EOFError) as e:
            raise err(self.path, f"key {self.key!r}", f"cannot be read ({e})") from e
        if len(data) != (b - a) * size:
            raise err(self.path, f"key {self.key!r}", "truncated")
        return np.frombuffer(data, self.dtype)

    def rows(self, a: int, b: int) -> np.ndarray:
        """Rows a..b-1 (along the first axis)."""
        row = int(np.prod(self.shape[1:], dtype=np.int64))
        return self.flat(a * row, b * row).reshape((b - a, *self.shape[1:]))

    def all(self) -> np.ndarray:
        return self.rows(0, self.shape[0] if self.shape else 1)

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (any order), read forward once in blocks of about TAKE_BYTES
        (a compressed member has no random access), holding one block at a time."""
        row = max(1, int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize)
        out = np.empty((ids.size, *self.shape[1:]), self.dtype)
        for at, a, b in _blocks(np.sort(ids), np.argsort(ids, kind="stable"), TAKE_BYTES // row):
            out[at] = self.rows(a, b)[ids[at] - a]
        return out


def _blocks(sorted_ids, order, rows: int):
    """(positions in the caller's ids, first row, end row) of each block of at most
    ``rows`` rows that holds any of the ids, in increasing row order."""
    rows, i = max(1, rows), 0
    while i < sorted_ids.size:
        a = int(sorted_ids[i])
        j = int(np.searchsorted(sorted_ids, a + rows, "left"))
        yield order[i:j], a, int(sorted_ids[j - 1]) + 1
        i = j


def take_csr_rows(ptr, ind, data, ids):
    """Rows ``ids`` of the CSR (``ptr`` int64 [n+1] in memory; ``ind``, ``data``
    Members), read forward in blocks of about TAKE_BYTES: (data, indices, indptr)."""
    lengths = ptr[ids + 1] - ptr[ids]
    out_ptr = np.zeros(ids.size + 1, np.int64)
    np.cumsum(lengths, out=out_ptr[1:])
    out_ind = np.empty(int(out_ptr[-1]), ind.dtype)
    out_data = np.empty(int(out_ptr[-1]), data.dtype)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    ends = ptr[sorted_ids + 1]
    i, per = 0, max(1, TAKE_BYTES // (ind.dtype.itemsize + data.dtype.itemsize))
    while i < ids.size:  # rows whose elements span at most ``per`` (or one row)
        first = int(ptr[sorted_ids[i]])
        j = max(i + 1, int(np.searchsorted(ends, first + per, "right")))
        a, b = first, int(ptr[sorted_ids[j - 1] + 1])
        block_ind, block_data = ind.rows(a, b), data.rows(a, b)
        for k in order[i:j]:
            r = ids[k]
            lo, hi = int(ptr[r]) - a, int(ptr[r + 1]) - a
            out_ind[out_ptr[k] : out_ptr[k + 1]] = block_ind[lo:hi]
            out_data[out_ptr[k] : out_ptr[k + 1]] = block_data[lo:hi]
        i = j
    return out_data, out_ind, out_ptr


def open_zip(path):
    """The npz archive at ``path`` as a ZipFile; GraphError when it is none."""
    try:
        return zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise err(path, "byte offset 0", f"not a readable .npz archive ({e})") from e
