"""The distributed graph as differentiable torch ops.

Every op works on this rank's rows (n = ub - lb of a mgg.distgraph.DistGraph ``g``) and
is collective when the job has several ranks: every rank calls the same ops in the same
order, forward and backward (SPMD). Tensors reach mgg's kernels without a copy: numpy
views of CPU tensors, DLPack between torch and CuPy on GPUs.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..arrays import array_module, held, is_sparse, on_gpu, to_host
from ..distgraph import DistGraph
from ..errors import InputError
from ..precision import BF16, accumulator, holds_bf16, is_bf16, torch_dtype

# ---- tensors <-> arrays ------------------------------------------------------------------


def as_array(t: torch.Tensor):
    """A numpy (CPU) or cupy (GPU) view of a tensor's data (made contiguous first); a
    bfloat16 tensor's is a BF16 numpy array, or the uint16 words on the GPU (cupy has
    no bf16: mgg.precision)."""
    t = t.detach().contiguous()
    if t.is_cuda:
        return _cupy_view(t)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def as_tensor(a) -> torch.Tensor:
    """A tensor sharing a numpy or cupy array's memory (BF16 arrays, and cupy's uint16
    words, as bfloat16)."""
    if on_gpu(a):
        if holds_bf16(a):  # cupy's bf16: its uint16 words
            return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_dlpack(a)
    a = np.ascontiguousarray(a)
    if holds_bf16(a):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _cupy_view(t: torch.Tensor):
    """A cupy array over a contiguous CUDA tensor's memory, made from its pointer: a few
    microseconds, where DLPack's exchange costs about a tenth of a millisecond a call.
    Both libraries then work on one stream (the legacy default one, or the stream of a
    captured step: mgg.torch.graphs.cupy_on), so no ordering is needed; where their
    streams differ the exchange goes through DLPack, which orders them."""
    import cupy

    if t.dtype == torch.bfloat16:
        return _cupy_view(t.view(torch.int16)).view(np.uint16)
    mine = torch.cuda.current_stream(t.device).cuda_stream
    if t.numel() == 0 or mine != cupy.cuda.get_current_stream().ptr:
        return cupy.from_dlpack(t)
    dtype = _numpy_dtype(t.dtype)
    nbytes = t.numel() * dtype.itemsize
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, t.device.index)
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(mem, 0))


class Op(torch.autograd.Function):
    """An autograd Function over mgg's kernels. Its forward and backward run CuPy on
    torch's current stream, in whichever thread runs them: autograd runs a CUDA backward
    on a thread of its own, where CuPy's stream is its default (the legacy one), while
    torch's is the forward's (a captured step's stream: mgg.torch.graphs)."""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for name in ("forward", "backward"):
            method = cls.__dict__.get(name)
            if isinstance(method, staticmethod):
                setattr(cls, name, staticmethod(_on_torch_stream(method.__func__)))


def _on_torch_stream(fn):
    @functools.wraps(fn)
    def run(*args):
        if not torch.cuda.is_initialized() or not any(
            isinstance(a, torch.Tensor) and a.is_cuda for a in args
        ):
            return fn(*args)
        import cupy

        ptr = torch.cuda.current_stream().cuda_stream
        if ptr == cupy.cuda.get_current_stream().ptr:
            return fn(*args)
        with cupy.cuda.ExternalStream(ptr, torch.cuda.current_device()):
            return fn(*args)

    return run


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)


class InputRows:
    """Input features, which need no gradient: they are only dropped out (``dropout``)
    and multiplied (``linear``), so they may stay in a form no tensor op takes:
    SparseRows (a CSR matrix) or ChunkedRows (dense rows used a chunk at a time;
    HostRows: in host memory, streamed). With the job's DistGraph ``g`` they take
    ``F.dropout`` and ``F.linear`` (``nn.Linear``) as a tensor does, giving Rows."""

    g = None
    what = "input features"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        import torch.nn.functional as F

        from .rows import Rows

        x, kwargs = args[0], kwargs or {}
        if func is F.linear and x.g is not None:
            return Rows.of(linear(*args, **kwargs), x.g)
        if func is F.dropout and x.g is not None:
            return dropout(x, x.g, *args[1:], **{k: v for k, v in kwargs.items() if k != "inplace"})
        raise TypeError(
            f"{getattr(func, '__name__', func)} on {cls.what} ({cls.__name__}): mgg "
            "multiplies them (F.linear, nn.Linear, mgg layers) and drops them out "
            "(F.dropout); x.to_dense() gives a tensor"
        )

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return 2

    ndim = property(dim)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        if self.g is None:
            return t
        from .rows import Rows

        return Rows.of(t, self.g)


class SparseRows(InputRows):
    """This rank's rows of sparse input features: a CSR matrix [n, F] (scipy on the CPU,
    cupyx on the GPU), multiplied by ``linear`` without ever being densified."""

    what = "sparse input features"

    def __init__(self, m, g=None):
        self.m, self.g = m, g

    @property
    def shape(self):
        return self.m.shape

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.m.dtype)

    def to(self, *args, **kwargs) -> SparseRows:
        """Itself: the rows already live on the job's device."""
        return self

    def __getitem__(self, rows) -> torch.Tensor:
        """The dense rows a mask or index [n] selects (Rows when the graph is known)."""
        return self._dense(self.m[as_array(rows) if isinstance(rows, torch.Tensor) else rows])

    def to_dense(self) -> torch.Tensor:
        """[n, F] dense rows (Rows when the job's graph is known)."""
        return self._dense(self.m)

    def _dense(self, m) -> torch.Tensor:
        return self._rows(as_tensor(m.toarray()))

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if on_gpu(self.m) else "cpu")

    def __repr__(self):
        return f"SparseRows(shape={self.shape}, nnz={self.m.nnz})"


class _SparseLinear(Op):
    @staticmethod
    def forward(ctx, weight, x: SparseRows):
        ctx.x = x
        return as_tensor(x.m @ as_array(weight).T)

    @staticmethod
    def backward(ctx, dy):
        return as_tensor((ctx.x.m.T @ as_array(dy)).T), None  # CSC @ dense: no transpose


class ChunkedRows(InputRows):
    """This rank's dense input features [n, F], used ``chunk`` rows at a time: dropout and
    the first layer's GEMM (``linear``) run chunk by chunk, and the backward drops each
    chunk out again, so no dropped-out copy of every row is ever held. ``rows`` live on
    the job's device (mgg.torch.Model reads its input so in training when its first layer
    multiplies before it aggregates anyway); HostRows keep them in host memory.
    ``dropout`` gives ChunkedRows whose chunks are dropped out with the masks of the whole
    rows (keyed by global row)."""

    what = "input features used a chunk at a time"

    def __init__(self, rows: torch.Tensor, g, chunk: int, device=None, drops=()):
        if int(chunk) < 1:
            raise ValueError(f"{type(self).__name__}: chunk must be >= 1 row, got {chunk}")
        self.rows, self.g, self.chunk = rows, g, int(chunk)
        self.device = torch.device(device if device is not None else rows.device)
        self.drops = tuple(drops)  # each dropout's (key, threshold, scale, key_at), in order

    @property
    def shape(self):
        return tuple(self.rows.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.rows.dtype

    def to(self, *args, **kwargs) -> ChunkedRows:
        """Itself: the rows stay where they are."""
        return self

    def dropped(self, drop) -> ChunkedRows:
        """These rows with one more dropout, ``drop``: (key, threshold, scale, key_at)."""
        return type(self)(self.rows, self.g, self.chunk, self.device, (*self.drops, drop))

    def __getitem__(self, rows) -> torch.Tensor:
        """The rows a mask or index [n] selects, on the device, dropped out (Rows when the
        graph is known)."""
        if self.drops:  # the masks are keyed by global row: drop every row, then select
            return self._rows(self._whole()[rows])
        rows = rows.to(self.rows.device) if isinstance(rows, torch.Tensor) else rows
        return self._rows(self.rows[rows].to(self.device))

    def to_dense(self) -> torch.Tensor:
        """[n, F] on the device, dropped out: every row at once (Rows when the graph is known)."""
        return self._rows(self._whole())

    def _whole(self) -> torch.Tensor:
        return self._drop(self.rows.to(self.device), 0)

    def _cuts(self) -> list[tuple[int, int]]:
        n = self.shape[0]
        size = max(1, min(self.chunk, n))
        return [(s, min(s + size, n)) for s in range(0, n, size)]

    def chunks(self):
        """(start, stop, the rows [stop - start, F] on the device, dropped out) for each
        chunk in order."""
        for s, e in self._cuts():
            yield s, e, self._drop(self.rows[s:e], s)

    def _drop(self, t: torch.Tensor, start: int) -> torch.Tensor:
        """t: rows start.. of these rows, with their dropouts (keyed by global row)."""
        lb, drop = self.g.lb + start, self.g.backend.nn.dropout_dense
        for key, threshold, scale, key_at in self.drops:
            t = as_tensor(drop(as_array(t), key, lb, threshold, scale, key_at))
        return t

    def __repr__(self):
        name = type(self).__name__
        return f"{name}(shape={self.shape}, chunk={self.chunk}, device={self.device})"


class HostRows(ChunkedRows):
    """ChunkedRows kept in host memory (pinned when the job runs on a GPU) and streamed
    through ``device`` a chunk at a time, the copy of chunk k+1 overlapped with the work on
    chunk k (NeuGraph's streaming): what a job does whose features do not fit on the device
    beside the rest (mgg.memory.plan sizes the chunks). On the CPU backend the device is
    simulated: a copy thread fills the two chunk buffers, as a GPU's copy engine does."""

    what = "input features streamed from host memory"

    @classmethod
    def of(cls, x, g, chunk: int) -> HostRows:
        """x [n, F] (a numpy array or a CPU tensor) kept on the host, pinned when ``g``
        runs on a GPU, streamed to g's device."""
        t = x if isinstance(x, torch.Tensor) else as_tensor(x)
        if not g.backend.gpu:
            return cls(t, g, chunk)
        return cls(t.pin_memory(), g, chunk, torch.device("cuda", torch.cuda.current_device()))

    def chunks(self):
        """ChunkedRows.chunks, the next chunk copied while the caller works on this one."""
        cuts = self._cuts()
        size, f = (cuts[0][1] if cuts else 1), self.shape[1]
        bufs = [torch.empty((size, f), dtype=self.dtype, device=self.device) for _ in cuts[:2]]
        copies = _Copies(self.device)

        def put(k):
            s, e = cuts[k]
            copies.put(k, bufs[k % 2][: e - s], self.rows[s:e])

        try:
            if cuts:
                put(0)
            for k, (s, e) in enumerate(cuts):
                if k + 1 < len(cuts):
                    put(k + 1)
                copies.wait(k)
                yield s, e, self._drop(bufs[k % 2][: e - s], s)
                copies.free(k)
        finally:
            copies.close()


class _Copies:
    """Host-to-device copies into a chunk's buffer, beside the work on the previous chunk:
    on a GPU, a side stream and events (``put`` k waits until buffer k % 2 was ``free``d
    by chunk k - 2's work; ``wait`` k: the work waits for its copy); on the CPU, a copy
    thread."""

    def __init__(self, device: torch.device):
        self.gpu, self.pending = device.type == "cuda", {}
        if self.gpu:
            self.main = torch.cuda.current_stream(device)
            self.side = _side_stream(device)
            self.side.wait_stream(self.main)  # forks a captured step's stream, too
            self.freed = {}

    def put(self, k: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        if not self.gpu:
            self.pending[k] = _copy_thread().submit(dst.copy_, src)
            return
        with torch.cuda.stream(self.side):
            if k - 2 in self.freed:
                self.side.wait_event(self.freed.pop(k - 2))
            dst.copy_(src, non_blocking=True)
            self.pending[k] = torch.cuda.Event()
            self.pending[k].record(self.side)

    def wait(self, k: int) -> None:
        done = self.pending.pop(k)
        if self.gpu:
            self.main.wait_event(done)
        else:
            done.result()

    def free(self, k: int) -> None:
        if self.gpu:
            self.freed[k] = torch.cuda.Event()
            self.freed[k].record(self.main)

    def close(self) -> None:
        """Nothing left in flight: the work joins the copies (and a captured step's side
        stream rejoins its own)."""
        if self.gpu:
            self.main.wait_stream(self.side)
        else:
            for done in self.pending.values():
                done.result()
        self.pending.clear()


@functools.cache
def _side_stream(device: torch.device):
    return torch.cuda.Stream(device)


@functools.cache
def _copy_thread():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(1, thread_name_prefix="mgg-copy")


class _ChunkedLinear(Op):
    @staticmethod
    def forward(ctx, weight, x: ChunkedRows):
        ctx.x = x
        w = weight.to(x.dtype).T  # bf16 rows: a bf16 copy of the master weights, as ``like``
        y = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
        for s, e, rows in x.chunks():
            torch.mm(rows, w, out=y[s:e])
        return y

    @staticmethod
    def backward(ctx, dy):
        """dW = Σ_chunks dyᵀ·x, each chunk read again (its dropout again), multiplied in
        the rows' dtype and the chunks summed in float32. bf16 on a GPU: cuBLAS sums in
        float32 and hands each chunk's product over in float32 (out_dtype); elsewhere it
        is rounded to bf16 once per chunk, as torch's bf16 GEMM returns it."""
        dw = None
        for s, e, rows in ctx.x.chunks():
            if rows.is_cuda and rows.dtype == torch.bfloat16:
                part = torch.mm(dy[s:e].T, rows, out_dtype=torch.float32)
            else:
                part = (dy[s:e].T @ rows).float()
            dw = part if dw is None else dw.add_(part)
        return dw, None


def linear(x, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x Wᵀ + b.  x [n, in] dense tensor, SparseRows or ChunkedRows; W [out, in]; b [out].
    y has x's dtype: bfloat16 rows multiply a bf16 copy of the (float32, master) weights,
    summed in float32 by the backend's GEMM; sparse features give float32."""
    if isinstance(x, SparseRows):
        y = _SparseLinear.apply(weight, x)
        return y if bias is None else y + bias
    if isinstance(x, ChunkedRows):
        y = _ChunkedLinear.apply(weight, x)
        return y if bias is None else y + like(bias, y)
    return torch.nn.functional.linear(x, like(weight, x), None if bias is None else like(bias, x))


def like(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Parameter p in the dtype of rows x when x is bfloat16 (a differentiable cast: the
    gradient reaches the float32 master p), else p itself."""
    return p.to(x.dtype) if x.dtype == torch.bfloat16 and p.dtype != x.dtype else p


# ---- aggregation -------------------------------------------------------------------------

OPS = ("sum", "mean", "gcn", "gin")


class _Aggregate(Op):
    @staticmethod
    def eps_stays(eps, x) -> bool:
        """Whether gin's eps stays where it is, on the GPU beside x (reading it would wait
        for the device): the kernel then computes x + sum, and eps x is added after it,
        forward and backward."""
        return eps is not None and eps.is_cuda and eps.device == x.device

    @staticmethod
    def forward(ctx, x, wl, wr, eps, g, op):
        weights = None if wl is None else (as_array(wl), as_array(wr))
        ctx.g, ctx.op, ctx.weighted = g, op, weights is not None
        on_device = _Aggregate.eps_stays(eps, x)
        ctx.eps = float(eps) if eps is not None and not on_device else 0.0
        keep = ctx.weighted or (eps is not None and eps.requires_grad)
        ctx.save_for_backward(x if keep else None, wl, wr, eps if on_device else None)
        out = as_tensor(g.aggregate(as_array(x), op, weights=weights, eps=ctx.eps))
        return out.addcmul_(x, eps) if on_device else out

    @staticmethod
    def backward(ctx, dout):
        g, op = ctx.g, ctx.op
        x, wl, wr, eps = ctx.saved_tensors
        dy = as_array(dout)
        dx = dwl = dwr = deps = None
        acc = accumulator(g.dtype)
        if ctx.needs_input_grad[3]:  # gin: out = (1 + eps) x + sum_u x_u
            deps = row_dot(x, dout)
        if ctx.needs_input_grad[0]:
            if op == "mean":  # out_v = sum_u x_u / deg_v: scale, then the transposed sum
                inv = as_tensor(_inverse_in_degrees(g, acc))[:, None]
                dx = g.aggregate(as_array(scaled_rows(dout, inv)), "sum", transpose=True)
            elif ctx.weighted:
                wt = g.edge_transpose(as_array(wl), as_array(wr))
                dx = g.aggregate(dy, "sum", transpose=True, weights=wt)
            else:  # sum, gcn, gin: the same op over the transposed plan
                dx = g.aggregate(dy, op, transpose=True, eps=ctx.eps)
            dx = as_tensor(dx)
            if eps is not None:  # eps_stays: + eps dout
                dx = dx.addcmul_(dout, eps)
        if ctx.weighted and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            dwl, dwr = edge_weight_grads(g, as_array(x), dy, 1 if wl.ndim == 1 else wl.shape[1])
            dwl, dwr = as_tensor(dwl), as_tensor(dwr)
            if wl.ndim == 1:
                dwl, dwr = dwl[:, 0], dwr[:, 0]
        return dx, dwl, dwr, deps, None, None


# bf16 rows with float32 factors or sums take this many float32 bytes of rows at a time:
# torch's CPU ops promote whole operands to float32 first (4x a bf16 copy of the rows)
ROW_BLOCK_BYTES = 256 << 20


def _row_blocks(t: torch.Tensor):
    """(start, end) of t's rows [n, D], a block of ROW_BLOCK_BYTES in float32 at a time."""
    n = t.shape[0]
    step = max(1, ROW_BLOCK_BYTES // (4 * max(t[:1].numel(), 1)))
    return ((s, min(s + step, n)) for s in range(0, n, step))


def scaled_rows(t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """t [n, D] times scale [n, 1] (float32) in t's dtype: each product in float32, rounded
    once, with no float32 copy of t."""
    if t.dtype == scale.dtype:
        return t * scale
    out = torch.empty_like(t)
    for s, e in _row_blocks(t):
        torch.mul(t[s:e], scale[s:e], out=out[s:e])
    return out


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[1]: the sum of a * b over rows [n, D] in their dtype (bf16 rows: in float32, a
    block at a time)."""
    if a.dtype != torch.bfloat16:
        return (a * b).sum().reshape(1)
    total = torch.zeros(1, dtype=torch.float32, device=a.device)
    for s, e in _row_blocks(a):
        total += (a[s:e].float() * b[s:e].float()).sum()
    return total


def picked(t: torch.Tensor, g) -> torch.Tensor:
    """t [n, D] over the rows of ``g`` -> the rows it computes: t itself, or for a graph
    restricted to some rows (DistGraph.restricted) those rows [L, D]."""
    if g.rows is None:
        return t
    return t.index_select(0, as_tensor(_held(g, "rows", lambda: (g.rows,))[0]))


def _held(g, key, build) -> tuple:
    """build()'s host arrays, once per graph, on the job's device (arrays.held)."""
    return held(g.cache, key, g.backend.xp, build)


def _inverse_in_degrees(g, dtype):
    """[n]: 1/in-degree of each local node (0 without in-edges)."""

    def build():
        deg = g.plan.in_degrees()
        return (np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0).astype(dtype),)

    return _held(g, ("inverse_in_degrees", np.dtype(dtype).str), build)[0]


def edge_weight_grads(g, x, dy, heads: int):
    """(local [El, H], remote [Er, H]): d loss / d w_e = <dy_v, x_u> per head, for the
    forward plan's edges u -> v (SDDMM; remote sources from the halo)."""
    p = g.plan
    lp, li, rp, rs = _held(
        g,
        "sddmm_csr",
        lambda: (p.local_indptr, p.local_indices, p.remote_indptr, p.remote_slot),
    )
    nn = g.backend.nn
    return nn.sddmm(lp, li, dy, x, heads), nn.sddmm(rp, rs, dy, g.halo.gather(x), heads)


def aggregate(x: torch.Tensor, g, op: str = "sum", weights=None, eps=None) -> torch.Tensor:
    """Aggregate x [n, D] over the in-edges of this rank's nodes; returns [n, D].

    op       'sum', 'mean' (0 for nodes without in-edges), 'gcn' (the plan's weights) or
             'gin': (1 + eps) x + sum (eps a tensor [1] or a float)
    weights  per-edge weights for a weighted sum: a tensor [E] or [E, H] (H heads of D/H
             columns each) over the edges in ``edge_index(g)`` order, local then remote
    Differentiable in x, eps and the weights; the backward runs over the transposed plan.
    x must have the DistGraph's dtype (``g.dtype``: float32 by default; the cpu backend
    also aggregates float64, with ``DistGraph.build(..., dtype=np.float64)``), and the
    weights its accumulator's. In a bfloat16 job (``dtype="bfloat16"``) float32 rows are
    rounded to bf16 on entry (as torch.autocast casts a matmul's input), the output is
    bf16, and the weights are float32; any other dtype is refused, never cast.
    """
    if op not in OPS:
        raise ValueError(f"unknown aggregation op {op!r}; choose one of {', '.join(OPS)}")
    x = _rows_in(x, g, "aggregate")
    if (op == "gin") != (eps is not None):
        raise ValueError("eps goes with op 'gin', and only with it")
    if eps is not None and not isinstance(eps, torch.Tensor):
        eps = torch.tensor([float(eps)])
    if weights is None:
        return _Aggregate.apply(x, None, None, eps, g, op)
    if op != "sum":
        raise ValueError(f"edge weights make a weighted sum, not {op!r}")
    if is_bf16(g.dtype) and isinstance(weights, torch.Tensor) and weights.is_floating_point():
        weights = weights.float()  # bf16 rows take float32 weights
    _check_tensor(weights, g, "weights", "[E] or [E, H]", (1, 2), accumulator(g.dtype))
    el = g.plan.num_local_edges
    if weights.shape[0] != el + g.plan.num_remote_edges:
        raise ValueError(
            f"weights have {weights.shape[0]} rows but rank {g.rank} holds "
            f"{el + g.plan.num_remote_edges} edges"
        )
    return _Aggregate.apply(x, weights[:el], weights[el:], None, g, op)


def _rows_in(x, g, what: str):
    """x checked as this rank's rows [n, D] in the job's dtype (float32 rounded to bf16
    in a bfloat16 job)."""
    check_rows(x, g, what)
    if is_bf16(g.dtype) and isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        x = x.to(torch.bfloat16)
    _check_tensor(x, g, "x", "[n, D]", (2,))
    return x


class _GCN2(Op):
    @staticmethod
    def forward(ctx, x, x0, w, g, op, alpha, beta):
        out = as_tensor(g.aggregate(as_array(x), op)).lerp_(x0, alpha)  # a fresh array
        ctx.save_for_backward(out, w)
        ctx.g, ctx.op, ctx.alpha, ctx.beta = g, op, alpha, beta
        return torch.addmm(out, out, w, beta=1.0 - beta, alpha=beta)

    @staticmethod
    def backward(ctx, dy):
        out, w = ctx.saved_tensors
        a, b, s = ctx.alpha, ctx.beta, (1.0 - ctx.alpha) or 1.0
        # (1-α) d out = (1-α) dy ((1-β) I + β Wᵀ): Â's share scaled in the GEMM, so Âᵀ
        # takes no pass of its own and x₀'s share is one
        dout = torch.addmm(dy, dy, w.t(), beta=(1.0 - b) * s, alpha=b * s)
        dw = torch.mm(out.t(), dy).mul_(b) if ctx.needs_input_grad[2] else None
        dx = dx0 = None
        if ctx.needs_input_grad[0]:
            dx = as_tensor(ctx.g.aggregate(as_array(dout), ctx.op, transpose=True))
            if a == 1:
                dx.zero_()
        if ctx.needs_input_grad[1]:
            dx0 = dout.mul(a / s)
        return dx, dx0, dw, None, None, None, None


def gcn2(x, x0, weight, g, op: str, alpha: float, beta: float) -> torch.Tensor:
    """GCNII's layer (shared weights) in one op: y = out ((1-β) I + β W) with
    out = (1-α) Â x + α x₀, Â the aggregation ``op`` ('gcn' or 'sum'). x, x₀ [n, C],
    W [C, C] -> y [n, C]; differentiable in all three. The backward scales and sums in
    its GEMM: four passes over the rows fewer than aggregate, lerp and addmm under
    autograd (a 64-layer GCNII step on Cora: 1.05-1.12x, A/B in one process)."""
    if op not in ("gcn", "sum"):
        raise ValueError(f"gcn2 aggregates with 'gcn' or 'sum', not {op!r}")
    x = _rows_in(x, g, "gcn2")
    x0 = x0.to(x.dtype)
    if x0.shape != x.shape:
        raise ValueError(f"gcn2: x0 is {tuple(x0.shape)}, x {tuple(x.shape)}")
    return _GCN2.apply(x, x0, like(weight, x), g, op, float(alpha), float(beta))


def check_graph(g, what: str) -> None:
    """TypeError unless ``g`` is a DistGraph: what every op and layer checks first."""
    if not isinstance(g, DistGraph):
        raise TypeError(
            f"{what}: the graph argument g must be the job's DistGraph, got "
            f"{type(g).__name__}: mgg layers run inside an mgg job (mgg.train.prepare or "
            "DistGraph.build makes it)"
        )


def _check_tensor(t, g, name: str, shape: str, ndims: tuple, dtype=None) -> None:
    """InputError unless ``t`` is a tensor ``shape`` (of ``ndims`` dimensions) in
    ``dtype`` (default the job's)."""
    want = torch_dtype(g.dtype if dtype is None else dtype)
    if not isinstance(t, torch.Tensor) or t.ndim not in ndims:
        got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"aggregate: {name} must be a {want} tensor {shape}, got {got}")
    if t.dtype != want:
        raise InputError(
            f"aggregate: {name} is {t.dtype} but this job aggregates {want} (the DistGraph's "
            f"dtype): pass {name}.to({want}), or build the DistGraph with that dtype "
            "(float32 or bfloat16; the cpu backend also float64)"
        )


def check_rows(x, g, what: str) -> None:
    """Clear errors for the tensors a layer gets: this rank's rows, on the job's device."""
    check_graph(g, what)
    if not isinstance(x, torch.Tensor | InputRows) or not x.shape:
        raise TypeError(
            f"{what}: x must be a tensor of this rank's rows (or InputRows), got {type(x).__name__}"
        )
    if x.shape[0] != g.num_local_nodes:
        raise ValueError(
            f"{what}: the input has {x.shape[0]} rows but rank {g.rank} owns "
            f"{g.num_local_nodes} nodes [{g.lb}, {g.ub})"
        )
    if (x.device.type == "cuda") != g.backend.gpu:
        raise ValueError(
            f"{what}: the input is on {x.device} but the job runs on the {g.backend.name} backend"
        )


# ---- per-node rows and reductions across ranks ------------------------------------------


class _Halo(Op):
    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        a = as_array(x)
        return as_tensor(g.halo.gather(a))

    @staticmethod
    def backward(ctx, dh):
        a = as_array(dh)
        return as_tensor(ctx.g.halo.scatter_add(a)), None


def halo(x: torch.Tensor, g) -> torch.Tensor:
    """x [n, k] -> [H, k]: the rows of peers that this rank's remote edges read, in halo
    order (edge e of the remote CSR reads row remote_slot[e]). Differentiable."""
    check_rows(x, g, "halo")
    return _Halo.apply(x, g)


def _allreduce(comm, a):
    """a (numpy or cupy) summed over the ranks (on the host: MPI is not CUDA-aware), on
    a's device."""
    return array_module(a).asarray(comm.allreduce(np.ascontiguousarray(to_host(a))))


class _AllReduce(Op):
    @staticmethod
    def forward(ctx, t, comm):
        ctx.comm = comm
        return as_tensor(_allreduce(comm, as_array(t)))

    @staticmethod
    def backward(ctx, dt):
        return as_tensor(_allreduce(ctx.comm, as_array(dt))), None


def all_reduce(t: torch.Tensor, g) -> torch.Tensor:
    """The sum of ``t`` over the ranks of the job (differentiable: every rank's share of
    the loss depends on the sum, so the gradient is summed the same way)."""
    check_graph(g, "all_reduce")
    if g.comm is None or g.size == 1:
        return t
    return _AllReduce.apply(t, g.comm)


def sync_gradients(params, comm) -> None:
    """Sum every parameter's gradient over the ranks, in one flat buffer (a parameter
    without a gradient counts as zeros), so any torch.optim optimizer then takes the same
    step on every rank. Call it between ``loss.backward()`` and ``optimizer.step()``."""
    params = [p for p in params if p.requires_grad]
    if comm is None or comm.size == 1 or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    for p, total in zip(params, allreduce_flat(comm, grads), strict=True):
        p.grad = total


def allreduce_flat(comm, tensors, dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Each tensor summed over the ranks, all in one allreduce of a flat buffer (in
    ``dtype``, default the first tensor's); each back in its shape, dtype and device."""
    dtype = tensors[0].dtype if dtype is None else dtype
    flat = torch.cat([t.detach().reshape(-1).to(dtype) for t in tensors])
    total = as_tensor(_allreduce(comm, as_array(flat)))
    out, i = [], 0
    for t in tensors:
        k = t.numel()
        out.append(total[i : i + k].view_as(t).to(t.device, t.dtype).clone())
        i += k
    return out


# ---- rank-invariant dropout ---------------------------------------------------------------


class _Recompute(Op):
    """y = fn(x), keeping only x: fn runs again in the backward pass, with the dropout keys
    and ``module``'s buffers (batch statistics) it had, and its parameters' gradients
    accumulate from there."""

    @staticmethod
    def forward(ctx, x, fn, module, g, *params):
        ctx.fn, ctx.module, ctx.g, ctx.stream = fn, module, g, g.keys.dropout_stream
        if isinstance(x, torch.Tensor):
            ctx.save_for_backward(x)
        else:
            ctx.x = x  # InputRows: no gradient
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def backward(ctx, dy):
        x = ctx.saved_tensors[0] if ctx.saved_tensors else ctx.x
        wants = isinstance(x, torch.Tensor) and ctx.needs_input_grad[0]
        if isinstance(x, torch.Tensor):
            x = x.detach().requires_grad_(wants)
        buffers = [b.clone() for b in ctx.module.buffers()]
        keys = ctx.g.keys
        stream, keys.dropout_stream = keys.dropout_stream, ctx.stream
        try:
            with torch.enable_grad():
                y = ctx.fn(x)
        finally:
            keys.dropout_stream = stream
            with torch.no_grad():
                for b, saved in zip(ctx.module.buffers(), buffers, strict=True):
                    b.copy_(saved)
        torch.autograd.backward(y, dy)
        return (
            x.grad if wants else None,
            None,
            None,
            None,
            *[None] * (len(ctx.needs_input_grad) - 4),
        )


def recompute(fn, x, module: torch.nn.Module, g) -> torch.Tensor:
    """``fn(x)`` (x [n, D] or InputRows) whose intermediate tensors are not kept for the
    backward pass but computed again there (NGra's recomputation): a layer's memory falls
    to its input, for one more forward of the layer, aggregation included, per step.
    ``module``: what fn runs (its parameters get their gradients; its buffers are restored
    after the second run)."""
    params = [p for p in module.parameters() if p.requires_grad]
    return _Recompute.apply(x, fn, module, g, *params)


def _mask_args(p: float, g, dtype=np.float32):
    """(key, threshold, scale, key_at): key_at, a captured step's key slot or None, is
    where the kernels read the key from instead."""
    key, key_at = g.next_dropout_key()
    threshold = np.uint32(min(int(p * 2**32), 2**32 - 1))
    key_at = None if key_at is None else as_array(key_at)
    return key, threshold, np.dtype(dtype).type(1.0 / (1.0 - p)), key_at


class _Dropout(Op):
    @staticmethod
    def forward(ctx, x, g, key, threshold, scale, key_at):
        ctx.nn, ctx.args = g.backend.nn, (key, g.lb, threshold, scale, key_at)
        return as_tensor(ctx.nn.dropout_dense(as_array(x), *ctx.args))

    @staticmethod
    def backward(ctx, dy):
        dx = ctx.nn.dropout_dense(as_array(dy), *ctx.args)  # the same mask
        return as_tensor(dx), None, None, None, None, None


def dropout(x, g, p: float = 0.5, training: bool = True):
    """Zero each entry with probability p and scale the rest by 1/(1-p), in training.

    Whether entry (v, j) survives depends only on (seed, step, the call's place in the
    step, global row v, j), never on the number of ranks: P ranks draw the masks of one
    process. x: [n, D] tensor, SparseRows (stored entries only; no gradient) or ChunkedRows
    (applied to each chunk as it is used).
    """
    check_rows(x, g, "dropout")
    if not 0 <= p < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    dtype = x.m.dtype if isinstance(x, SparseRows) else x.dtype
    key, threshold, scale, key_at = _mask_args(p, g, accumulator(dtype))
    if isinstance(x, ChunkedRows):
        return x.dropped((key, threshold, scale, key_at))
    if isinstance(x, SparseRows):
        m = g.backend.nn.dropout_csr(x.m, key, g.lb, threshold, scale, key_at)
        return SparseRows(m, x.g)
    return _Dropout.apply(x, g, key, threshold, scale, key_at)


def edge_dropout(w: torch.Tensor, g, p: float, training: bool = True) -> torch.Tensor:
    """Dropout of per-edge values w [E, H] (GAT's attention), keyed by each edge's global
    (dst, src) and head, so the masks do not depend on the number of ranks."""
    check_graph(g, "edge_dropout")
    if not 0 <= p < 1:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if not training or p == 0:
        return w
    key, threshold, scale, key_at = _mask_args(p, g)
    dst, src = edge_ids(g)
    heads = w.shape[1] if w.ndim == 2 else 1
    n = g.plan.num_nodes
    mask = g.backend.nn.edge_dropout(dst, src, heads, n, key, threshold, scale, key_at)
    mask = as_tensor(mask).to(w.dtype)
    return w * (mask if w.ndim == 2 else mask[:, 0])


# ---- the edges, as index tensors -----------------------------------------------------------


def edge_ids(g):
    """(dst, src) int64 arrays [E]: global ids of the rank's edges, local then remote."""
    check_graph(g, "edge_ids")

    def build():
        p = g.plan
        keys = np.concatenate(p.edge_keys())
        return keys // p.num_nodes, keys % p.num_nodes

    return _held(g, "edge_ids", build)


def edge_index(g, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) int64 tensors [E] over the rank's edges, local then remote: dst is a
    local row in [0, n); src indexes the rows of cat([x, halo(x, g)]) ([n + H, k])."""
    check_graph(g, "edge_index")

    def build():
        return g.plan.edge_slots(), np.concatenate(g.plan.edge_dst())

    src, dst = (as_tensor(a) for a in _held(g, "edge_index", build))
    return (src, dst) if device is None else (src.to(device), dst.to(device))


def as_features(x, device: str = "cpu"):
    """Input features as what layers take: a tensor on ``device``, SparseRows when
    sparse, or InputRows as they are."""
    if is_sparse(x):
        return SparseRows(x)
    if isinstance(x, torch.Tensor | InputRows):
        return x
    return as_tensor(x).to(device)


# ---- attention ------------------------------------------------------------------------------


def _attention_csr(g):
    """(lp, rp, src, by_src_ptr, by_src_perm): the destinations' CSRs (local, remote) and
    sources of ``edge_index(g)``'s edges, and those edges grouped by source slot (a CSR
    over the n + H rows of cat([x, halo(x, g)]), edges in order within a slot)."""

    def build():
        p = g.plan
        src = p.edge_slots()
        slots = p.num_local_nodes + p.num_halo
        ptr = np.zeros(slots + 1, np.int64)
        np.cumsum(np.bincount(src, minlength=slots), out=ptr[1:])
        perm = np.argsort(src, kind="stable").astype(np.int64)
        lp, rp = (a.astype(np.int64) for a in (p.local_indptr, p.remote_indptr))
        return lp, rp, src, ptr, perm

    return _held(g, "attention_csr", build)


class _Attention(Op):
    @staticmethod
    def forward(ctx, a_all, a_dst, g, slope):
        lp, rp, src, _, _ = _attention_csr(g)
        nn = g.backend.nn
        alpha = nn.gat_softmax(lp, rp, src, as_array(a_all), as_array(a_dst), slope)
        ctx.g, ctx.slope = g, slope
        alpha = as_tensor(alpha)
        ctx.save_for_backward(a_all, a_dst, alpha)
        return alpha

    @staticmethod
    def backward(ctx, dalpha):
        g = ctx.g
        a_all, a_dst, alpha = ctx.saved_tensors
        lp, rp, src, ptr, perm = _attention_csr(g)
        nn = g.backend.nn
        dscore, da_dst = nn.gat_softmax_backward(
            lp,
            rp,
            src,
            as_array(a_all),
            as_array(a_dst),
            as_array(alpha),
            as_array(dalpha),
            ctx.slope,
        )
        da_all = nn.segment_sum(ptr, perm, dscore, a_all.shape[0])
        return as_tensor(da_all), as_tensor(da_dst), None, None


def attention(a_src: torch.Tensor, a_dst: torch.Tensor, g, negative_slope: float = 0.2):
    """GAT's attention α [E, H] over ``edge_index(g)``'s edges (local then remote): the
    softmax over each destination v's in-edges u -> v of LeakyReLU(a_src[u] + a_dst[v]),
    per head. a_src, a_dst [n, H] (per-node scores of this rank's rows; a_src of remote
    sources comes through ``halo``). One kernel per direction: no per-edge tensor is built
    by gathering. Differentiable in a_src and a_dst."""
    check_rows(a_src, g, "attention")
    check_rows(a_dst, g, "attention")
    if a_src.ndim != 2 or a_src.shape != a_dst.shape or a_src.dtype != a_dst.dtype:
        raise ValueError(
            f"attention: a_src and a_dst must be two [n, heads] tensors of one dtype, got "
            f"{tuple(a_src.shape)} {a_src.dtype} and {tuple(a_dst.shape)} {a_dst.dtype}"
        )
    a_all = torch.cat([a_src, halo(a_src, g)])
    return _Attention.apply(a_all, a_dst, g, float(negative_slope))
