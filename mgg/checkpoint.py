"""Checkpoints of a :class:`mgg.train.Trainer`: write them atomically, read and validate
them before any state is taken, and lock a checkpoint folder to one job.

A checkpoint is one torch file that ``torch.load(path, weights_only=True)`` reads::

    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "meta": str (JSON),
     "best": the model's state dict at its best validation epoch (only under --select
             best-val, once an epoch was evaluated)}

meta: ``format`` (FORMAT), ``digest`` (sha256 of the states and of the rest of meta),
``epoch``, ``history``, ``config`` (the model's), ``optimizer`` (its class name),
``graph_config`` (the knobs in force), ``tuning`` (the search's result or null), ``ranks``,
``data`` (what the job trained on: mgg.prepare.LocalData.identity; see :func:`check_data`),
``select`` and ``best`` (the best validation epoch's record: epoch and metrics, or null).
Format 0 (before mgg wrote a format) has neither format nor digest and is still read.

Every problem is a :class:`CheckpointError` whose message names the file and the problem.
Collective functions take the job's ``comm`` (None: one process); rank 0 does the file
work and the others get its result, so every rank raises the same error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import re
import sys
import time
import warnings
import zipfile
from pathlib import Path

import torch

from . import precision
from .atomic import Lock, LockedError, atomic_write, hold, is_temporary, sweep
from .comm import on_root
from .errors import CheckpointError, first_line

FORMAT = 2  # 2: the best validation epoch's weights ("best")
LOCK = ".lock"
# test-only: the name of a checkpoint whose write stops once its temporary file is whole,
# before the rename (a test kills the job there)
STALL = "MGG_TEST_STALL_CHECKPOINT"
PARTS = {
    "model": "the model's weights",
    "optimizer": "the optimizer's state",
    "meta": "the trainer's epoch, history and configuration",
}


def _error(path, problem: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {path} {problem}")


def _rank(comm) -> int:
    return 0 if comm is None else comm.rank


def _on_root(comm, fn, catch=(), message=str, share: bool = True):
    """mgg.comm.on_root for checkpoints: a CheckpointError on rank 0, or an exception of a
    type in ``catch`` (worded by ``message``), raised as a CheckpointError on every rank."""

    def worded(e):
        return str(e) if isinstance(e, CheckpointError) else message(e)

    catch = (CheckpointError, *(catch if isinstance(catch, tuple) else (catch,)))
    return on_root(comm, fn, catch, CheckpointError, worded, share)


# ---- write -------------------------------------------------------------------------------
def save(
    path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict,
    comm=None,
    best: dict | None = None,
):
    """Collective: rank 0 writes ``model``'s and ``optimizer``'s state dicts with ``meta``
    (JSON-able; format and digest are added) and ``best`` (a state dict of the model, or
    None) to ``path``, atomically: the file is whole or absent, never half written.
    Returns ``path``."""
    path = Path(path)
    _on_root(
        comm,
        lambda: write(path, model.state_dict(), optimizer.state_dict(), meta, best),
        (OSError, RuntimeError),
        lambda e: f"checkpoint {path} cannot be written: {_why(e)}",
    )
    return path


def _why(e: Exception) -> str:
    if isinstance(e, OSError) and e.errno:
        return "no space left on device" if e.errno == errno.ENOSPC else os.strerror(e.errno)
    return first_line(e)


def write(
    path, model_state: dict, optimizer_state: dict, meta: dict, best: dict | None = None
) -> Path:
    """Write one checkpoint file (one process; see :func:`save`)."""
    path = Path(path)
    meta = json.loads(json.dumps({**meta, "format": FORMAT}))  # as a reader will see it
    meta.pop("digest", None)
    meta["digest"] = digest(model_state, optimizer_state, meta, best)
    state = {"model": model_state, "optimizer": optimizer_state, "meta": json.dumps(meta)}
    if best is not None:
        state["best"] = best
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:
        _save(state, tmp)
        if os.environ.get(STALL) == path.name:
            print(f"stalled writing {tmp}", file=sys.stderr, flush=True)
            time.sleep(600)
    return path


def _save(state: dict, tmp: str) -> None:
    """torch.save into ``tmp`` through a Python file, so that a failed write raises the
    OSError it is (torch's own writer says only "unexpected pos N vs M")."""
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
    except RuntimeError as e:
        if isinstance(e.__context__, OSError):  # what f.write raised inside torch
            raise OSError(e.__context__.errno, e.__context__.strerror, tmp) from None
        raise


def digest(model_state: dict, optimizer_state: dict, meta: dict, best: dict | None = None) -> str:
    """sha256 (hex) of the state dicts (dtypes, shapes, bytes) and of meta without its
    digest: any change to a weight, a moment or the history changes it."""
    h = hashlib.sha256()
    rest = {k: v for k, v in meta.items() if k != "digest"}
    parts = {"model": model_state, "optimizer": optimizer_state, "meta": rest}
    _feed(h, parts if best is None else {**parts, "best": best})
    return h.hexdigest()


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=str):
            h.update(f"{k!s}=".encode())
            _feed(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, list | tuple):
        h.update(b"[")
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    else:
        h.update(f"{obj!r};".encode())


# ---- read and validate -------------------------------------------------------------------
def read(path) -> dict:
    """The checkpoint at ``path`` checked on its own (one process): {"model": {name:
    tensor}, "optimizer": a torch optimizer state dict, "meta": dict}. Refused with a
    CheckpointError: a missing file, a folder, an empty, truncated, bit-flipped or foreign
    file, a pickle payload, a missing part, a meta that is not JSON or lacks a valid epoch,
    contents that do not match their digest, NaN/inf weights or optimizer moments."""
    path = Path(path)
    if path.is_dir():
        newest = latest(path)
        hint = f"; its newest checkpoint is {newest}" if newest else ""
        raise _error(path, f"is a folder, not a checkpoint file{hint}")
    if not path.exists():
        raise _error(path, "does not exist")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise _error(path, f"cannot be read: {e.strerror or e}") from None
    if size == 0:
        raise _error(path, "cannot be read: it is empty (0 bytes): its write was cut short?")
    if head != b"PK\x03\x04":
        what = "a bare pickle" if head[:1] == b"\x80" else f"something that starts with {head!r}"
        raise _error(path, f"cannot be read: it is not a torch zip file but {what}")
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise _error(
            path, f"cannot be read: it is truncated or corrupt ({size} bytes; zip: {e})"
        ) from None
    if bad is not None:
        raise _error(
            path, f"cannot be read: it is corrupt: its member {bad} fails its CRC (a flipped bit?)"
        )
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL (\S+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise _error(
            path,
            f"cannot be read: it holds pickled Python objects{what}, not only tensors and "
            "plain data; mgg does not run pickled code",
        ) from None
    except Exception as e:  # noqa: BLE001 - torch's reader raises many kinds; named below
        raise _error(path, f"cannot be read: {type(e).__name__}: {first_line(e)}") from None
    return _check_parts(path, raw)


def _check_parts(path, raw) -> dict:
    if not isinstance(raw, dict):
        raise _error(path, f"is not an mgg checkpoint: it holds a {type(raw).__name__}, not a dict")
    for key, what in PARTS.items():
        if key not in raw:
            raise _error(path, f"is not a whole mgg checkpoint: it has no {key!r} ({what})")
    model, opt, text, best = raw["model"], raw["optimizer"], raw["meta"], raw.get("best")
    for key, state in (("model", model), ("best", best)):
        if key in raw and not _named_tensors(state):
            raise _error(path, f"has a {key!r} that is not a dict of named tensors")
    if best is not None and {k: v.shape for k, v in best.items()} != {
        k: v.shape for k, v in model.items()
    }:
        raise _error(path, "has 'best' weights whose names or shapes are not the model's")
    if (
        not isinstance(opt, dict)
        or not isinstance(opt.get("state"), dict)
        or not isinstance(opt.get("param_groups"), list)
        or not all(isinstance(s, dict) for s in opt["state"].values())
    ):
        raise _error(path, "has an 'optimizer' that is not a torch optimizer state dict")
    if not isinstance(text, str):
        raise _error(path, f"has a 'meta' that is a {type(text).__name__}, not JSON text")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise _error(path, f"has a 'meta' that is not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(meta, dict):
        raise _error(path, f"has a 'meta' that is a JSON {type(meta).__name__}, not an object")
    fmt = meta.get("format", 0)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or fmt < 0:
        raise _error(path, f"has format {fmt!r} in its meta: not a format mgg writes")
    if fmt > FORMAT:
        raise _error(path, f"has format {fmt}, newer than this mgg reads (up to {FORMAT})")
    if fmt >= 1 and meta.get("digest") != digest(model, opt, meta, best):
        raise _error(
            path,
            "does not match the digest in its meta: its weights, optimizer state or history "
            "changed after it was written",
        )
    epoch = meta.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise _error(path, f"has epoch {epoch!r} in its meta: expected an integer >= 0")
    if not isinstance(meta.get("history", []), list):
        raise _error(path, "has a history in its meta that is not a list")
    tensors = (
        list(model.items())
        + [(f"best {k}", v) for k, v in (best or {}).items()]
        + [
            (f"optimizer state {k!r} of parameter {i}", v)
            for i, s in opt["state"].items()
            for k, v in s.items()
            if isinstance(v, torch.Tensor)
        ]
    )
    for name, t in tensors:
        if t.is_floating_point() or t.is_complex():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                raise _error(
                    path,
                    f"holds NaN/inf in {name} ({bad} of {t.numel()} values): the run that "
                    "wrote it had diverged; resume from an earlier checkpoint",
                )
    return {"model": model, "optimizer": opt, "meta": meta, "best": best}


def _named_tensors(state) -> bool:
    return isinstance(state, dict) and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    )


def check_fit(path, ckpt: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """Refuse a checkpoint (as :func:`read` returns it) of another model (its config, its
    weights' names and shapes) or of another optimizer (its class, groups, per-parameter
    state: e.g. Adam without exp_avg or step)."""
    meta = ckpt["meta"]
    mine, theirs = getattr(model, "config", None) or {}, meta.get("config") or {}
    if mine and theirs and json.loads(json.dumps(mine)) != theirs:
        diffs = [
            f"{k} {theirs.get(k)!r} (this job: {mine.get(k)!r})"
            for k in sorted(set(mine) | set(theirs), key=str)
            if json.loads(json.dumps(mine.get(k))) != theirs.get(k)
        ]
        raise _error(path, f"is of another model: {', '.join(diffs[:4])}")
    here = model.state_dict()
    state = ckpt["model"]
    lacks = [k for k in here if k not in state]
    extra = [k for k in state if k not in here]
    if lacks or extra:
        what = f"lacks weight {lacks[0]!r}" if lacks else f"has weight {extra[0]!r}, unknown"
        raise _error(path, f"does not fit this model: it {what} ({len(here)} here)")
    for k, t in here.items():
        if tuple(state[k].shape) != tuple(t.shape):
            raise _error(
                path,
                f"does not fit this model: weight {k!r} is {list(state[k].shape)} in it, "
                f"{list(t.shape)} here",
            )
    _check_optimizer(path, ckpt, model, optimizer)


def _check_optimizer(path, ckpt, model, optimizer) -> None:
    kind = type(optimizer).__name__
    theirs = ckpt["meta"].get("optimizer")
    if theirs and theirs != kind:
        raise _error(path, f"holds the state of a {theirs} optimizer; this job uses {kind}")
    groups = ckpt["optimizer"]["param_groups"]
    sizes = [len(g.get("params", ())) if isinstance(g, dict) else -1 for g in groups]
    want = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != want:
        raise _error(
            path,
            f"has optimizer parameter groups of sizes {sizes}; this {kind} has {want}",
        )
    params = [p for g in optimizer.param_groups for p in g["params"]]
    names = {id(p): n for n, p in model.named_parameters()}
    template = _state_template(optimizer)
    if template is None:
        return
    state = ckpt["optimizer"]["state"]
    for i, s in state.items():
        if not isinstance(i, int) or not 0 <= i < len(params):
            raise _error(path, f"has optimizer state of parameter {i!r}; {kind} has {len(params)}")
        p = f"parameter {i} ({names.get(id(params[i]), '?')})"
        need = template.get(i, {})
        lacks = [k for k in need if k not in s]
        extra = [k for k in s if k not in need]
        if lacks or extra:
            what = (
                f"lacks {lacks[0]!r}" if lacks else f"has {extra[0]!r}, which {kind} does not keep"
            )
            raise _error(path, f"has an optimizer state that does not fit {kind}: {p} {what}")
        for k, shape in need.items():
            got = tuple(s[k].shape) if isinstance(s[k], torch.Tensor) else None
            if got != shape:
                raise _error(
                    path,
                    f"has an optimizer state that does not fit {kind}: {k!r} of {p} is "
                    f"{'not a tensor' if got is None else list(got)}, expected "
                    f"{'no tensor' if shape is None else list(shape)}",
                )
    if not state and template and ckpt["meta"]["epoch"] > 0:
        keys = ", ".join(sorted(next(iter(template.values()))))
        raise _error(
            path,
            f"has no optimizer state at epoch {ckpt['meta']['epoch']}: {kind} keeps {keys} "
            "per parameter once it stepped",
        )


def _state_template(optimizer) -> dict[int, dict[str, tuple | None]] | None:
    """{parameter index: {key: shape, None for a non-tensor}}: the state one step of an
    optimizer like ``optimizer`` (class, groups, hyperparameters) keeps; None where no such
    trial step can be made (e.g. an optimizer whose step needs a closure)."""
    groups = []
    for g in optimizer.param_groups:
        clones = []
        for p in g["params"]:
            c = torch.zeros_like(p, requires_grad=True)
            c.grad = torch.zeros_like(p)
            clones.append(c)
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": clones})
    try:
        trial = type(optimizer)(groups)
        trial.step()
    except (TypeError, ValueError, RuntimeError):
        return None
    return {
        i: {k: tuple(v.shape) if isinstance(v, torch.Tensor) else None for k, v in s.items()}
        for i, s in trial.state_dict()["state"].items()
    }


def check_epochs(path, epoch: int, epochs: int) -> None:
    """Refuse to continue from ``epoch`` to a total of ``epochs`` (== only evaluates)."""
    if epoch > epochs:
        raise _error(
            path,
            f"is at epoch {epoch} but --epochs is {epochs}: nothing to train; raise --epochs",
        )


# what a job's data identity holds only to name it in messages (a file may be renamed)
LABELS = ("dataset", "path")
FLAGS = {"row_normalize": "--row-normalize", "seed": "--seed"}


def check_data(
    path, meta: dict, data: dict | None, what: str = "checkpoint", use: str = "resume it"
) -> str | None:
    """Refuse a checkpoint (or another file: ``what``, the use of it: ``use``) whose meta
    records other data than ``data`` (this job's, as mgg.prepare.LocalData.identity
    describes it: the dataset's source, sizes, graph kind and preprocessing flags): any
    entry that both record, the labels (LABELS) aside, and that differs. Returns a warning
    where the checkpoint records no data (an older mgg wrote it), None otherwise."""
    if not data:
        return None
    theirs = meta.get("data")
    if not isinstance(theirs, dict):
        return (
            f"checkpoint {path} does not record the data it was trained on (an older mgg "
            f"wrote it): resuming it on {data.get('dataset')!r} unchecked"
        )
    mine = json.loads(json.dumps(data))
    diffs = [
        f"{FLAGS.get(k, k)} {_shown(theirs, k)} (this job: {_shown(mine, k)})"
        for k in mine
        if k not in LABELS
        and theirs.get(k) is not None
        and mine[k] is not None
        and theirs[k] != mine[k]
    ]
    if diffs:
        names = (theirs.get("dataset"), mine.get("dataset"))
        named = f" ({names[0]!r}; this job: {names[1]!r})" if names[0] != names[1] else ""
        raise CheckpointError(
            f"{what} {path} was trained on other data{named}: {', '.join(diffs)}; {use} on "
            "the data and with the flags it was trained with"
        )
    return None


def _shown(identity: dict, key: str) -> str:
    value = identity[key]
    if not isinstance(value, dict):
        return repr(value)
    # hashes cut to 12 digits; a source named by its path where it has one
    text = ", ".join(
        f"{k} {v[:12] if isinstance(v, str) and re.fullmatch('[0-9a-f]{17,}', v) else v}"
        for k, v in value.items()
    )
    where = identity.get("path") if key == "source" else None
    return f"{where} ({text})" if where else f"({text})"


def load(
    path, model, optimizer, comm=None, epochs: int | None = None, data: dict | None = None
) -> tuple[dict, dict | None]:
    """Collective: rank 0 reads and checks ``path`` (:func:`read`), every rank gets it,
    checks it was trained on ``data`` (:func:`check_data`, where given; rank 0 warns where
    the checkpoint does not say), fits ``model`` and ``optimizer`` (:func:`check_fit`) and
    the run's total ``epochs`` (:func:`check_epochs`, where given), then loads their
    states. Returns the checkpoint's meta (epoch, history, graph_config, tuning, ...) and
    its best validation epoch's weights (a state dict, or None)."""
    ckpt = _on_root(
        comm,
        lambda: read(path),
        Exception,  # whatever it is, the peers must hear of it, not hang
        lambda e: f"checkpoint {path} cannot be read: {type(e).__name__}: {e}",
    )
    note = check_data(path, ckpt["meta"], data)
    if note and _rank(comm) == 0:
        warnings.warn(note, stacklevel=2)
    check_fit(path, ckpt, model, optimizer)
    if epochs is not None:
        check_epochs(path, ckpt["meta"]["epoch"], epochs)
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise _error(path, f"does not fit this model and optimizer: {e}") from None
    return ckpt["meta"], ckpt["best"]


def restore_knobs(graph, meta: dict, order: str) -> list[str]:
    """Collective: apply the knobs a checkpoint's run tuned (``meta["graph_config"]`` when
    ``meta["tuning"]``) that are valid for this job's ``graph`` (a DistGraph), each on its
    own; returns a note for each one dropped (e.g. threads tuned at another rank count),
    and one when the run's row dtype (``meta["dtype"]``) is not this job's: the weights
    are float32 masters either way, so training goes on in this job's dtype; and one when
    its node order is not this job's, ``order`` (LocalData.order: an order file's name
    too; weights are the same in any numbering).
    Knobs the run did not tune were its flags: this job's flags rule."""
    notes = []
    was, now = meta.get("dtype"), precision.name(graph.dtype)
    if was is not None and was != now:
        notes.append(f"trained with {was} rows, resumed with {now} (float32 weights either way)")
    was, now = meta.get("order"), order
    if was is not None and was != now:
        notes.append(
            f"trained with nodes in {was} order, resumed in {now} order (no weight depends "
            "on the nodes' numbering)"
        )
    if not meta.get("tuning"):
        return notes
    ranks = meta.get("ranks", "?")
    for knob, value in (meta.get("graph_config") or {}).items():
        if knob == "window" and value not in graph.window_choices:
            if value != graph.config.get("window"):  # measured for another placement
                notes.append(f"tuned window {value!r} (at {ranks} rank(s)) not restored: "
                             "this job does not choose among windows")  # fmt: skip
            continue
        try:
            graph.configure(**{knob: value})
        except (ValueError, TypeError) as e:
            notes.append(f"tuned {knob}={value!r} (at {ranks} rank(s)) not restored: {e}")
    return notes


def latest(folder) -> Path | None:
    """The newest checkpoint file (``*.pt``, by epoch in its name, then by time) in
    ``folder``, or None; a write's temporary file (mgg.atomic) is never one."""
    files = [p for p in Path(folder).glob("*.pt") if p.is_file() and not is_temporary(p)]
    if not files:
        return None

    def key(p):
        digits = re.findall(r"\d+", p.stem)
        return (int(digits[-1]) if digits else -1, p.stat().st_mtime)

    return max(files, key=key)


# ---- one job per folder ------------------------------------------------------------------
def lock(folder, comm=None) -> Lock | None:
    """Collective: rank 0 makes ``folder``, locks it for this job (the lock on rank 0,
    None elsewhere) and removes the temporary files of writers that died (mgg.atomic.sweep:
    a job killed while it wrote a checkpoint); a CheckpointError on every rank when another
    job holds it."""
    folder = Path(folder)
    return _on_root(comm, lambda: _lock(folder), share=False)  # an open file stays put


def _lock(folder: Path) -> Lock:
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        held = hold(folder / LOCK, f"checkpoint folder {folder}")
        sweep(folder)
        return held
    except LockedError as e:
        raise CheckpointError(
            f"{e}: give this job its own --checkpoint-dir, or wait until that one ends"
        ) from None
    except OSError as e:
        raise CheckpointError(
            f"checkpoint folder {folder} cannot be made or locked: {e.strerror or e}"
        ) from None
