"""PyG's ``edge_index`` over the distributed graph, with the whole graph's meaning.

``EdgeIndex.of(g)`` is a [2, E] int64 tensor of this rank's edges (each in-edge of its
nodes, once), in local ids: row 0 (a ``SrcIndex``) in [0, n + H), this rank's n rows and
then the H halo rows of its peers; row 1 in [0, n). Torch ops on it and on its sources
mean what they mean on the whole graph:

- ``t[src]``, ``t.index_select(d, src)``, ``t.gather(d, src)`` of a node tensor t [n, ...]:
  the sources' rows, a peer's through the halo (differentiable);
- ``out.scatter_add_(d, src, v)``, ``index_add_``, ``scatter_reduce_('sum')``,
  ``index_put_(accumulate=True)`` into a node tensor [n, ...]: sums at the sources'
  owners, a peer's share sent back (a source's out-degree is its global one);
- ``ei[0]`` (SrcIndex), ``ei[1]`` (local ids), ``ei[:, mask]``, ``cat`` with edges of
  local ids (self loops), ``stack((src, dst))``, ``flip(0)`` (the transposed graph: each
  node's out-edges, on its rank), ``src == dst`` (self loops: a halo id is never local).

Anything else on them raises InputError naming the op and the layer that ran it (never a
per-rank result). Destinations are plain tensors: all of a node's in-edges are on its rank.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..errors import InputError
from .interop import Op, as_array, as_tensor
from .plan_arrays import PlanArrays


class Space:
    """The ids of one rank's edges: local rows [0, n), then H halo rows [n, n + H)."""

    def __init__(self, g, plan, exchange=None, transposed: bool = False):
        self.g, self.plan, self.transposed = g, plan, transposed
        self.n, self.halo_rows = plan.num_local_nodes, plan.num_halo
        self._exchange = exchange
        self.index: EdgeIndex | None = None  # this space's edge_index
        self.flipped: Space | None = None  # the transposed graph's space

    @property
    def exchange(self):
        """Collective on first use: the halo exchange of this space's plan."""
        if self._exchange is None:
            from ..designs.halo import HaloExchange

            self._exchange = self.g.halo if not self.transposed else None
            if self._exchange is None:
                self._exchange = HaloExchange(self.plan, self.g.comm)
        return self._exchange

    def extend(self, t: torch.Tensor, dim: int, what: str) -> torch.Tensor:
        """t [.., n, ..] (nodes in ``dim``) -> [.., n + H, ..]: its halo rows appended."""
        t = _plain(t).movedim(dim, 0)
        self.check_rows(t, what)
        if self.plan.num_ranks == 1:  # no peers: no halo
            return t.movedim(0, dim)
        whole = torch.cat([t, _Halo.apply(t, self.exchange)])
        return whole.movedim(0, dim)

    def fold(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """t [.., n + H, ..] -> [.., n, ..]: the halo rows summed into their owners'."""
        t = t.movedim(dim, 0)
        if self.plan.num_ranks == 1:
            return t.movedim(0, dim)
        out = t[: self.n] + _Owners.apply(t[self.n :], self.exchange)
        return out.movedim(0, dim)

    def everywhere(self, flag) -> bool:
        """Collective: whether ``flag`` holds on every rank (what the ranks decide alike)."""
        if self.plan.num_ranks == 1:
            return bool(flag)
        return bool(self.g.comm.allreduce(np.array([float(bool(flag))]), "min")[0])

    def check_rows(self, t: torch.Tensor, what: str) -> None:
        if t.shape[0] != self.n:
            raise InputError(
                f"{_layer()}{what} with the sources of edge_index: the tensor has "
                f"{t.shape[0]} rows in its node dim, this rank's nodes are {self.n} "
                "(a node tensor holds this rank's rows)"
            )


def _exchange(fn, t: torch.Tensor) -> torch.Tensor:
    work = t.to(torch.uint8) if t.dtype == torch.bool else t
    flat = work.reshape(work.shape[0], int(np.prod(t.shape[1:])))
    out = as_tensor(fn(as_array(flat)))
    return out.view(out.shape[0], *t.shape[1:]).to(t.dtype)


class _Halo(Op):
    """x [n, ...] -> [H, ...] the peers' rows this rank's edges read; backward: summed back."""

    @staticmethod
    def forward(ctx, x, ex):
        ctx.ex = ex
        return _exchange(ex.gather, x)

    @staticmethod
    def backward(ctx, dh):
        return _exchange(ctx.ex.scatter_add, dh), None


class _Owners(Op):
    """h [H, ...] -> [n, ...] each halo row summed into its owner's row (_Halo's adjoint)."""

    @staticmethod
    def forward(ctx, h, ex):
        ctx.ex = ex
        return _exchange(ex.scatter_add, h)

    @staticmethod
    def backward(ctx, dt):
        return _exchange(ctx.ex.gather, dt), None


# ---- the tensors ---------------------------------------------------------------------------


class Tagged(torch.Tensor):
    """EdgeIndex and SrcIndex: their ops (the module's rules)."""

    space: Space | None = None
    # an EdgeIndex's edges as (E0, loops): its first E0 are the plan's, in edge_index(g)'s
    # order, then (loops) one self loop per node in order; None: unknown
    parts: tuple[int, bool] | None = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        space = next(a.space for a in _flat(args, kwargs) if isinstance(a, Tagged))
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(space, func, *args, **kwargs)
        if func in _META:
            return _run(func, args, kwargs)
        if func in _KEEP and isinstance(args[0], Tagged) and len(_tags(args, kwargs)) == 1:
            out = _run(func, args, kwargs)
            if isinstance(out, torch.Tensor) and not out.is_floating_point():
                return _tag(type(args[0]), out, space)
        hint = ""
        if _name(func) in ("max", "amax"):
            hint = " (PyG takes the node count from the largest id where num_nodes is not given)"
        raise InputError(
            f"{_layer()}{_name(func)} on {_what(args, kwargs)}: mgg holds each rank's edges "
            "in local ids and makes only gathers and sums at the sources, the destinations, "
            f"self loops, masks and flip(0) global; this op would give one rank's result{hint}"
        )

    def __repr__(self, **kw):
        return f"{type(self).__name__}({_run(torch.Tensor.__repr__, (self,), {})})"


class EdgeIndex(Tagged):
    """This rank's edges [2, E] in local ids (see the module); ``EdgeIndex.of(g)``."""

    @staticmethod
    def of(g) -> EdgeIndex:
        """The job's graph g (a DistGraph) as PyG's edge_index, made once per graph."""
        arrays = PlanArrays.of(g)
        if arrays.edge_index is None:
            src, dst = (as_tensor(a) for a in arrays.index)
            space = Space(g, g.plan)
            space.index = arrays.edge_index = _tag(EdgeIndex, torch.stack([src, dst]), space)
            space.index.parts = (src.shape[0], False)
        return arrays.edge_index

    def graph(self, who: str):
        """The DistGraph this is the edge_index of (what mgg's fused layers take), when it
        is that graph's own; a changed one (loops, masks, flip) raises."""
        space = self.space
        if space.index is not self or space.transposed:
            raise InputError(
                f"{who}: mgg's fused layer runs over the job's graph, and this edge_index was "
                "changed (loops, masks or flip): pass data.edge_index as loaded, or use PyG's "
                f"class (mgg.pyg.convs.distributed(torch_geometric.nn.{who}))"
            )
        return space.g

    def flipped(self) -> EdgeIndex:
        """The transposed graph's edges (each node's out-edges, on its rank); only the
        job's own edge_index flips (its per-edge order is the transposed plan's)."""
        space = self.space
        if space.flipped is None:
            t = space.plan.transposed
            src = torch.from_numpy(np.asarray(t.edge_slots(), np.int64))
            dst = torch.from_numpy(np.concatenate(t.edge_dst()).astype(np.int64))
            other = Space(space.g, t, transposed=True)
            other.index = _tag(EdgeIndex, torch.stack([src, dst]).to(self.device), other)
            other.flipped, space.flipped = space, other
        return space.flipped.index


class SrcIndex(Tagged):
    """Edge sources in [0, n + H) (see the module)."""


_LAYERS: list[str] = []


@contextlib.contextmanager
def running(name: str):
    """Errors of the ops below name the layer ``name``."""
    _LAYERS.append(name)
    try:
        yield
    finally:
        _LAYERS.pop()


def _layer() -> str:
    return f"{_LAYERS[-1]}: " if _LAYERS else ""


def _tag(cls, t: torch.Tensor, space: Space):
    with torch._C.DisableTorchFunctionSubclass():
        out = t.as_subclass(cls)
    out.space = space
    return out


def _plain(t):
    if isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, torch.nn.Parameter):
        with torch._C.DisableTorchFunctionSubclass():
            return t.as_subclass(torch.Tensor)
    return t


def _flat(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, tuple | list):
            yield from a
        else:
            yield a


def _tags(args, kwargs):
    return [a for a in _flat(args, kwargs) if isinstance(a, Tagged)]


def _unwrap(a):
    if isinstance(a, tuple | list):
        return type(a)(_plain(x) for x in a)
    return _plain(a)


def _run(func, args, kwargs):
    with torch._C.DisableTorchFunctionSubclass():
        return func(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in kwargs.items()})


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def _what(args, kwargs) -> str:
    kinds = {type(a) for a in _tags(args, kwargs)}
    return "edge_index" if EdgeIndex in kinds else "edge_index[0] (the edges' sources)"


def _local(t: torch.Tensor, space: Space, what: str) -> None:
    """Refuse ids outside this rank's nodes where only they have a meaning."""
    t = _plain(t)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= space.n):
        raise InputError(
            f"{_layer()}{what}: its ids are not this rank's nodes [0, {space.n}) (mgg's "
            "edge_index holds local ids; edges added to it join this rank's nodes)"
        )


# ---- handlers ---------------------------------------------------------------------------


def _getitem(space, func, t, idx):
    if isinstance(t, EdgeIndex):
        idx = idx if isinstance(idx, tuple) else (idx,)
        row, rest = idx[0], idx[1:]
        whole = _run(func, (t, idx), {})
        if isinstance(row, int) and row in (0, -2):
            return _tag(SrcIndex, whole, space)
        if isinstance(row, int) and row in (1, -1):
            return whole
        if isinstance(row, slice) and row == slice(None) and len(rest) == 1:
            if not isinstance(rest[0], Tagged):
                out = _tag(EdgeIndex, whole, space)
                keep = rest[0]  # PyG's remove_self_loops on a graph without: all kept
                if isinstance(keep, torch.Tensor) and keep.dtype == torch.bool:
                    if t.parts and space.everywhere(keep.shape[0] == t.shape[1] and keep.all()):
                        out.parts = t.parts
                return out
    elif isinstance(t, SrcIndex) and not _tags((idx,), {}):
        return _tag(SrcIndex, _run(func, (t, idx), {}), space)
    elif isinstance(idx, SrcIndex):
        return space.extend(t, 0, "t[src]")[_plain(idx)]
    elif isinstance(idx, tuple) and isinstance(idx[0], SrcIndex) and not _tags(idx[1:], {}):
        return space.extend(t, 0, "t[src]")[(_plain(idx[0]), *idx[1:])]
    raise InputError(f"{_layer()}indexing {_what((t, idx), {})} this way has no global meaning")


def _setitem(space, func, t, idx, value):
    if isinstance(idx, SrcIndex) and not isinstance(t, Tagged):
        _local(idx, space, "t[src] = v")  # PyG sets self loops' values so: src == dst
        return _run(func, (t, idx, value), {})
    raise InputError(f"{_layer()}assigning into {_what((t, idx), {})} has no global meaning")


def _index_select(space, func, t, dim, index):
    if isinstance(t, Tagged):
        if isinstance(index, Tagged):
            raise InputError(f"{_layer()}index_select of edge_index by its own sources")
        return _tag(type(t), _run(func, (t, dim, index), {}), space)
    dim = dim % t.dim()
    return space.extend(t, dim, "index_select").index_select(dim, _plain(index))


def _gather(space, func, t, dim, index, **kw):
    if isinstance(t, Tagged):
        raise InputError(f"{_layer()}gather from edge_index has no global meaning")
    dim = dim % t.dim()
    return torch.gather(space.extend(t, dim, "gather"), dim, _plain(index), **kw)


def _scatter(space, func, t, dim, index, src, *rest, **kw):
    """scatter_add(_), index_add(_), scatter_reduce(_)('sum'): at the sources' owners."""
    name = func.__name__
    if isinstance(t, Tagged) or isinstance(src, Tagged) or not isinstance(index, SrcIndex):
        raise InputError(f"{_layer()}{name} with edge_index as values has no global meaning")
    if name.startswith("scatter_reduce"):
        reduce = rest[0] if rest else kw.get("reduce")
        if reduce != "sum":
            raise InputError(
                f"{_layer()}scatter_reduce({reduce!r}) at the edges' sources: mgg reduces at "
                "a node's out-edges across ranks only by sum (an in-edge reduction, at the "
                "destinations, takes any)"
            )
        if not kw.get("include_self", rest[1] if len(rest) > 1 else True) and bool(_plain(t).any()):
            raise InputError(f"{_layer()}scatter_reduce(include_self=False) into non-zeros")
        rest, kw, base = (), {}, "scatter_add_"
    else:
        base = name.rstrip("_") + "_"
    dim = dim % t.dim()
    space.check_rows(_plain(t).movedim(dim, 0), name)
    shape = list(t.shape)
    shape[dim] = space.n + space.halo_rows
    ext = _plain(src).new_zeros(shape)
    getattr(ext, base)(dim, _plain(index), _plain(src), *rest, **kw)
    out = space.fold(ext, dim)
    if name.endswith("_"):
        return t.add_(out.to(t.dtype))
    return _plain(t) + out


def _index_put(space, func, t, indices, values, accumulate=False):
    if isinstance(t, Tagged) or len(indices) != 1 or not isinstance(indices[0], SrcIndex):
        raise InputError(f"{_layer()}index_put with edge_index has no global meaning")
    if not accumulate:
        return _setitem(space, torch.Tensor.__setitem__, t, indices[0], values)
    inplace = func.__name__.endswith("_")
    f = torch.Tensor.index_add_ if inplace else torch.Tensor.index_add
    return _scatter(space, f, t, 0, indices[0], values)


def _compare(space, func, a, b):
    if isinstance(a, EdgeIndex) or isinstance(b, EdgeIndex):
        raise InputError(f"{_layer()}{_name(func)} of edge_index as a whole")
    return _run(func, (a, b), {})


def _cat(space, func, tensors, dim=0, **kw):
    kinds = {type(t) for t in tensors if isinstance(t, Tagged)}
    if kinds == {EdgeIndex} and dim in (1, -1):
        for t in tensors:
            if isinstance(t, Tagged) and t.space is not space:
                raise InputError(f"{_layer()}cat of two graphs' edge_index")
            if not isinstance(t, Tagged):
                _local(t, space, "cat(edge_index, edges)")
        out = _tag(EdgeIndex, _run(func, (tensors, dim), kw), space)
        out.parts = _loops_after(tensors, space)
        return out
    if kinds == {SrcIndex} and dim in (0, -1) and all(t.dim() == 1 for t in tensors):
        for t in tensors:
            if not isinstance(t, Tagged):
                _local(t, space, "cat(sources, ids)")
        return _tag(SrcIndex, _run(func, (tensors, dim), kw), space)
    raise InputError(f"{_layer()}cat of {_what((tensors,), {})} this way")


def _loops_after(tensors, space):
    """(E0, True) when ``tensors`` are the plan's edges and then each node's loop."""
    if len(tensors) != 2 or not isinstance(tensors[0], EdgeIndex) or isinstance(tensors[1], Tagged):
        return None
    head, loops = tensors[0].parts, _plain(tensors[1])
    if head is None or head[1]:
        return None
    ids = torch.arange(space.n, device=loops.device)
    same = loops.shape == (2, space.n) and bool((loops == ids).all())
    return (head[0], True) if space.everywhere(same) else None


def _stack(space, func, tensors, dim=0, **kw):
    if len(tensors) == 2 and dim == 0 and not isinstance(tensors[1], Tagged):
        if not isinstance(tensors[0], Tagged):
            _local(tensors[0], space, "stack")
        return _tag(EdgeIndex, _run(func, (tensors, dim), kw), space)
    raise InputError(
        f"{_layer()}stack of edges whose destinations are sources (a reversed graph): use "
        "edge_index.flip(0), the transposed graph"
    )


def _flip(space, func, t, *dims, **kw):
    dims = kw.get("dims", dims[0] if len(dims) == 1 else dims)
    dims = tuple(dims) if isinstance(dims, tuple | list) else (dims,)
    if isinstance(t, EdgeIndex) and dims in ((0,), (-2,)):
        if t is not space.index:
            raise InputError(
                f"{_layer()}flip(0) of an edge_index other than the job's: mgg transposes "
                "the job's graph (pass edge_index.flip(0) before adding edges)"
            )
        return t.flipped()
    raise InputError(f"{_layer()}{_name(func)}{dims} of {_what((t,), {})}")


def _unbind(space, func, t, dim=0):
    if isinstance(t, EdgeIndex) and dim in (0, -2):
        return (_getitem(space, _T.__getitem__, t, 0), _getitem(space, _T.__getitem__, t, 1))
    raise InputError(f"{_layer()}unbind of {_what((t,), {})}")


def _iter(space, func, t):
    return iter(_unbind(space, func, t))


_T = torch.Tensor
_HANDLERS = {
    _T.__getitem__: _getitem,
    _T.__setitem__: _setitem,
    _T.index_select: _index_select,
    torch.index_select: _index_select,
    _T.gather: _gather,
    torch.gather: _gather,
    _T.index_put_: _index_put,
    _T.index_put: _index_put,
    torch.cat: _cat,
    torch.concat: _cat,
    torch.stack: _stack,
    _T.flip: _flip,
    torch.flip: _flip,
    _T.unbind: _unbind,
    torch.unbind: _unbind,
    _T.__iter__: _iter,
}
for _f in ("scatter_add", "scatter_add_", "index_add", "index_add_", "scatter_reduce"):
    _HANDLERS[getattr(_T, _f)] = _scatter
    if hasattr(torch, _f):
        _HANDLERS[getattr(torch, _f)] = _scatter
_HANDLERS[_T.scatter_reduce_] = _scatter
for _f in ("eq", "ne", "__eq__", "__ne__"):
    _HANDLERS[getattr(_T, _f)] = _compare
    if hasattr(torch, _f):
        _HANDLERS[getattr(torch, _f)] = _compare

_META = {
    getattr(_T, name)
    for name in (
        "size dim numel nelement __len__ element_size is_contiguous stride data_ptr "
        "storage_offset is_floating_point is_complex get_device new_zeros new_ones "
        "new_full new_empty new_tensor __format__ __reduce_ex__ __deepcopy__ untyped_storage "
        "__hash__ __bool__"
    ).split()
    if hasattr(_T, name)
}
_META |= {
    getattr(_T, name).__get__
    for name in "shape dtype device layout is_cuda ndim requires_grad is_sparse is_leaf".split()
    + "grad_fn is_meta is_quantized is_nested is_mkldnn is_mps is_xpu".split()
    if hasattr(_T, name)
}
_META |= {torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, torch.numel}
_KEEP = {
    getattr(_T, name)
    for name in (
        "view view_as reshape reshape_as expand expand_as contiguous to long int clone "
        "detach unsqueeze squeeze flatten repeat cpu cuda narrow"
    ).split()
}
_KEEP |= {torch.flatten, torch.unsqueeze, torch.squeeze, torch.reshape, torch.narrow}

__all__ = ["EdgeIndex", "SrcIndex", "Space", "Tagged", "running"]
