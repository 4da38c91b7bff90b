"""MessagePassing with PyG's contract over the distributed graph (NGra's SAGA: Scatter,
ApplyEdge, Gather, ApplyVertex).

``propagate(g, **kwargs)`` calls the subclass's ``message(x_j, x_i, edge_attr, ...)``
over this rank's in-edges, each edge once on the rank of its destination: ``*_j`` are the
sources' rows (this rank's, or a peer's through the halo), ``*_i`` the destinations';
then ``aggregate`` (sum, mean, max, min at each destination; handed the graph as
``graph`` where its signature takes it) and ``update``. Autograd
runs through all of it. A subclass that has a ``message_and_aggregate(g, ...)`` (mgg's
fused kernels: GCNConv, GATConv) runs it instead while ``fuse`` is True; with
``fuse = False`` the same layer runs the generic path (bench/message_passing.py).

Per-edge tensors ([E, ...], ``edge_attr``, ``edge_weight``) are in ``edge_index(g)``'s
order: the rank's local edges, then its remote ones.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..errors import ArgumentTypeError, InputError
from .aggregation import halo
from .checks import InputRows, check_device, check_edge_values, check_graph, check_output
from .dropouts import edge_index
from .edges import EdgeIndex
from .interop import Op, as_array, as_tensor
from .plan_arrays import PlanArrays

AGGRS = {"add": "sum", "sum": "sum", "mean": "mean", "max": "amax", "min": "amin"}


def scatter(msg: torch.Tensor, index: torch.Tensor, n: int, reduce: str = "sum"):
    """[E, ...] messages reduced at their destinations ``index`` [E] (rows in [0, n));
    rows without a message are 0 (PyG's). reduce: sum, mean, max, min (or add, amax,
    amin)."""
    how = AGGRS.get(reduce, reduce)
    if how not in AGGRS.values():
        raise InputError(f"scatter: reduce must be one of {', '.join(AGGRS)}, got {reduce!r}")
    _check_index("scatter", msg, "msg", index)
    out = msg.new_zeros((n, *msg.shape[1:]))
    if how == "sum":
        return out.index_add(0, index, msg)
    idx = index.view(-1, *[1] * (msg.ndim - 1)).expand_as(msg)
    return out.scatter_reduce(0, idx, msg, how, include_self=False)


def _check_index(who: str, src, name: str, index) -> None:
    """InputError unless ``src`` is a tensor [E, ...] and ``index`` an integer tensor [E]."""
    if not isinstance(src, torch.Tensor) or src.ndim < 1:
        raise ArgumentTypeError(
            f"{who}: {name} must be a tensor [E, ...], got {type(src).__name__}"
        )
    if not isinstance(index, torch.Tensor) or index.ndim != 1 or index.is_floating_point():
        got = (
            f"{index.dtype} {tuple(index.shape)}"
            if isinstance(index, torch.Tensor)
            else type(index).__name__
        )
        raise InputError(f"{who}: index must be an integer tensor [E], got {got}")
    if index.shape[0] != src.shape[0]:
        raise InputError(
            f"{who}: index has {index.shape[0]} entries but {name} has {src.shape[0]} rows: "
            f"one destination per row, index [{src.shape[0]}]"
        )


def _segments(g, t: torch.Tensor, ptr, perm, n: int) -> torch.Tensor:
    """[n, ...]: rows of t [K, ...] summed over each segment (mgg's segment_sum kernel:
    in order, no atomics)."""
    flat = t.flatten(1) if t.dim() > 1 else t.unsqueeze(1)  # [0, ...] too (a rank of none)
    out = g.backend.nn.segment_sum(ptr, perm, as_array(flat), n)
    return as_tensor(out).view(n, *t.shape[1:])


class _Gather(Op):
    """rows [n + H, ...] -> [E, ...] at each edge's source; backward: each source's
    edges summed in order (by-source CSR), not scattered."""

    @staticmethod
    def forward(ctx, whole, g, src):
        ctx.g, ctx.rows = g, whole.shape[0]
        return whole.index_select(0, src)

    @staticmethod
    def backward(ctx, dy):
        _, _, _, ptr, perm = PlanArrays.of(ctx.g).by_src
        return _segments(ctx.g, dy, ptr, perm, ctx.rows), None, None


class _SumAtDst(Op):
    """[E, ...] messages -> [n, ...] summed at their destinations (by-destination CSR);
    backward: each edge reads its destination's gradient."""

    @staticmethod
    def forward(ctx, msg, g, dst):
        ctx.dst = dst
        ptr, perm = PlanArrays.of(g).by_dst
        return _segments(g, msg, ptr, perm, g.num_local_nodes)

    @staticmethod
    def backward(ctx, dy):
        return dy.index_select(0, ctx.dst), None, None


def _kernels_take(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32, torch.float64) and t.ndim >= 1 and t.numel() > 0


def softmax(src: torch.Tensor, index: torch.Tensor, ptr=None, num_nodes: int | None = None):
    """PyG's ``utils.softmax``: softmax of per-edge scores src [E(, H)] over the edges of
    each destination ``index`` [E] (all of a node's in-edges are on its rank)."""
    _check_index("softmax", src, "src", index)
    n = int(index.max()) + 1 if num_nodes is None else num_nodes
    top = scatter(src.detach(), index, n, "max")
    ex = (src - top.index_select(0, index)).exp()
    return ex / (scatter(ex, index, n, "sum").index_select(0, index) + 1e-16)


_ANY_FLOAT = (torch.float64, torch.float32, torch.bfloat16)


def _check_node_rows(t, g, who: str, name: str) -> None:
    """A node tensor given to propagate (x for x_j and x_i): this rank's rows [n, ...]."""
    n = g.num_local_nodes
    if isinstance(t, InputRows):
        raise ArgumentTypeError(
            f"{who}: {name} is {t.what} ({type(t).__name__} {tuple(t.shape)}), which "
            f"messages cannot gather: propagate takes tensors [{n}, ...]; apply a linear "
            f"layer first (nn.Linear, mgg.torch.linear), or pass {name}.to_dense()"
        )
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(
            f"{who}: {name} must be a tensor of this rank's rows [{n}, ...], got {type(t).__name__}"
        )
    if t.ndim == 0 or t.shape[0] != n:
        raise InputError(
            f"{who}: {name} must be this rank's rows [{n}, ...] (rank {g.rank} owns {n} nodes "
            f"[{g.lb}, {g.ub})), got shape {tuple(t.shape)}"
        )
    check_device(t, g, who, name)


class MessagePassing(nn.Module):
    """Base class of message-passing layers: PyG's ``propagate`` / ``message`` /
    ``aggregate`` / ``update``, with the job's DistGraph g in place of edge_index.

    aggr   'add' (= 'sum'), 'mean', 'max' or 'min'
    kinds  the graph kinds the layer runs on (mgg.graph.core.GRAPH_KINDS); ``edges``
           gives the one it needs of a g (derived from g's source when it is another)
    """

    kinds = ("as_is", "no_self_loops", "self_loops")  # any but GCN's normalized weights
    fuse = True

    def __init__(self, aggr: str = "add", *, flow: str = "source_to_target", node_dim=-2):
        super().__init__()
        if aggr not in AGGRS:
            raise InputError(f"aggr must be one of {', '.join(AGGRS)}, got {aggr!r}")
        if flow != "source_to_target":
            raise InputError(
                "flow: mgg's graph holds each node's in-edges (source_to_target); pass the "
                "transposed graph instead of flow='target_to_source'"
            )
        if node_dim not in (0, -2):
            raise InputError(f"node_dim: mgg keeps nodes in dim 0, got {node_dim}")
        self.aggr = aggr
        sig = inspect.signature(self.message).parameters
        self._message_args = [p for p in sig if p not in ("self", "kwargs")]
        self._update_args = [p for p in inspect.signature(self.update).parameters][1:]
        # a subclass's aggregate with PyG's signature is called with it, without ``graph``
        takes = inspect.signature(self.aggregate).parameters
        self._aggregate_graph = "graph" in takes or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in takes.values()
        )
        self._known = self._arguments()

    def _arguments(self) -> set | None:
        """The keywords ``propagate`` takes: message's (x for x_j and x_i), update's and
        message_and_aggregate's; None where one of them takes any (**kwargs)."""
        known = set()
        fns = [self.message, self.update]
        if type(self).message_and_aggregate is not MessagePassing.message_and_aggregate:
            fns.append(self.message_and_aggregate)
        for fn in fns:
            for name, p in inspect.signature(fn).parameters.items():
                if p.kind is inspect.Parameter.VAR_KEYWORD:
                    return None
                known.add(name)
                if name[-2:] in ("_i", "_j"):
                    known.add(name[:-2])
        return known - {"self", "g", "inputs"}

    def edges(self, g, kind: str | None = None):
        """g as the kind this layer needs: ``kind``, or g itself when its kind is one of
        ``kinds``, else the first of ``kinds`` (DistGraph.derive)."""
        check_graph(g, type(self).__name__)
        if kind is None:
            if g.kind in self.kinds:
                return g
            kind = self.kinds[0]
        return g.derive(kind, f"{type(self).__name__} (its graph is {kind!r})")

    def propagate(self, g, size=None, **kwargs) -> torch.Tensor:
        """message -> aggregate -> update over the in-edges of this rank's nodes."""
        if isinstance(g, EdgeIndex):
            g = g.graph(type(self).__name__)
        who = type(self).__name__
        check_graph(g, who)
        if size is not None:
            raise InputError(f"{who}.propagate: mgg has no bipartite size")
        self._check_arguments(g, kwargs)
        n = g.num_local_nodes
        if self.fusing():
            out = self.message_and_aggregate(g, **kwargs)
            check_output(out, g, f"{who}.message_and_aggregate", n, "nodes", _ANY_FLOAT)
        else:
            src, dst = edge_index(g)
            gathered: dict = {}
            args = {}
            for name in self._message_args:
                args[name] = self._argument(g, name, kwargs, src, dst, n, gathered)
            msg = self.message(**args)
            e = src.shape[0]
            check_output(msg, g, f"{who}.message", e, "edges")
            graph = {"graph": g} if self._aggregate_graph else {}
            out = self.aggregate(msg, index=dst, ptr=None, dim_size=n, **graph)
            check_output(out, g, f"{who}.aggregate", n, "nodes", _ANY_FLOAT)
        y = self.update(out, **{k: kwargs[k] for k in self._update_args if k in kwargs})
        good = isinstance(y, torch.Tensor) and y.ndim > 0 and y.shape[0] == n
        if not good and not isinstance(y, tuple | list):
            rows = f"[{n}, ...] for the {n} nodes of rank {g.rank}"
            if isinstance(y, torch.Tensor):
                raise InputError(
                    f"{who}.update must return a tensor {rows}, got shape {tuple(y.shape)}"
                )
            raise ArgumentTypeError(
                f"{who}.update must return a tensor {rows}, got {type(y).__name__}"
            )
        return y

    def _check_arguments(self, g, kwargs) -> None:
        """propagate's keywords: known to message, update or message_and_aggregate (where
        none takes **kwargs), and edge_weight and edge_attr over this rank's edges."""
        who = f"{type(self).__name__}.propagate"
        known = getattr(self, "_known", None)
        if known is not None:
            unknown = sorted(set(kwargs) - known)
            if unknown:
                takes = ", ".join(sorted(k for k in known if k[-2:] not in ("_i", "_j")))
                raise InputError(
                    f"{who}: unknown argument {unknown[0]!r}: this layer's message, update "
                    f"and message_and_aggregate take {takes or 'nothing'}"
                )
        for name in ("edge_weight", "edge_attr"):
            t = kwargs.get(name)
            if isinstance(t, torch.Tensor):
                check_edge_values(t, g, who, name, ndims=range(1, 8), floating=False)

    def fusing(self) -> bool:
        """Whether ``propagate`` runs ``message_and_aggregate``: ``fuse`` is on, the class
        has one, and ``fused()`` says it fits this layer's settings."""
        has = type(self).message_and_aggregate is not MessagePassing.message_and_aggregate
        return self.fuse and has and self.fused()

    def fused(self) -> bool:
        """Whether this layer's settings have a fused kernel (a subclass's answer)."""
        return True

    def _argument(self, g, name, kwargs, src, dst, n, gathered):
        if name in ("index", "edge_index_i"):
            return dst
        if name == "edge_index_j":
            return src
        if name in ("size_i", "size_j", "dim_size"):
            return n
        if name == "ptr":
            return None
        side = name[-2:]
        if side in ("_i", "_j") and name[:-2] in kwargs:
            t = kwargs[name[:-2]]
            if isinstance(t, tuple | list):  # (x_j's, x_i's): PyG's pair
                t = t[0] if side == "_j" else t[1]
            _check_node_rows(t, g, f"{type(self).__name__}.propagate", name[:-2])
            if side == "_i":
                return t.index_select(0, dst)
            key = id(t)
            if key not in gathered:
                flat = t.flatten(1) if t.dim() > 1 else t.unsqueeze(1)
                whole = torch.cat([flat, halo(flat, g)])
                if _kernels_take(whole):
                    gathered[key] = _Gather.apply(whole, g, src).view(-1, *t.shape[1:])
                else:
                    gathered[key] = whole.index_select(0, src).view(-1, *t.shape[1:])
            return gathered[key]
        if name in kwargs:
            return kwargs[name]
        default = inspect.signature(self.message).parameters[name].default
        if default is inspect.Parameter.empty:
            raise ArgumentTypeError(
                f"{type(self).__name__}.message needs {name!r}: pass it to propagate"
            )
        return default

    def message(self, x_j: torch.Tensor) -> torch.Tensor:
        """[E, ...] messages; by default the sources' rows."""
        return x_j

    def aggregate(self, inputs, index, ptr=None, dim_size=None, graph=None) -> torch.Tensor:
        """[E, ...] -> [n, ...]: ``aggr`` of each destination's messages. ``graph``: the
        DistGraph whose edges they are (``propagate`` passes it), whose sum or mean runs
        mgg's segment sum over them in order; without it (or for max, min) a scatter."""
        how = AGGRS[self.aggr]
        _check_index(f"{type(self).__name__}.aggregate", inputs, "inputs", index)
        if graph is not None:
            e = graph.plan.num_local_edges + graph.plan.num_remote_edges
            if inputs.shape[0] != e:
                raise InputError(
                    f"{type(self).__name__}.aggregate: inputs must be [{e}, ...] for the {e} "
                    f"edges of rank {graph.rank}, got shape {tuple(inputs.shape)}"
                )
        if graph is None or how not in ("sum", "mean") or not _kernels_take(inputs):
            return scatter(inputs, index, dim_size, self.aggr)
        out = _SumAtDst.apply(inputs, graph, index)  # the graph's edges: summed in order
        if how == "mean":
            deg = torch.as_tensor(graph.plan.in_degrees(), dtype=out.dtype, device=out.device)
            deg = deg.clamp(min=1)
            out = out / deg.view(-1, *[1] * (out.ndim - 1))
        return out

    def message_and_aggregate(self, g, **kwargs) -> torch.Tensor:
        """A fused message + aggregate (a subclass's mgg kernel), used while ``fuse``."""
        raise NotImplementedError

    def update(self, inputs: torch.Tensor) -> torch.Tensor:
        """[n, ...] -> the layer's rows; by default the aggregate itself."""
        return inputs


__all__ = ["MessagePassing", "scatter", "softmax", "AGGRS"]
