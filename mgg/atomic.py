"""Writing files so that a reader never sees half of one: ``atomic_write`` (tmp + fsync +
rename, mgg's one atomic writer), and the folders outputs go to. Imported by graph,
partition, checkpoint, the tuner and the harness."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from .errors import MggError


@contextlib.contextmanager
def atomic_write(*paths):
    """Yield temporary paths next to ``paths`` (same folder, a unique name with the same
    ending); when the block succeeds each is flushed to disk (fsync) and replaces its path
    (os.replace), else all are removed. A reader sees the old files or the new ones, never
    half of one, also after a crash. The one home of atomic writes in mgg::

        with atomic_write(path) as tmp:
            np.save(tmp, array)
    """
    for p in paths:
        check_folder(p)
    token = secrets.token_hex(4)
    tmps = []
    for p in map(os.fspath, paths):
        head, tail = os.path.split(p)
        tmps.append(os.path.join(head, f".tmp-{token}-{tail}"))
    try:
        yield tmps[0] if len(tmps) == 1 else tuple(tmps)
        for tmp in tmps:
            _fsync(tmp)
        for tmp, p in zip(tmps, paths, strict=True):
            os.replace(tmp, p)
        for folder in {os.path.dirname(os.path.abspath(p)) for p in map(os.fspath, paths)}:
            with contextlib.suppress(OSError):  # the renames themselves (not every fs can)
                _fsync(folder)
    except BaseException as e:
        for tmp in tmps:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        if isinstance(e, OSError) and e.filename in tmps:  # name the user's file
            user = os.fspath(paths[tmps.index(e.filename)])
            raise type(e)(e.errno, f"cannot write it: {e.strerror}", user) from e
        msg = str(e)
        if isinstance(e, MggError) and any(tmp in msg for tmp in tmps):
            for tmp, p in zip(tmps, paths, strict=True):
                msg = msg.replace(tmp, os.fspath(p))
            raise type(e)(msg) from e  # name the user's file, not the temporary one
        raise


def check_folder(path) -> None:
    """FileNotFoundError naming ``path`` when the folder it would be written in is missing."""
    path = os.fspath(path)
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise FileNotFoundError(2, "cannot write it: its folder does not exist", path)


def make_folder(path, what: str) -> Path:
    """``mkdir -p path``, the folder for ``what``; NotADirectoryError naming it when a file
    is in the way."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(20, f"is a file, not a folder for {what}", str(path))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
