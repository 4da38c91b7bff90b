"""A trained model on disk, to use again: :func:`save_model` writes a folder (``mgg train
--save DIR``), :func:`load_model` builds the model from it (``mgg predict``/``embed``
``--model DIR``, or Python).

Layout of ``DIR`` (format ``mgg-model``, version 1)::

    model.pt     the model's state dict (plain torch: torch.load(weights_only=True))
    model.json   what rebuilds and checks it: ``config`` (the registered model's name and
                 hyper-parameters, mgg.torch.build_model's), and what the job that trained
                 it adds (mgg.train.Trainer.save_model: the rows' dtype, the knobs, the
                 node order, ``data``: what it was trained on, the dataset's fingerprint;
                 the selected epoch and its scores); model.pt's size and sha256, and the
                 digest of all that

The folder is filled beside ``DIR`` and renamed to it once whole (mgg.atomic.atomic_folder):
it is complete or absent. Reading checks the format, the digest (an edited model.json is
refused) and model.pt's size and hash (a truncated or edited one is refused), each problem a
ModelError naming the file.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import torch

from ..atomic import atomic_folder, check_new, naming
from ..comm import on_root
from ..errors import ModelError, first_line
from .models import MODELS, build_model

FORMAT = "mgg-model"
VERSION = 1
WEIGHTS = "model.pt"
INFO = "model.json"
HINT = "give --save a new folder, or remove this one"


def save_model(folder, model: torch.nn.Module, info: dict, comm=None) -> Path:
    """Collective: rank 0 writes ``model`` (built by mgg.torch.build_model: its ``config``
    names it) with ``info`` (JSON-able) into ``folder``, which must not exist; every rank
    raises its error. Returns ``folder``."""
    folder = Path(folder)
    on_root(comm, lambda: _write(folder, model, info), (ModelError, OSError), ModelError)
    return folder


def check_target(folder) -> None:
    """FileExistsError naming ``folder`` when it exists (before a run that saves there)."""
    check_new(folder, HINT)


def _write(folder: Path, model, info: dict) -> None:
    config = getattr(model, "config", None) or {}
    if config.get("model") not in MODELS:
        raise ModelError(
            f"{folder}: only a model that mgg.torch.build_model made can be saved (its config "
            f"names one of {', '.join(MODELS)})"
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    # an OSError names the file under the user's folder (atomic_folder), not the temporary
    with atomic_folder(folder, HINT) as tmp:
        try:
            with open(tmp / WEIGHTS, "wb") as f:
                torch.save(state, f)
        except RuntimeError as e:  # torch's writer says only "unexpected pos N vs M"
            if not isinstance(e.__context__, OSError):  # what f.write raised in torch
                raise
            raise OSError(e.__context__.errno, e.__context__.strerror, f.name) from None
        meta = {"format": FORMAT, "version": VERSION, "config": config, **info}
        meta["files"] = {WEIGHTS: _file_facts(tmp / WEIGHTS)}
        meta = json.loads(json.dumps(meta))  # as a reader will see it
        meta["digest"] = _digest(meta)
        with naming(tmp / INFO):
            (tmp / INFO).write_text(json.dumps(meta, indent=1))


def _file_facts(path: Path) -> list:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return [path.stat().st_size, h.hexdigest()]


def _digest(meta: dict) -> str:
    rest = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def read_model(folder) -> tuple[dict, dict]:
    """(model.json's content, the state dict) of the saved model in ``folder``, checked
    (one process): ModelError naming the file for a missing folder or file, a model.json
    that is not mgg's or was edited, a model.pt of another size or hash (truncated,
    edited), or one that holds anything but tensors."""
    folder = Path(folder)
    info_path, weights = folder / INFO, folder / WEIGHTS
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is a file, not a model folder"
        raise ModelError(f"model {folder} {what} (mgg train --save writes one)")
    try:
        meta = json.loads(info_path.read_text())
    except FileNotFoundError:
        raise ModelError(f"{info_path}: missing: {folder} is not a saved model") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{info_path}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelError(f"{info_path}: not an mgg saved model (format {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise ModelError(f"{info_path}: version {meta.get('version')!r}; this mgg reads {VERSION}")
    if meta.get("digest") != _digest(meta):
        raise ModelError(
            f"{info_path}: does not match its digest: it was edited after it was written"
        )
    try:
        facts = _file_facts(weights)
    except OSError as e:
        raise ModelError(f"{weights}: {e.strerror or e}") from None
    want = (meta.get("files") or {}).get(WEIGHTS)
    if facts != want:
        size = f"{facts[0]:,} bytes, {want[0]:,} written" if want else f"{facts[0]:,} bytes"
        what = "truncated or extended" if want and facts[0] != want[0] else "changed"
        raise ModelError(f"{weights}: {what} since it was written ({size}): save the model again")
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
        raise ModelError(f"{weights}: unreadable ({first_line(e)})") from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelError(f"{weights}: not a state dict of named tensors")
    return meta, state


def load_model(folder, comm=None) -> torch.nn.Module:
    """The model saved in ``folder`` (mgg train --save), its weights loaded, in eval mode
    and on the CPU; ``model.saved``: model.json's content (model name and hyper-parameters,
    dtype, knobs, node order, the data it was trained on, the selected epoch and its
    scores). Collective with ``comm``: rank 0 reads and checks the files, every rank gets
    the model (or rank 0's ModelError)."""
    meta, state = on_root(comm, lambda: read_model(folder), (ModelError,), ModelError)
    info = Path(folder) / INFO
    cfg = dict(meta.get("config") or {})
    try:
        name = cfg.pop("model")
        args = [cfg.pop(k) for k in ("in_dim", "out_dim")]
        named = {k: cfg.pop(v) for k, v in (("hidden", "hidden"), ("layers", "num_layers"))}
        named.update(dropout=cfg.pop("dropout"), seed=cfg.pop("seed", 0))
        model = build_model(name, *args, **named, **cfg)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelError(
            f"{info}: its config does not build a model ({type(e).__name__}: {e})"
        ) from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        line = str(e).strip().splitlines()[0][:200]
        raise ModelError(f"{Path(folder) / WEIGHTS}: does not fit its config ({line})") from None
    model.saved = meta
    return model.eval()
