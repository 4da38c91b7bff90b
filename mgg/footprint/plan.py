"""The memory plan: a job's estimate on a dataset, per rank, against what a rank has
(host, and GPU), whether it fits within the usable part, what it decides where the GPU
holds too little (features streamed, activations offloaded: :func:`planned` gives the
Job that does so) and what would make it fit (:func:`fixes`)."""

from __future__ import annotations

import os

from ..errors import ResourceError
from ..graph.dataset import FEATURELESS_IDENTITY_MAX, FEATURELESS_WIDTH
from ..graph.facts import job_facts
from ..job import MAX_RANKS, Job, check_ranks
from ..knobs import DEFAULTS
from ..memory import HEADROOM, LIMIT_ENV, available, held_bytes, usable
from ..precision import row_dtype
from .estimate import ACTIVATION_COPIES, PICKED_COPIES, Parts, check_estimate, chunks, estimate


def model_params(model, in_dim: int, out_dim: int, hidden: int, layers: int, heads: int):
    """(parameters, the largest parameter's size) of the registry's ``model`` (a
    mgg.torch.models Spec) at these sizes, built on torch's meta device: nothing is
    allocated. Remembered: a plan's fixes ask again at the same sizes."""
    key = (model, in_dim, out_dim, hidden, layers, heads)
    try:
        return _PARAMS[key]
    except TypeError:  # a spec that is not hashable
        return _deep_params(*key)
    except KeyError:
        if len(_PARAMS) > 256:
            _PARAMS.clear()
        _PARAMS[key] = _deep_params(*key)
        return _PARAMS[key]


_PARAMS: dict = {}
AFFINE_FROM = 4  # a model this deep or deeper is counted from three shallow copies


def _deep_params(model, in_dim, out_dim, hidden, layers, heads):
    """model_params of a deep model without building its every layer: where the counts
    at AFFINE_FROM, +1 and +2 layers grow by the same step (the middle layers alike) and
    the largest parameter stays, the count at ``layers`` follows that line; otherwise (a
    model whose layers widen with depth) the whole model is built."""
    if layers <= AFFINE_FROM + 2:
        return _model_params(model, in_dim, out_dim, hidden, layers, heads)
    three = [
        _model_params(model, in_dim, out_dim, hidden, AFFINE_FROM + i, heads) for i in range(3)
    ]
    (a, big), (b, big1), (c, big2) = three
    if b - a == c - b and big == big1 == big2:
        return a + (layers - AFFINE_FROM) * (b - a), big
    return _model_params(model, in_dim, out_dim, hidden, layers, heads)


def _model_params(model, in_dim, out_dim, hidden, layers, heads):
    import inspect

    import torch

    kw = {"heads": heads} if "heads" in inspect.signature(model.cls).parameters else {}
    with torch.device("meta"):
        net = model.cls(in_dim, hidden, out_dim, num_layers=layers, **kw)
    sizes = [p.numel() for p in net.parameters()] or [0]
    return sum(sizes), max(sizes)


def job_estimate(ds, ranks: int, command: str, *, model=None, **kw) -> dict[str, int]:
    """The :func:`estimate` of ``command`` on ``ds`` (a Dataset or a ShardedDataset), by
    part. ``model``: the registry's spec (its hidden, layers and heads are the defaults; its
    parameters are counted at the input width the job gives it: F, or for a featureless
    graph one-hot ids or random features); ``kw``: hidden, layers, heads, optimizer, dim
    (None means the default)."""
    check_ranks(ranks)
    kw = {k: v for k, v in kw.items() if v is not None}
    d = job_facts(ds)
    n, c = d["n"], d["classes"]
    if model is not None:
        kw.setdefault("hidden", model.hidden)
        kw.setdefault("layers", model.layers)
        kw.setdefault("heads", getattr(model, "heads", 1))
        kw.setdefault("edge_floats", getattr(model, "edge_floats", 0))
        kw.setdefault("copies", getattr(model, "copies", ACTIVATION_COPIES))
        kw.setdefault("offload_copies", getattr(model, "offload_copies", None))
        kw.setdefault("picked_copies", getattr(model, "picked_copies", PICKED_COPIES))
        kw.setdefault("aggregates", getattr(model, "aggregates", "narrower"))
        graph = getattr(getattr(model, "cls", None), "graph", None)  # the kind its layers take
        kw.setdefault("norms", graph == "gcn_norm" and not d.get("weighted"))
        if command == "train" and hasattr(model, "cls"):
            in_dim = d["features"]
            if d["featureless"]:
                in_dim = n if n <= FEATURELESS_IDENTITY_MAX else FEATURELESS_WIDTH
            try:
                kw["params"], kw["largest_param"] = model_params(
                    model, in_dim, max(c, 1), kw["hidden"], kw["layers"], kw["heads"]
                )
            except (RuntimeError, NotImplementedError, TypeError, ValueError):
                pass  # not buildable on the meta device: dense layers' count (estimate)
    return estimate(
        n,
        d["e"],
        ranks,
        features=d["features"],
        feature_nnz=d["feature_nnz"],
        classes=c,
        multilabel=d["multilabel"],
        command=command,
        sharded=d["sharded"],
        symmetric=d["symmetric"],
        makes_split=d["makes_split"],
        stored=d["stored"],
        labeled=d.get("labeled"),
        **kw,
    )


def check_job(ds, ranks: int, command: str, **kw) -> float:
    """:func:`checked_estimate` in MB."""
    return round(checked_estimate(ds, ranks, command, **kw)["total"] / 2**20, 1)


def checked_estimate(ds, ranks: int, command: str, *, source=None, model=None, **kw) -> dict:
    """The :func:`job_estimate` of ``command`` on ``ds``, checked with
    :func:`check_estimate` before the job allocates. A refusal says what would fit
    (:func:`fixes`)."""
    parts = job_estimate(ds, ranks, command, model=model, **kw)
    d = job_facts(ds)
    c = d["classes"]
    what = f"mgg {command} on {ranks} rank(s)"
    if c > 2**24 and not d["multilabel"]:
        what += (
            f" with {c:,} classes (the largest label is {c - 1:,}; an output layer of {c:,} rows)"
        )
    try:
        check_estimate(parts, source if source is not None else ds.name, what)
        return parts
    except ResourceError as e:
        budget = {"host": available()[0] + held_bytes()}
        ways = fixes(ds, ranks, command, budget, model=model, **kw)
        if ways:
            raise ResourceError(f"{e}; it would fit with {' or '.join(ways)}") from None
        raise


def check_host(out: dict, source, what: str) -> Parts:
    """A GPU job's host check: the largest rank's host parts of ``out`` (:func:`plan` with
    ``device``: the data, the plan, what is offloaded; the run is the GPU's) against what
    this rank has, as :func:`check_estimate`; returns those parts."""
    big = max(out["per_rank"], key=lambda r: r["total_bytes"])
    parts = Parts(big["parts"], total=big["total_bytes"])
    check_estimate(parts, source, what)
    return parts


# ---- the memory plan --------------------------------------------------------------------
# a cuda rank's host (the last four: mgg check's)
HOST_PARTS = ("baseline", "compile", "dataset", "plan", "order", "make_split", "rows",
              "gcn_graph", "oracle", "oracle_graph")  # fmt: skip


def rank_rows(num_nodes: int, ranks: int, bounds=None) -> list[int]:
    """Each rank's node rows: the split's ``bounds`` (P+1) where known, else equal shares."""
    if bounds is not None:
        return [int(b) - int(a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return [(num_nodes * (r + 1)) // ranks - (num_nodes * r) // ranks for r in range(ranks)]


def plan(ds, ranks: int, command: str = "train", *, budget: dict, device: bool = False,
         bounds=None, model=None, suggest: bool = True, budget_of=None, **kw) -> dict:  # fmt: skip
    """The memory plan of ``command`` on ``ds`` (a dataset, or its facts) over ``ranks``:
    per rank (``per_rank``: rank, rows, ``total_bytes`` and ``parts`` on the host, and with
    ``device`` the GPU's as ``device``: the host then holds the data and the plan, the GPU
    the run: its dataset (a shard's plan included), the plan it built, what is offloaded
    and its streamed features, pinned), against ``budget`` (bytes a rank has: 'host', and
    'device'), ``fits``, and,
    with ``suggest``, the ``fixes`` that fit when it does not. A rank fits where its totals
    are within the :func:`usable` part of each budget (``usable``: all but HEADROOM, the
    line its fixes and streamed chunks are chosen against too). A training rank whose GPU
    would not hold it keeps its dense features in host memory and streams them
    (``device["stream_rows"]``: the rows of a chunk, the most that fit: :func:`stream_rows`),
    and where that is not enough, or with ``offload``, its saved activations too
    (``device["offload"]``; the host's part ``offloaded``). ``budget_of``: the budget
    of a job of P ranks (a --np fix's: ranks sharing a node share its memory), default
    ``budget``. More than MAX_RANKS ranks are refused before any loop over them."""
    check_ranks(ranks)
    d = job_facts(ds)
    cap = {k: usable(v) for k, v in budget.items()}
    kw.pop("rows", None)  # each rank's, from bounds
    forced = bool(kw.pop("offload", False)) and command == "train"
    per_rank, memo = [], {}
    for r, rows in enumerate(rank_rows(d["n"], ranks, bounds)):
        if rows not in memo:
            host = job_estimate(d, ranks, command, model=model, rows=rows, **kw)
            gpu, chunk, off = None, 0, False
            if device:
                for off in (False, True) if not forced else (True,):
                    kw_off, chunk = {**kw, "offload": off}, 0
                    gpu = job_estimate(
                        d, ranks, command, model=model, rows=rows, device=True, **kw_off
                    )
                    if gpu["total"] > cap["device"]:
                        chunk = stream_rows(
                            d, ranks, command, budget["device"], model, rows, kw_off
                        )
                        if chunk:
                            gpu = job_estimate(
                                d, ranks, command, model=model, rows=rows, device=True,
                                stream=chunk, **kw_off,
                            )  # fmt: skip
                    if gpu["total"] <= cap["device"] or command != "train":
                        break
                host = {k: host[k] for k in HOST_PARTS if k in host}
                if d["sharded"]:  # a shard's plan is in its dataset
                    host.pop("plan", None)
                if off:
                    host["offloaded"] = gpu.pop("offloaded")
                if chunk and kw.get("backend") == "cuda":  # HostRows: its features, pinned
                    rb = row_dtype(kw.get("dtype") or "float32").itemsize
                    host["pinned"] = rb * rows * d["features"]
                host["total"] = _host_total(host, d["sharded"])
            memo[rows] = host, gpu, chunk, off
        host, gpu, chunk, off = memo[rows]
        item = {"rank": r, "rows": rows, "total_bytes": host["total"], "parts": _parts(host)}
        if gpu is not None:
            item["device"] = {"total_bytes": gpu["total"], "parts": _parts(gpu)}
            if chunk:
                item["device"]["stream_rows"] = chunk
            if off:
                item["device"]["offload"] = True
        per_rank.append(item)
    fits = _fits(per_rank, budget)
    out = {"command": command, "np": ranks, "budget": budget, "usable": cap, "headroom": HEADROOM}
    out.update(fits=fits, per_rank=per_rank)
    if suggest:
        out["fixes"] = (
            [] if fits else fixes(d, ranks, command, budget, model=model, budget_of=budget_of, **kw)
        )
    return out


def _host_total(host: dict, sharded: bool) -> int:
    """A GPU rank's host peak from its parts: all held at once, but a shard's files, mapped
    and read once (the plan to the GPU, the features into pinned memory), are page cache
    by the time the run offloads its activations: the larger of the two phases."""
    if not sharded:
        return sum(host.values())
    held = sum(v for k, v in host.items() if k not in ("dataset", "offloaded"))
    return held + max(host.get("dataset", 0), host.get("offloaded", 0))


def stream_rows(d: dict, ranks: int, command: str, budget: int, model, rows: int, kw) -> int:
    """The most rows of dense input features a chunk streamed through a GPU of
    ``budget`` bytes may hold beside the rest of the training rank within the budget's
    :func:`usable` part (at most its ``rows``); 0 when the job has no dense features to
    stream or a chunk would hold fewer than STREAM_MIN_ROWS (or ``rows``)."""
    if command != "train" or d["feature_nnz"] is not None or not d["features"] or rows < 1:
        return 0
    one = job_estimate(d, ranks, command, model=model, rows=rows, device=True, stream=1, **kw)
    per_row = one["stream"]
    chunk = min(rows, (usable(budget) - (one["total"] - per_row)) // per_row)
    return int(chunk) if chunk >= min(chunks().STREAM_MIN_ROWS, rows) else 0


def _parts(est: dict) -> dict:
    return {k: int(v) for k, v in est.items() if k != "total"}


def _fits(per_rank: list, budget: dict) -> bool:
    """Every rank within the :func:`usable` part of each budget (host, and device)."""
    cap = {k: usable(v) for k, v in budget.items()}
    return all(
        r["total_bytes"] <= cap["host"]
        and ("device" not in r or r["device"]["total_bytes"] <= cap["device"])
        for r in per_rank
    )


def fixes(ds, ranks: int, command: str, budget: dict, *, budget_of=None, **kw) -> list[str]:
    """The flags, each alone, that make the job fit ``budget`` (by :func:`plan`'s rule,
    HEADROOM kept: each planned again with its flag): bfloat16 rows, the output layer for
    the labeled rows only (a model whose last layer can: GCN, SAGE), fewer hidden units
    (halved, down to 8), one design checked at a time, or more ranks (up to 64x, when each
    has its own budget: a GPU each, or MGG_MEMORY_LIMIT); empty when none does. Not
    --recompute: two layers peak in the backward pass with or without it (docs/data.md).
    ``budget_of(P)``: the budget each rank of a P-rank job has (default ``budget``), which
    a --np fix is planned against; never more than MAX_RANKS ranks."""
    device = "device" in budget
    tries = []
    if (kw.get("dtype") or DEFAULTS.dtype) == "float32" and command != "partition":
        tries.append(("--dtype bfloat16", ranks, {"dtype": "bfloat16"}))
    d = job_facts(ds)
    labeled = d.get("labeled")
    if (
        command == "train"
        and kw.get("output_rows", Job.output_rows) == "all"
        and getattr(getattr(kw.get("model"), "cls", None), "picks_rows", False)
        and labeled is not None
        and labeled < d["n"]
    ):
        tries.append(("--output-rows labeled", ranks, {"output_rows": "labeled"}))
    if command == "check" and kw.get("designs", 1) > 1:
        tries.append(("--designs pipelined", ranks, {"designs": 1}))
    hidden = kw.get("hidden") or getattr(kw.get("model"), "hidden", None)
    while command == "train" and hidden and hidden > 8:
        hidden //= 2
        tries.append((f"--hidden {hidden}", ranks, {"hidden": hidden}))
    if device or os.environ.get(LIMIT_ENV, "").strip():
        more = [ranks * k for k in (2, 4, 8, 16, 32, 64) if ranks * k <= MAX_RANKS]
        tries += [(f"--np {p}", p, {}) for p in more]
    found, kinds = [], set()
    for flag, p, change in tries:
        kind = flag.split()[0]
        if kind in kinds:
            continue
        has = budget if p == ranks or budget_of is None else budget_of(p)
        trial = plan(ds, p, command, budget=has, device=device, suggest=False, **kw | change)
        if trial["fits"]:
            found.append(flag)
            kinds.add(kind)
    return found


def job_kw(job: Job, order: str | None = None) -> dict:
    """The estimate's keywords of a training ``job``: its model's spec and sizes (None:
    the model's), optimizer, rows' dtype, node ``order`` (default the job's; "file": an
    order file), recompute, output rows, offload and backend."""
    return dict(
        model=job.spec,
        hidden=job.hidden,
        layers=job.layers,
        heads=job.heads,
        optimizer=job.optimizer,
        dtype=job.dtype,
        order=order or job.knobs.order,
        recompute=job.recompute,
        offload=job.offload,
        output_rows=job.output_rows,
        backend=job.backend,
    )


def planned(job: Job, out: dict | None, rank: int) -> Job:
    """``job`` with what the device plan ``out`` (:func:`plan` with ``device``; None: no
    device plan) decided for ``rank``: dense features streamed ``stream_rows`` at a time,
    activations offloaded."""
    if out is None:
        return job
    dev = out["per_rank"][rank].get("device", {})
    return job.with_plan(dev.get("offload", False), dev.get("stream_rows", 0))
