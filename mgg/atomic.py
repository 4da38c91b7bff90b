"""Writing files so that a reader never sees half of one: ``atomic_write`` (tmp + fsync +
rename, mgg's one atomic writer), the temporary names every writer uses (``temp_path``;
``sweep`` removes those whose writer died), locks that keep one job per output
(``hold``), the registry of a job's temporaries that mggrun sweeps (``REGISTRY``), and
the folders outputs go to. Imported by graph, partition, checkpoint,
the tuner and the harness."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path

from .errors import MggError

TMP = ".tmp-"
# .tmp-HOST-PID-TOKEN-NAME: HOST 8 hex digits of the host name's hash, the writer's pid
_TEMP = re.compile(r"^\.tmp-([0-9a-f]{8})-(\d+)-([0-9a-f]+)-(.+)$")


def _host_id() -> str:
    return hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()


# mggrun names a folder of its job's temporaries here: each process that names one writes
# its path into the file named by its pid, and mggrun removes those of dead writers at
# the job's end (a rank's SIGKILL leaves them; see sweep_registered)
REGISTRY = "MGG_TEMPORARIES"


def temp_path(path) -> Path:
    """A temporary name beside ``path`` (same folder, so a rename commits it) that names
    this host and process, so a later run can tell a dead writer's leftovers
    (``stale``) from a live writer's; under mggrun, recorded in the job's registry."""
    path = Path(path)
    tmp = path.parent / f"{TMP}{_host_id()}-{os.getpid()}-{secrets.token_hex(4)}-{path.name}"
    registry = os.environ.get(REGISTRY)
    if registry:
        with contextlib.suppress(OSError):  # another node's rank: no such folder there
            with open(os.path.join(registry, str(os.getpid())), "a") as f:
                f.write(os.path.abspath(tmp) + "\n")
    return tmp


def sweep_registered(registry) -> list[Path]:
    """Remove the temporaries listed in the folder ``registry`` (``REGISTRY``) that are
    still there and whose writer, a process of this host, no longer runs; then the
    folder. Only names that ``temp_path`` makes are touched. Returns what was removed."""
    registry, here, gone = Path(registry), _host_id(), []
    with contextlib.suppress(OSError):
        for f in registry.iterdir():
            with contextlib.suppress(OSError):
                for line in f.read_text().splitlines():
                    p = Path(line)
                    m = _TEMP.match(p.name)
                    if not (m and m.group(1) == here and os.path.lexists(p)):
                        continue
                    if not _alive(int(m.group(2))) and _remove(p):
                        gone.append(p)
    shutil.rmtree(registry, ignore_errors=True)
    return gone


def is_temporary(path) -> bool:
    """Whether ``path``'s name is one that ``temp_path`` makes."""
    return Path(path).name.startswith(TMP)


def stale(folder) -> list[Path]:
    """The temporaries in ``folder`` whose writer was a process of this host that no
    longer runs (another host's, or an unrecognised name, are left alone)."""
    folder, here, out = Path(folder), _host_id(), []
    if not folder.is_dir():
        return out
    for p in folder.iterdir():
        m = _TEMP.match(p.name)
        if m and m.group(1) == here and not _alive(int(m.group(2))):
            out.append(p)
    return out


def sweep(folder) -> list[Path]:
    """Remove ``stale(folder)`` (files or folders); returns what was removed."""
    return [p for p in stale(folder) if _remove(p)]


def _remove(p: Path) -> bool:
    """Remove file or folder ``p``; False if it was gone already."""
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    except FileNotFoundError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Lock:
    """An exclusive ``flock`` on a lock file, which names its holder (pid, host, start);
    held until :meth:`release`, the object's end, or the process's (the kernel drops a
    flock when its holder dies, however it dies)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit; the kernel drops it anyway
            pass


class LockedError(MggError, OSError):
    """Another job holds the lock; the message names its holder."""


def hold(lock_path, what: str) -> Lock:
    """Take the exclusive lock ``lock_path`` (created if missing) for ``what`` (the
    output it guards, as the error names it). LockedError naming the holder when another
    job has it; OSError naming ``what`` when the file system cannot lock."""
    lock_path = Path(lock_path)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OSError(e.errno, f"cannot lock it: {e.strerror}", what) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 400, 0).decode("utf-8", "replace").strip() or "a process"
        os.close(fd)
        raise LockedError(f"{what} is in use by another job ({holder})") from None
    except OSError as e:
        os.close(fd)
        raise OSError(
            e.errno, f"cannot lock it ({e.strerror}): use a file system with flock", what
        ) from None
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    text = f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, text, 0)
    return Lock(lock_path, fd)


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
    tmps = [os.fspath(temp_path(p)) for p in paths]
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
            with contextlib.suppress(OSError):  # gone, or never made (a read-only folder)
                os.remove(tmp)
        if isinstance(e, OSError) and (e.filename in tmps or e.filename is None):
            # name the user's file, not the temporary (or no file: a library's write)
            user = ", ".join(map(os.fspath, paths))
            if e.filename is not None:
                user = os.fspath(paths[tmps.index(e.filename)])
            raise OSError(e.errno, cannot_write(e), user) from e
        msg = str(e)
        if isinstance(e, MggError) and any(tmp in msg for tmp in tmps):
            for tmp, p in zip(tmps, paths, strict=True):
                msg = msg.replace(tmp, os.fspath(p))
            raise type(e)(msg) from e  # name the user's file, not the temporary one
        raise


@contextlib.contextmanager
def atomic_folder(path, hint: str):
    """Yield a temporary folder beside ``path`` to fill; when the block succeeds its files
    are flushed to disk (fsync) and it is renamed to ``path``, else it is removed. A
    reader sees the whole folder or none. ``path`` must not exist (FileExistsError naming
    it, with ``hint``: what to do instead), checked before and again at the rename; the
    temporaries of dead writers beside it are swept first (a job killed while it wrote)."""
    full = Path(os.path.abspath(path))
    check_new(path, hint)
    try:
        full.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a leftover that cannot go stops no one
            sweep(full.parent)
        tmp = temp_path(full)
        tmp.mkdir()
    except OSError as e:
        raise OSError(e.errno, f"cannot write it: {e.strerror}", os.fspath(path)) from None
    try:
        yield tmp
        for f in tmp.rglob("*"):
            if f.is_file():
                _fsync(os.fspath(f))
        check_new(path, hint)
        os.rename(tmp, full)
        with contextlib.suppress(OSError):
            _fsync(os.fspath(full.parent))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and not isinstance(e, FileExistsError):
            named = _as_user(e.filename, tmp, path)
            if named is not None:  # the path as the user wrote it, not the temporary
                raise OSError(e.errno, cannot_write(e), named) from e
        raise


def cannot_write(e: OSError) -> str:
    """An OSError's reason as a writer's errors give it: 'cannot write it: REASON'."""
    why = (e.strerror or os.strerror(e.errno)) if e.errno else str(e)
    return why if why.startswith("cannot write it") else f"cannot write it: {why}"


@contextlib.contextmanager
def naming(path):
    """An OSError that names no file (a failed write into an open file, a library's
    buffered write on a full disk) named as ``path``, the file being written."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or not e.errno:
            raise
        raise OSError(e.errno, cannot_write(e), os.fspath(path)) from None


def _as_user(filename, tmp: Path, path) -> str | None:
    """``filename`` (an error's, inside the temporary folder ``tmp``, or None) as the same
    file under ``path``; None when it names something else."""
    if filename is None:
        return os.fspath(path)
    name, tmp = os.fspath(filename), os.fspath(tmp)
    if name == tmp or name.startswith(tmp + os.sep):
        return os.fspath(path) + name[len(tmp) :]
    return None


class PathError(MggError, ValueError):
    """An output path that is empty, or that clashes with another path of the command."""


def check_paths(outputs: dict, inputs: dict | None = None, new=()) -> None:
    """Before any work, PathError naming the flags when an output path (``outputs``: flag
    -> path, None where not given) is empty, is the path of another output or of an
    existing input (``inputs``: flag -> path), or lies inside an input or inside an
    output that must be new (the flags in ``new``: a folder made whole at the end); an
    OSError naming the path when the folder it would go in cannot hold it (a file in the
    way, no write permission). ``--save D --log-dir D`` would train to the end and then
    fail on the folder mgg itself made; ``--out ''`` would rename the output over the
    current folder."""
    given = {flag: os.fspath(p) for flag, p in outputs.items() if p is not None}
    for flag, path in given.items():
        if not path.strip():
            raise PathError(f"{flag} {path!r}: an empty path: name a folder")
    real = {flag: Path(os.path.realpath(p)) for flag, p in given.items()}
    flags = list(real)
    for i, a in enumerate(flags):
        for b in flags[i + 1 :]:
            for outer, inner in ((a, b), (b, a)):
                if real[outer] == real[inner] or (
                    outer in new and real[outer] in real[inner].parents
                ):
                    _clash(inner, given[inner], outer, given[outer], real[outer] == real[inner])
    for b, path in (inputs or {}).items():
        if path is None or not os.path.exists(path):
            continue  # a generator spec, or a missing file its reader names
        there = Path(os.path.realpath(path))
        for a in flags:
            if real[a] == there or there in real[a].parents:
                _clash(a, given[a], b, os.fspath(path), real[a] == there)
    for flag, path in given.items():
        _check_parent(real[flag], path)


def _clash(a, path_a, b, path_b, same: bool) -> None:
    where = "is the same path as" if same else "is inside"
    raise PathError(f"{a} {path_a} {where} {b} {path_b}: give {a} a path of its own")


def _check_parent(full: Path, path: str) -> None:
    """OSError naming ``path`` when it, or the nearest folder above it that exists, is a
    file or is not writable (the output could not be made there, after the work)."""
    up = full
    while not os.path.lexists(up) and up.parent != up:
        up = up.parent
    if up == full and not os.path.isdir(up):
        up = up.parent  # a file: --save/--out refuse it (check_new), else it is named later
    if not os.path.isdir(up):
        raise NotADirectoryError(20, f"cannot write it: {up} is a file, not a folder", path)
    if not os.access(up, os.W_OK | os.X_OK):
        where = "the folder is" if up == full else f"{up} is"
        raise PermissionError(13, f"cannot write it: {where} not writable", path)


def check_new(path, hint: str) -> None:
    """FileExistsError naming ``path`` when it exists (``hint``: what to do instead)."""
    if os.path.lexists(path):
        raise FileExistsError(17, f"already exists: {hint}", os.fspath(path))


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
