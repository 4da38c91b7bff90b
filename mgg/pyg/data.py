"""Data: this rank's share of a dataset in PyG's shape, and ``load``, which makes it."""

from __future__ import annotations

import os
import sys

from .. import process
from ..comm.base import Comm
from ..errors import ArgumentTypeError, InputError
from ..graph.core import GRAPH_KINDS
from ..graph.dataset import Dataset
from ..graph.specs import BEG_SUFFIX, resolve
from ..partition.shards import ShardedDataset, is_sharded
from ..prepare import prepare
from ..torch import Rows, SparseRows
from ..torch.edges import EdgeIndex
from ..torch.interop import as_tensor
from ..torch.plan_arrays import PlanArrays
from .transforms import BaseTransform


class Data:
    """PyG's Data for one rank: ``x`` [n, F] (Rows, or SparseRows for bag-of-words
    features), ``y`` [n] and the masks [n] (Rows), ``edge_index`` (this rank's edges
    [2, E]: mgg.torch.edges.EdgeIndex, whose ops take the whole graph's meaning; mgg's
    layers take it as the job's graph), ``edge_weight`` [E] under T.GCNNorm, ``adj_t``
    under T.ToSparseTensor (the job's DistGraph ``g``), ``edge_attr`` None;
    ``num_nodes`` counts every rank's nodes, ``node_ids`` [n] (numpy) the original id of
    each row."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def keys(self) -> list[str]:
        return [k for k in self.__dict__ if not k.startswith("_")]

    def __call__(self, *keys):
        """(key, value) of ``keys`` (default: all), as PyG's ``data(...)``."""
        for k in keys or self.keys():
            yield k, getattr(self, k)

    def __getitem__(self, key: str):
        return getattr(self, key)

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__

    def to(self, *args, **kwargs) -> Data:
        """Itself: the rows already live on the job's device."""
        return self

    def __repr__(self) -> str:
        g = self.g
        return f"Data(rank {g.rank} of {g.size}: {self.num_nodes} nodes, x {tuple(self.x.shape)})"


def load(
    source,
    comm=None,
    *,
    transform: BaseTransform | None = None,
    kind: str = "as_is",
    row_normalize: bool = False,
    seed: int = 0,
    **knobs,
) -> Data:
    """This rank's Data of ``source`` (a file, spec or sharded-dataset folder mgg reads, or
    a Dataset). ``comm``: the job's (default: mgg.comm.get_comm() when launched on several
    ranks). ``transform`` (mgg.pyg.transforms) or ``kind`` (the graph's: 'as_is',
    'gcn_norm', 'self_loops', 'no_self_loops') and ``row_normalize`` shape what is
    prepared; knob keywords (``ps=``, ``split=``, ``order=``, ``dtype=``, ...) configure
    the job (mgg.prepare.prepare). Layers that need another kind of graph derive it from
    the one kept here. In a job of several ranks, rank 0 alone prints (the others'
    stdout goes to /dev/null; MGG_PRINT_ALL=1 keeps it): the script's metrics are the
    whole graph's on every rank."""
    _check_source(source)
    opts = _options(comm, transform, kind, row_normalize, seed)
    if comm is None and process.job_size() > 1:
        from ..comm import get_comm

        comm = get_comm()
    if comm is not None and comm.rank > 0 and os.environ.get("MGG_PRINT_ALL") != "1":
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - rank 0 alone prints
    if isinstance(source, Dataset | ShardedDataset):
        dataset = source
    elif is_sharded(str(source)):
        dataset = ShardedDataset(str(source))
    else:
        dataset = resolve(str(source))
    g, local = prepare(
        dataset,
        comm,
        opts["kind"],
        row_normalize=opts["row_normalize"],
        seed=seed,
        keep_source=True,
        **knobs,
    )
    x = local.x
    if isinstance(x, SparseRows):
        x.g = g
    else:
        x = Rows.of(x, g)
    graph = {"adj_t": g} if opts["adj_t"] else {}
    if not opts.get("remove_edge_index") or not opts["adj_t"]:
        graph["edge_index"] = EdgeIndex.of(g)
        if g.kind == "gcn_norm":  # T.GCNNorm's weights, as PyG's transform sets them
            w = as_tensor(PlanArrays.of(g).weights)
            graph["edge_weight"] = w.to(x.dtype if x.dtype.is_floating_point else w.dtype)
    return Data(
        x=x,
        y=Rows.of(local.y, g),
        train_mask=Rows.of(local.train_mask, g),
        val_mask=Rows.of(local.val_mask, g),
        test_mask=Rows.of(local.test_mask, g),
        edge_attr=None,
        **graph,
        num_nodes=g.plan.num_nodes,
        num_features=local.num_features,
        num_classes=local.num_classes,
        node_ids=local.node_ids,
        g=g,
        notes=local.notes,
    )


def _check_source(source) -> None:
    if not isinstance(source, str | os.PathLike | Dataset | ShardedDataset):
        raise ArgumentTypeError(
            f"load: source must be a path, a dataset spec (str) or an mgg Dataset, got "
            f"{type(source).__name__}"
        )
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not path.strip():
            raise InputError("load: source is empty: give a graph file, folder or dataset spec")
        gone = not os.path.exists(path) and not os.path.exists(path + BEG_SUFFIX)
        if gone and os.sep in path and ":" not in os.path.basename(path):
            raise InputError(f"load: source {path}: no such file or folder")


def _options(comm, transform, kind, row_normalize, seed) -> dict:
    """load's options, each checked where it enters (one line naming the argument)."""
    if comm is not None and not isinstance(comm, Comm):
        raise ArgumentTypeError(
            f"load: comm must be the job's mgg.comm communicator (mgg.comm.get_comm()) or "
            f"None, got {type(comm).__name__}"
        )
    if not isinstance(kind, str) or kind not in GRAPH_KINDS:
        raise InputError(f"load: kind must be one of {', '.join(GRAPH_KINDS)}, got {kind!r}")
    if not isinstance(row_normalize, bool):
        raise ArgumentTypeError(f"load: row_normalize must be True or False, got {row_normalize!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**31 - 1:
        raise InputError(f"load: seed must be an integer in [0, 2147483647], got {seed!r}")
    opts = {"kind": kind, "row_normalize": row_normalize, "adj_t": False}
    if transform is None:
        return opts
    if isinstance(transform, type) and issubclass(transform, BaseTransform):
        raise ArgumentTypeError(
            f"load: transform is the class {transform.__name__}: give an instance, "
            f"T.{transform.__name__}()"
        )
    if not isinstance(transform, BaseTransform):
        raise ArgumentTypeError(f"load: transform: {transform!r} is not one of mgg.pyg.transforms")
    out = transform.options(opts)
    if kind != "as_is" and out["kind"] != kind:
        raise InputError(
            f"load: kind={kind!r} and transform={transform!r} both set the graph's kind: give one"
        )
    return out


__all__ = ["Data", "load"]
