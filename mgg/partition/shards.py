"""Sharded datasets: a partitioned graph on disk, where rank r opens only its own files.

Layout of ``DIR`` (format ``mgg-shards``, version 2)::

    manifest.json      sizes, bounds, ps, graph kind, node order, the plans' fingerprint
                       and per-rank digests, the source's checksum and edge count,
                       node-data facts, every file's size and blake2b hash, and the
                       digest of all that
    rank-0000/         one folder per rank: shard.json (run id, rank) and .npy arrays,
      local_indptr.npy   the plan (t.* the transposed plan),
      x.npy | x.indptr.npy x.indices.npy x.data.npy,  y.npy, train_mask.npy, ...
      ids.npy            under a node order: the original id of each row (the plans
                         are of the renumbered graph; the node data is the rows')

A writer holds the lock ``.DIR.lock`` beside ``DIR`` (one job per output), fills a
temporary folder beside it (mgg.atomic.temp_path; removed on an error, a Ctrl-C or a
SIGTERM, swept by a later writer after a kill) and renames it to ``DIR`` once the
manifest is written, so a crash never leaves a half-written dataset that reads as valid.
Opening checks the manifest (against its digest: an edited one is refused), the rank
count, and each of the rank's files (present, full size, same hash, same run, the plan's
fingerprint) before any array is used; arrays are memory-mapped.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..atomic import Lock, LockedError, hold, sweep, temp_path
from ..graph.core import GRAPH_KINDS, GraphError
from ..graph.dataset import MASKS, NodeRows
from ..graph.facts import split_rows
from ..knobs import DEFAULTS
from ..precision import BF16, bits
from ..progress import progress
from .plan import PartitionPlan, plan_from_arrays

FORMAT = "mgg-shards"
VERSION = 2  # 2: the manifest's digest
MANIFEST = "manifest.json"


class ShardError(GraphError):
    """A sharded dataset is missing, damaged, or does not fit the job."""


def is_sharded(path) -> bool:
    return os.path.isfile(os.path.join(os.fspath(path), MANIFEST))


def rank_dir(rank: int) -> str:
    return f"rank-{rank:04d}"


# ---- writing ------------------------------------------------------------------------------
@dataclass
class Target:
    """A sharded dataset being written: ``out`` (the user's path), the temporary folder
    ``tmp`` beside it, the run id, and, in the process that began it, the lock on ``out``
    (a pickled copy, as other ranks get it, has none)."""

    out: Path
    tmp: Path
    run: str
    force: bool = False
    lock: Lock | None = None

    def __getstate__(self):
        return {**self.__dict__, "lock": None}

    def named(self, e: OSError, path) -> OSError:
        """``e`` naming the user's file (under ``out``) instead of the temporary one."""
        path = Path(e.filename or path)
        with contextlib.suppress(ValueError):
            path = self.out / path.relative_to(self.tmp)
        return OSError(e.errno, f"cannot write it: {e.strerror or e}", str(path))


def lock_path(out) -> Path:
    """The lock file of output folder ``out``: beside it, as ``out`` itself is replaced."""
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name}.lock"


def check_target(out, force: bool = False) -> None:
    """FileExistsError unless ``out`` may be written (absent, or with ``force`` a sharded
    dataset or an empty folder)."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: already exists (pass --force to replace it)")
    if out.exists() and not (out.is_dir() and (is_sharded(out) or not any(out.iterdir()))):
        raise FileExistsError(f"{out}: exists and is not a sharded dataset; not replacing it")


def begin(out, force: bool = False) -> Target:
    """Lock ``out`` for this job, check it may be written and make the temporary folder
    (stale ones of dead writers beside it are removed first). LockedError naming the
    holder while another job writes ``out``; OSError naming ``out`` when its folder
    cannot be written."""
    out = Path(out)
    full = Path(os.path.abspath(out))
    try:
        full.parent.mkdir(parents=True, exist_ok=True)
        lock = hold(lock_path(out), str(out))
    except LockedError as e:
        raise LockedError(f"{e}: wait until it ends, or write to another --out") from None
    except OSError as e:
        raise OSError(e.errno, f"cannot write it: {_strerror(e)}", str(out)) from None
    try:
        with contextlib.suppress(OSError):  # a leftover that cannot go stops no one
            sweep(full.parent)
        check_target(out, force)
        tmp = temp_path(full)
        try:
            tmp.mkdir()
        except OSError as e:
            raise OSError(e.errno, f"cannot write it: {e.strerror}", str(out)) from None
    except BaseException:
        lock.release()
        raise
    return Target(out, tmp, uuid.uuid4().hex[:12], force, lock)


def _strerror(e: OSError) -> str:
    text = e.strerror or str(e)
    return text.removeprefix("cannot lock it: ")


@contextlib.contextmanager
def writing(target: Target):
    """The block writes into ``target``: on any exception, a Ctrl-C or a SIGTERM (which
    raises KeyboardInterrupt here, as a Ctrl-C) the temporary folder is removed; at the
    end the lock is released."""
    with _sigterm_interrupts():
        try:
            yield target
        except BaseException:
            discard(target)
            raise
        finally:
            if target.lock is not None:
                target.lock.release()


@contextlib.contextmanager
def _sigterm_interrupts():
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_shard(target: Target, plan: PartitionPlan, rows: NodeRows) -> dict:
    """Write rank ``plan.rank``'s files into ``target``; returns {file: [bytes, blake2b]}.
    OSError naming the file (under ``out``) when one cannot be written."""
    d = target.tmp / rank_dir(plan.rank)
    arrays = dict(plan.arrays())
    x = rows.x
    if sp.issparse(x):
        x = sp.csr_matrix(x)
        arrays.update(
            {
                "x.indptr": x.indptr.astype(np.int64),
                "x.indices": x.indices,
                "x.data": x.data.astype(np.float32),
            }
        )
    elif x is not None:  # bf16 features as their 16-bit words (node_info says which)
        arrays["x"] = bits(np.ascontiguousarray(x, BF16 if x.dtype == BF16 else np.float32))
    if rows.y is not None:
        arrays["y"] = np.asarray(rows.y)
    if rows.masks is not None:
        arrays.update({k: np.asarray(m, bool) for k, m in zip(MASKS, rows.masks, strict=True)})
    if rows.ids is not None:  # a node order's: the original id of each row
        arrays["ids"] = np.asarray(rows.ids, np.int64)
    table, path = {}, d
    try:
        d.mkdir()
        for name, a in arrays.items():
            path = d / f"{name}.npy"
            _write_npy(path, a)
            table[name] = [path.stat().st_size, _file_hash(path)]
        path = d / "shard.json"
        path.write_text(json.dumps({"format": FORMAT, "run": target.run, "rank": plan.rank}))
    except OSError as e:
        raise target.named(e, path) from None
    return table


def _write_npy(path: Path, a: np.ndarray) -> None:
    """np.save without pickles, written by Python (numpy's tofile reports a full disk as
    "N requested and M written", without ENOSPC)."""
    a = np.ascontiguousarray(a)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(a))
        f.write(a.reshape(-1).view(np.uint8).data)


def commit(target: Target, plans_info: list[dict], tables: list[dict], info: dict) -> dict:
    """Write the manifest and move the temporary folder to ``out`` (the process holding
    the lock, after every write_shard); ``out`` is checked again first.

    plans_info: per rank {"digest", "fingerprint", "rank"} plus, from any rank, the plan's
    "bounds", "ps", "num_edges", "symmetric"; info: graph_kind, source, name and the node
    data facts. Returns the manifest."""
    out, tmp = target.out, target.tmp
    p0 = plans_info[0]
    prints = {q["fingerprint"] for q in plans_info}
    if len(prints) != 1:
        raise ShardError(f"{out}: the ranks' plans disagree (fingerprints {sorted(prints)})")
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "run": target.run,
        "np": len(plans_info),
        "num_nodes": int(p0["bounds"][-1]),
        "num_edges": int(p0["num_edges"]),
        "ps": int(p0["ps"]),
        "symmetric": bool(p0["symmetric"]),
        "bounds": [int(b) for b in p0["bounds"]],
        "fingerprint": p0["fingerprint"],
        "digests": [q["digest"] for q in plans_info],
        **info,
        "files": tables,
    }
    if manifest["graph_kind"] not in GRAPH_KINDS:
        raise ValueError(f"unknown graph kind {manifest['graph_kind']!r}")
    manifest = seal(manifest)
    try:
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    except OSError as e:
        raise target.named(e, tmp / MANIFEST) from None
    check_target(out, target.force)
    old = None
    if out.exists():
        old = temp_path(os.path.abspath(out))
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return manifest


def discard(target: Target) -> None:
    """Remove the temporary folder (any rank may; they may race)."""
    shutil.rmtree(target.tmp, ignore_errors=True)


def seal(manifest: dict) -> dict:
    """``manifest`` with its ``digest``: the hash of every other key (canonical JSON)."""
    return {**manifest, "digest": _manifest_digest(manifest)}


def _manifest_digest(manifest: dict) -> str:
    rest = {k: v for k, v in manifest.items() if k != "digest"}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def plan_info(plan: PartitionPlan) -> dict:
    return {
        "rank": plan.rank,
        "digest": plan.digest(),
        "fingerprint": plan.fingerprint(),
        "bounds": plan.bounds.tolist(),
        "ps": plan.ps,
        "num_edges": plan.num_edges,
        "symmetric": plan.symmetric,
    }


def labeled_rows(rows: NodeRows) -> int:
    """Rows in a split (train, val or test) of this rank's; every row where no split."""
    if rows.y is None:
        return 0
    count = split_rows(rows.masks)
    return len(rows.y) if count is None else count


def node_info(rows: NodeRows, labeled: int | None = None) -> dict:
    """The manifest's node-data facts (the same on every rank; ``labeled``: the rows in a
    split over every rank, which the memory estimate counts)."""
    x = rows.x
    return {
        "labeled": labeled,
        "name": rows.name,
        "features": None if x is None else ("sparse" if sp.issparse(x) else "dense"),
        "num_features": None if x is None else int(x.shape[1]),
        "feature_dtype": None if x is None else "bfloat16" if x.dtype == BF16 else "float32",
        "num_classes": None if rows.num_classes is None else int(rows.num_classes),
        "labels": rows.y is not None,
        "notes": rows.notes,
    }


def order_info(name: str, seconds: float) -> dict:
    """The manifest's keys for the node order the plans were built in."""
    return {"order": name, "order_seconds": float(seconds)}


def write_sharded(
    out,
    plans: list[PartitionPlan],
    rows: list[NodeRows],
    graph_kind: str,
    source: dict,
    force: bool = False,
    order: dict | None = None,
) -> dict:
    """One process writes all P shards; returns the manifest. ``order``: the node order's
    manifest keys (order_info)."""
    target = begin(out, force)
    with writing(target):
        pairs = zip(plans, rows, strict=True)
        bar = progress(pairs, total=len(plans), desc="write shards", enable=None)
        tables = [write_shard(target, p, r) for p, r in bar]
        labeled = sum(labeled_rows(r) for r in rows)
        info = {"graph_kind": graph_kind, "source": source, **node_info(rows[0], labeled)}
        info.update(order or {})
        return commit(target, [plan_info(p) for p in plans], tables, info)


def _file_hash(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


# ---- reading ------------------------------------------------------------------------------
@dataclass
class Shard:
    """What rank r reads of a sharded dataset: its plan and its rows of the node data."""

    plan: PartitionPlan
    rows: NodeRows


class ShardedDataset:
    """A sharded dataset folder; ``open(rank, size)`` reads one rank's shard.

    Attributes from the manifest: name, num_nodes, num_edges, np, ps, graph_kind,
    num_features, num_classes, features ('dense' | 'sparse' | None), labels (bool).
    """

    def __init__(self, path):
        self.path = Path(path)
        mpath = self.path / MANIFEST
        try:
            m = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise ShardError(f"{self.path}: no {MANIFEST}: not a sharded dataset") from None
        except (OSError, ValueError) as e:
            raise ShardError(f"{mpath}: unreadable manifest ({e})") from e
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise ShardError(f"{mpath}: not an mgg sharded dataset manifest")
        if m.get("version") != VERSION:
            raise ShardError(
                f"{mpath}: format version {m.get('version')!r}, but this mgg reads version "
                f"{VERSION}: write the dataset again with this mgg (mgg partition --out)"
            )
        if m.get("digest") != _manifest_digest(m):
            raise ShardError(
                f"{mpath}: edited after it was written (its content does not match its "
                "digest): write the dataset again with mgg partition --out"
            )
        need = (
            "run",
            "np",
            "num_nodes",
            "num_edges",
            "ps",
            "bounds",
            "graph_kind",
            "digests",
            "files",
            "symmetric",
            "name",
            "fingerprint",
        )
        missing = [k for k in need if k not in m]
        if missing:
            raise ShardError(f"{mpath}: missing keys {', '.join(missing)}")
        if len(m["bounds"]) != m["np"] + 1 or len(m["files"]) != m["np"]:
            raise ShardError(f"{mpath}: bounds or files do not cover {m['np']} ranks")
        self.manifest = m
        for k in (
            "name",
            "num_nodes",
            "num_edges",
            "np",
            "ps",
            "graph_kind",
            "num_features",
            "num_classes",
            "features",
            "labels",
            "symmetric",
        ):
            setattr(self, k, m.get(k))
        self.order = m.get("order") or DEFAULTS.order

    def __repr__(self) -> str:
        return (
            f"ShardedDataset({str(self.path)!r}, {self.num_nodes} nodes, "
            f"{self.num_edges} edges, np={self.np}, {self.graph_kind})"
        )

    def check_job(
        self, size: int, graph_kind: str | None = None, model: str = "", knobs=None,
        order_file=None,
    ) -> None:  # fmt: skip
        """Refuse a job this dataset was not written for: another rank count, another graph
        kind, ``knobs`` (mgg.knobs.Knobs) that were given a split (its ranks were cut
        when it was written) or another node order, or an ``order_file``."""
        if knobs is not None and "split" in knobs.given:
            raise ShardError(
                f"{self.path}: a sharded dataset was split into ranks when it was written "
                "(mgg partition --split); --split does not apply to it"
            )
        wanted = knobs.order if knobs is not None and "order" in knobs.given else None
        if order_file is not None or (wanted is not None and wanted != self.order):
            given = f"--order-file {order_file}" if order_file else f"--order {wanted}"
            raise ShardError(
                f"{self.path}: its nodes were ordered when it was written ({self.order}); "
                f"{given} does not apply to it: partition again with mgg partition --order"
            )
        if size != self.np:
            raise ShardError(
                f"{self.path}: partitioned for {self.np} ranks, but the job has {size}: "
                f"launch with mggrun -np {self.np}, or partition again with --np {size}"
            )
        if graph_kind is not None and graph_kind != self.graph_kind:
            raise ShardError(
                f"{self.path}: partitioned for graph kind {self.graph_kind!r}, but the model "
                f"needs {graph_kind!r}: partition again with --model {model or graph_kind}"
            )

    def open(self, rank: int, size: int) -> Shard:
        """Rank ``rank``'s shard (checked against the manifest first, then memory-mapped)."""
        self.check_job(size)
        m = self.manifest
        d = self.path / rank_dir(rank)
        try:
            sj = json.loads((d / "shard.json").read_text())
        except FileNotFoundError:
            raise ShardError(f"{d}: missing: the shard of rank {rank}") from None
        except (OSError, ValueError) as e:
            raise ShardError(f"{d / 'shard.json'}: unreadable ({e})") from e
        if sj.get("rank") != rank:
            what = f"the shard of rank {sj.get('rank')!r}"
            what = f"a link to {os.readlink(d)}, {what}" if d.is_symlink() else f"a copy of {what}"
            raise ShardError(
                f"{d}: {what}, not of rank {rank}: every rank needs its own folder (write the "
                "dataset again with mgg partition --out)"
            )
        if sj.get("run") != m["run"]:
            raise ShardError(
                f"{d}: from another partitioning run ({sj.get('run')!r}) than "
                f"{self.path / MANIFEST} ({m['run']!r}): shards of two runs are mixed"
            )
        arrays = {}
        for name, (size_b, digest) in m["files"][rank].items():
            path = d / f"{name}.npy"
            try:
                got = path.stat().st_size
            except FileNotFoundError:
                raise ShardError(f"{path}: missing from the shard of rank {rank}") from None
            if got != size_b:
                raise ShardError(f"{path}: {got} bytes, the manifest says {size_b} (truncated?)")
            if _file_hash(path) != digest:
                raise ShardError(f"{path}: contents differ from the manifest's hash (modified)")
            try:
                # features copy-on-write: torch takes them without a copy
                mode = ("c" if name == "x" else "r") if size_b > 256 else None
                a = np.load(path, mmap_mode=mode, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise ShardError(f"{path}: unreadable ({e})") from e
            arrays[name] = np.asarray(a)
        bounds = np.asarray(m["bounds"], np.int64)
        try:
            plan = plan_from_arrays(rank, bounds, m["ps"], m["num_edges"], m["symmetric"], arrays)
        except (ValueError, TypeError) as e:
            raise ShardError(f"{d}: {e}") from e
        if plan.fingerprint() != m["fingerprint"]:
            raise ShardError(
                f"{self.path / MANIFEST}: does not describe the plan of {d} (fingerprint "
                f"{plan.fingerprint()}, the manifest says {m['fingerprint']})"
            )
        n = plan.num_local_nodes
        if plan.local_indptr.size != n + 1 or plan.remote_indptr.size != n + 1:
            raise ShardError(f"{d}: the plan's rows do not match the node range of rank {rank}")
        x = arrays.get("x")
        if x is not None and m.get("feature_dtype") == "bfloat16":
            x = x.view(BF16)
        if "x.indptr" in arrays:
            x = sp.csr_matrix(
                (arrays["x.data"], arrays["x.indices"], arrays["x.indptr"]),
                shape=(n, int(m["num_features"])),
            )
        masks = tuple(arrays[k] for k in MASKS) if MASKS[0] in arrays else None
        rows = NodeRows(
            x,
            arrays.get("y"),
            masks,
            m.get("num_classes"),
            m["name"],
            m.get("notes") or "",
            arrays.get("ids"),
        )
        for what, a in (
            ("features", x),
            ("labels", rows.y),
            ("node ids", rows.ids),
            *zip(MASKS, masks or (), strict=False),
        ):
            if a is not None and a.shape[0] != n:
                raise ShardError(f"{d}: {what} have {a.shape[0]} rows, rank {rank} owns {n}")
        return Shard(plan, rows)
