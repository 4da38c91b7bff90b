"""PyG's own conv classes over the distributed graph: ``distributed(cls)`` is PyG's
``cls`` (its ``__init__``, ``forward``, ``message``, ``aggregate``, ``update`` and
parameters, so state_dicts load both ways) with mgg supplying what is distributed.

The layer gets ``EdgeIndex.of(g)`` for the job's DistGraph g (the graph as loaded:
data.edge_index), whose ops have the whole graph's meaning (mgg.torch.edges): PyG's
``propagate`` gathers x_j through the halo, ``gcn_norm`` and ``degree`` count global
degrees, ``softmax`` spans a destination's in-edges (all on its rank); where the class's
message_and_aggregate is a weighted sum over the graph's edges and loops, mgg's kernel
runs it (``spmm``). Its inputs enter as plain rows (input features in a sparse or
chunked form, dense) and its node outputs come back as Rows; the MessagePassing and
BatchNorm modules inside it (an inner conv, GENConv's MLP) become distributed too, and
while it runs mgg.pyg.inside gives its dropout of rows and its whole-tensor reductions
their meaning across ranks.

Every homogeneous conv of the installed PyG is in RUNS or REFUSED (tests/test_pyg_convs.py
walks torch_geometric.nn.conv): a refused one raises at import with its reason.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_map

from ..distgraph import DistGraph
from ..errors import InputError
from ..precision import torch_dtype
from ..torch.aggregation import aggregate
from ..torch.checks import InputRows
from ..torch.edges import EdgeIndex, running
from ..torch.rows import Rows, plain
from .inside import RanksBatchNorm1d, inside

FUSED = ("GCNConv", "SAGEConv", "GINConv", "GINEConv", "GATConv", "GATv2Conv", "GCN2Conv")
FUSED += ("APPNP", "EdgeConv")  # mgg's own layers (mgg.torch.layers), PyG's signatures

RUNS = (
    "SimpleConv ChebConv GraphConv GatedGraphConv ResGatedGraphConv TransformerConv "
    "AGNNConv TAGConv ARMAConv SGConv SSGConv MFConv GMMConv NNConv CGConv LEConv PNAConv "
    "ClusterGCNConv GENConv FiLMConv SuperGATConv FAConv EGConv PDNConv GeneralConv LGConv "
    "AntiSymmetricConv DirGNNConv MixHopConv WLConvContinuous PointNetConv PPFConv "
    "PointTransformerConv PointGNNConv DNAConv FeaStConv"
).split()

_HETERO = "is heterogeneous (node or edge types): mgg's graph has one node and one edge type"
_POINTS = "builds its graph from the points (k nearest neighbors) inside forward"
REFUSED = {
    "CuGraphSAGEConv": "needs NVIDIA's cugraph-ops: use SAGEConv",
    "CuGraphGATConv": "needs NVIDIA's cugraph-ops: use GATConv",
    "CuGraphRGCNConv": "needs NVIDIA's cugraph-ops, and " + _HETERO,
    "FusedGATConv": "needs the dgNN extension and CSR/CSC inputs: use GATConv",
    "RGCNConv": _HETERO,
    "FastRGCNConv": _HETERO,
    "RGATConv": _HETERO,
    "HGTConv": _HETERO,
    "HEATConv": _HETERO,
    "HANConv": _HETERO,
    "HeteroConv": _HETERO,
    "SignedConv": "takes two graphs (positive and negative edges) of one node set",
    "HypergraphConv": "passes messages over hyperedges, which mgg does not partition",
    "GravNetConv": _POINTS,
    "DynamicEdgeConv": _POINTS,
    "XConv": _POINTS,
    "SplineConv": "needs the torch_spline_conv extension",
    "PANConv": "sums powers of the adjacency matrix through torch_sparse's SparseTensor",
    "WLConv": "colors nodes with torch.unique over every node's neighbor colors",
    "GPSConv": "attends over every node of a graph (dense global attention)",
    "MeshCNNConv": "works on mesh edges with a fixed four-neighbor layout",
}


class RefusedLayer(InputError, ImportError):
    """A PyG layer mgg does not run, with the reason."""


def refused(name: str) -> RefusedLayer:
    return RefusedLayer(f"mgg.pyg.nn.{name}: refused: it {REFUSED[name]}")


class Distributed:
    """Mixin of a PyG MessagePassing class run over the distributed graph (the module's
    contract); ``distributed(cls)`` makes the class."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "forward" in cls.__dict__:  # a user's layer: its own forward, wrapped
            cls.forward = _wrapped(cls.__dict__["forward"])
        for name in ("propagate", "edge_updater"):  # PyG's own, not its generated code
            if name not in cls.__dict__ and hasattr(cls, name):
                setattr(cls, name, getattr(Distributed, name))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, module in self.named_modules():
            if module is not self:
                adopt(module, f"{type(self).__name__}.{name}")

    def forward(self, *args, **kwargs):
        return _forward(self, super().forward, args, kwargs)

    def propagate(self, edge_index, size=None, **kwargs):
        if size is not None:
            raise InputError(f"{type(self).__name__}.propagate: size (a bipartite graph)")
        edge_index = _edges(edge_index, self)
        out = spmm(self, edge_index, kwargs)
        if out is not None:
            return self.update(out)
        return _original(self, "propagate")(self, edge_index, size, **kwargs)

    def edge_updater(self, edge_index, size=None, **kwargs):
        return _original(self, "edge_updater")(self, _edges(edge_index, self), size, **kwargs)


def spmm(layer, edge_index: EdgeIndex, kwargs: dict):
    """PyG's message_and_aggregate (its spmm: a sum or mean of x_j weighted by
    edge_weight) on mgg's aggregation kernel, where the layer's contract says that is what
    its message and aggregate compute and the edges are the graph's and its loops; None
    where not (PyG's own propagate runs)."""
    parts, x, w = edge_index.parts, kwargs.get("x"), kwargs.get("edge_weight")
    g = edge_index.space.g
    if parts is None or edge_index.space.transposed or not _spmm_class(type(layer)):
        return None
    if layer.aggr not in ("add", "sum", "mean") or not layer.fuse or _hooked(layer):
        return None
    if layer.explain or layer.decomposed_layers != 1:
        return None
    if isinstance(x, tuple | list) and len(x) == 2:  # PyG's (sources', destinations')
        x = x[0]  # rows: its spmm reads the sources'
    if set(kwargs) - {"x", "edge_weight"} or not isinstance(x, torch.Tensor):
        return None
    if x.dim() != 2 or x.dtype != torch_dtype(g.dtype) or isinstance(x, InputRows):
        return None
    e0, loops = parts
    if w is not None and (
        w.dim() != 1 or w.dtype != x.dtype or w.shape[0] != e0 + loops * x.shape[0]
    ):
        return None
    out = aggregate(x, g, "sum", weights=None if w is None else w[:e0])
    if loops:
        out = out + (x if w is None else w[e0:, None] * x)
    if layer.aggr == "mean":
        deg = torch.as_tensor(g.plan.in_degrees(), dtype=x.dtype, device=x.device) + loops
        out = out / deg.clamp(min=1)[:, None]
    return out


@functools.cache
def _spmm_class(cls) -> bool:
    """Whether cls's message_and_aggregate is spmm(adj_t, x) (its args x and edge_weight)
    of messages x_j weighted by edge_weight, and update the aggregate itself: then, by
    PyG's contract that both paths agree, mgg's weighted sum computes it."""
    from torch_geometric.inspector import Inspector

    ins = Inspector(cls)
    for name in ("message", "message_and_aggregate", "update"):
        ins.inspect_signature(getattr(cls, name), exclude=[0] if name != "message" else None)
    return (
        ins.implements("message_and_aggregate")
        and set(ins.get_param_names("message")) <= {"x_j", "edge_weight"}
        and set(ins.get_param_names("message_and_aggregate")) <= {"x", "edge_weight"}
        and not ins.get_param_names("update")
    )


def _hooked(layer) -> bool:
    return any(
        getattr(layer, name)
        for name in vars(layer)
        if name.endswith("_hooks") and name.startswith(("_propagate", "_message", "_aggregate"))
    )


def _original(layer, name: str):
    """PyG's ``name`` of the layer's class (not the code PyG generates from it)."""
    mro = type(layer).__mro__
    for cls in mro[mro.index(Distributed) + 1 :]:
        if name in cls.__dict__:
            return cls.__dict__.get(f"_orig_{name}", cls.__dict__[name])
    raise AttributeError(name)


@functools.cache
def distributed(cls):
    """PyG's MessagePassing subclass ``cls`` over the distributed graph (one per class)."""
    if issubclass(cls, Distributed):
        return cls
    if not issubclass(cls, torch.nn.Module):
        raise InputError(f"distributed: {cls.__name__} is not a torch.nn.Module")
    if cls.__name__ in REFUSED:
        raise refused(cls.__name__)
    ns = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    return type(cls.__name__, (Distributed, cls), ns)


def adopt(module: torch.nn.Module, where: str) -> None:
    """A module inside a distributed layer made distributed in place: PyG's convs (an
    inner conv) and torch's BatchNorm1d (statistics over every rank)."""
    from torch_geometric.nn import MessagePassing

    if isinstance(module, MessagePassing) and not isinstance(module, Distributed):
        module.__class__ = distributed(type(module))
    elif type(module) is torch.nn.BatchNorm1d:
        module.__class__ = RanksBatchNorm1d
    elif type(module).__module__.startswith("mgg.torch"):
        raise InputError(
            f"{where} is mgg's fused {type(module).__name__}, which takes the job's graph: "
            f"pass torch_geometric.nn.{type(module).__name__} inside a PyG layer"
        )


def _wrapped(forward):
    @functools.wraps(forward)
    def run(self, *args, **kwargs):
        return _forward(self, functools.partial(forward, self), args, kwargs)

    return run


def _edges(edge_index, layer):
    if isinstance(edge_index, DistGraph):
        if edge_index.kind == "gcn_norm":
            raise InputError(
                f"{type(layer).__name__}: PyG's layer on a graph normalized for GCN (T.GCNNorm, "
                "data.adj_t): mgg hands PyG's layers edge_index without weights; pass "
                "data.edge_index and data.edge_weight, or load the graph as is"
            )
        return EdgeIndex.of(edge_index)
    if isinstance(edge_index, EdgeIndex):
        return edge_index
    raise InputError(
        f"{type(layer).__name__}: edge_index must be the job's graph (data.edge_index, a "
        f"DistGraph) or what a layer made of it, got {type(edge_index).__name__}"
    )


def _forward(layer, forward, args, kwargs):
    g = None

    def enter(a):
        nonlocal g
        if isinstance(a, DistGraph):
            g = g or a
            return _edges(a, layer)
        if isinstance(a, EdgeIndex):
            g = g or a.space.g
        elif isinstance(a, Rows):
            g = g or a.g
            return plain(a)
        elif isinstance(a, InputRows):  # sparse or chunked features: PyG's ops need rows
            g = g or a.g
            if getattr(a, "pyg_dense", None) is None:  # once per features (SGC's epochs)
                a.pyg_dense = plain(a.to_dense())
            return a.pyg_dense
        return a

    args, kwargs = tree_map(enter, (args, kwargs))
    if g is None:
        raise InputError(
            f"{type(layer).__name__}: none of its arguments is the job's graph "
            "(data.edge_index): mgg.pyg.nn's layers run inside an mgg job"
        )
    with inside(g), running(type(layer).__name__):
        out = forward(*args, **kwargs)
    n = g.num_local_nodes

    def leave(t):
        if type(t) is torch.Tensor and t.dim() >= 1 and t.shape[0] == n:
            return Rows.of(t, g)
        return t

    return tree_map(leave, out)


__all__ = ["FUSED", "RUNS", "REFUSED", "Distributed", "distributed", "adopt", "refused"]
