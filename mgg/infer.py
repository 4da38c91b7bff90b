"""Full-graph inference with a saved model: every node's prediction or embedding, in
one forward pass over P ranks (any P), written by original node id, each rank its own
rows (``mgg predict``, ``mgg embed``).

Layout of an output folder ``OUT``::

    pred.npy       predict: the class of each node, int64 [N] (multi-label targets:
                   uint8 [N, T], 1 where the score is above 0.5)
    prob.npy       predict: float32 [N, C], softmax probabilities (multi-label: the
                   sigmoid scores)
    emb.npy        embed: [N, D], layer K's output, float32, or bfloat16 stored as its
                   16-bit words (uint16; the manifest's dtype says: ``read_output``)
    manifest.json  written last: what, each file's shape, dtype and stored dtype, the
                   model and dataset, the scores on the dataset's splits, the rank count

Row i of every file is node i of the dataset as given (its original id), whatever the
node order the job ran in. Rank 0 makes the files in a temporary folder beside OUT, every
rank writes its rows into the memory-mapped files, and once all have, rank 0 writes the
manifest and renames the folder to OUT (mgg.atomic.atomic_folder): a job that dies leaves
no OUT, and its temporary folder is swept by the next writer there.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import precision
from .atomic import atomic_folder, check_new, naming
from .errors import InputError, MggError, one_line

FORMAT = "mgg-output"
VERSION = 1
MANIFEST = "manifest.json"
HINT = "give --out a new folder, or remove this one"
# test-only: the name of an output whose write stops once every rank's rows are in, before
# the manifest (a test kills the job there)
STALL = "MGG_TEST_STALL_OUTPUT"


def check_target(out) -> None:
    """FileExistsError naming ``out`` when it exists (before any work)."""
    check_new(out, HINT)


@torch.no_grad()
def predictions(logits: torch.Tensor, multilabel: bool) -> dict[str, np.ndarray]:
    """This rank's pred and prob (see the module's layout) from logits [n, C]."""
    logits = logits.float()
    if multilabel:
        prob = torch.sigmoid(logits)
        pred = (prob > 0.5).to(torch.uint8)
    else:
        prob = torch.softmax(logits, dim=1)
        pred = logits.argmax(1)
    return {"pred": pred.cpu().numpy(), "prob": prob.cpu().numpy()}


def embeddings(rows: torch.Tensor) -> dict[str, np.ndarray]:
    """This rank's emb (float32, or bfloat16's 16-bit words) from a layer's rows [n, D]."""
    rows = rows.detach()
    if rows.dtype == torch.bfloat16:
        return {"emb": rows.view(torch.int16).cpu().numpy().view(np.uint16)}
    return {"emb": rows.float().cpu().numpy()}


def write_output(out, rows: dict[str, np.ndarray], ids: np.ndarray, num_nodes: int,
                 manifest: dict, comm=None) -> dict:  # fmt: skip
    """Collective: write this rank's ``rows`` ({name: array [n, ...]}, the same names,
    dtypes and widths on every rank) at the original node ids ``ids`` [n] into
    OUT/name.npy ([num_nodes, ...]), then the manifest (``manifest``: what the command
    adds, e.g. the model, dataset and scores; ``dtypes``: {name: a stored array's dtype},
    where it is not its numpy dtype). Every node must be some rank's row. Returns the
    manifest; every rank raises any rank's error, and nothing reads as complete."""
    manifest, rank = dict(manifest), 0 if comm is None else comm.rank
    count = len(ids) if comm is None else int(comm.allreduce(np.array([len(ids)]))[0])
    if count != num_nodes:
        raise InputError(f"{out}: the ranks hold {count} rows of a {num_nodes}-node graph")
    shapes = {k: (num_nodes, *v.shape[1:]) for k, v in rows.items()}
    dtypes = manifest.pop("dtypes", {})
    facts = {"format": FORMAT, "version": VERSION, "num_nodes": int(num_nodes),
             "ranks": 1 if comm is None else comm.size, **manifest}  # fmt: skip
    facts["files"] = {
        f"{k}.npy": {
            "shape": list(shapes[k]),
            "stored": v.dtype.name,
            "dtype": dtypes.get(k, v.dtype.name),
        }
        for k, v in rows.items()
    }
    if rank != 0:
        folder = _share(comm, None)  # rank 0's temporary folder, or its error
        if isinstance(folder, str):
            raise InputError(folder)
        _fill(folder, rows, ids, out, comm)
        result = _share(comm, None)
        if isinstance(result, str):
            raise InputError(result)
        return result
    try:
        with atomic_folder(out, HINT) as folder:
            for k, v in rows.items():
                with naming(folder / f"{k}.npy"):
                    np.lib.format.open_memmap(folder / f"{k}.npy", "w+", v.dtype, shapes[k])
                    _reserve(folder / f"{k}.npy")
            _share(comm, folder)
            bad = _fill(folder, rows, ids, out, comm)
            if bad:
                raise InputError(bad)
            if os.environ.get(STALL) == Path(out).name:
                print(f"stalled writing {folder}", file=sys.stderr, flush=True)
                time.sleep(600)
            with naming(folder / MANIFEST):
                (folder / MANIFEST).write_text(json.dumps(facts, indent=1))  # then the rename
    except (MggError, OSError) as e:
        _share(comm, one_line(e))  # in place of the folder or of the result: peers raise it
        raise
    _share(comm, facts)
    return facts


def _reserve(path: Path) -> None:
    """Allocate the blocks of ``path`` (a sparse file open_memmap made) now, so that a
    full disk is an OSError here, not a SIGBUS in a rank's store to the map."""
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)


def _share(comm, value):
    """``value`` from rank 0 to every rank (collective; alone: ``value``)."""
    return value if comm is None or comm.size == 1 else comm.bcast(value, root=0)


def _fill(folder: Path, rows: dict, ids, out, comm) -> str | None:
    """Collective: write this rank's rows into the files; the first rank's error, if any."""
    error = None
    try:
        for k, v in rows.items():
            mm = np.load(folder / f"{k}.npy", mmap_mode="r+")
            mm[ids] = v
            mm.flush()
            del mm
    except OSError as e:
        error = f"{Path(out) / Path(e.filename or '').name}: cannot write it: {e.strerror}"
    errors = [error] if comm is None or comm.size == 1 else comm.allgather(error)
    return next((e for e in errors if e), None)


def read_output(out) -> dict[str, np.ndarray]:
    """The arrays of a complete output folder ({name: array [N, ...]}, memory-mapped;
    bfloat16 as ml_dtypes' numpy dtype): InputError naming the folder when it has no
    manifest (not written by mgg, or its job did not finish) or a file is missing or of
    another shape."""
    out = Path(out)
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except FileNotFoundError:
        raise InputError(
            f"{out}: no {MANIFEST}: not an mgg output folder, or its job did not finish"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{out / MANIFEST}: unreadable ({e})") from None
    if manifest.get("format") != FORMAT:
        raise InputError(f"{out / MANIFEST}: not an mgg output manifest")
    arrays = {}
    for name, f in manifest["files"].items():
        try:
            a = np.load(out / name, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise InputError(f"{out / name}: unreadable ({e})") from None
        if list(a.shape) != f["shape"] or a.dtype.name != f["stored"]:
            raise InputError(
                f"{out / name}: {a.dtype.name} {list(a.shape)}, its manifest says "
                f"{f['stored']} {f['shape']}"
            )
        if f["dtype"] != f["stored"]:
            a = a.view(precision.row_dtype(f["dtype"]))
        arrays[Path(name).stem] = a
    return arrays
