"""Input features in a form no tensor op takes (InputRows, mgg.torch.checks): SparseRows
(a CSR matrix), ChunkedRows (dense rows used a chunk at a time) and HostRows (in host
memory, streamed through the device a chunk at a time), and ``linear``, the GEMM that
multiplies them (and tensors) without densifying or holding a dropped-out copy."""

from __future__ import annotations

import torch

from ..arrays import is_sparse, on_gpu
from ..errors import InputError
from ..precision import torch_dtype
from .checks import ArgumentTypeError, InputRows
from .dropouts import dropout
from .interop import Op, as_array, as_tensor, copy_thread, like, side_stream
from .rows import Rows


class _Features(InputRows):
    """What the containers share: F.linear and F.dropout (InputRows' torch functions),
    and their dense rows as Rows where the job's graph is known."""

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Rows:
        """F.linear: Rows [n, out] of x Wᵀ + b."""
        return Rows.of(linear(self, weight, bias), self.g)

    def dropout(self, p: float = 0.5, training: bool = True) -> InputRows:
        """F.dropout: these rows dropped out (mgg.torch.dropouts)."""
        return dropout(self, self.g, p, training)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.g is None else Rows.of(t, self.g)


class SparseRows(_Features):
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

    def dropped(self, drop, g) -> SparseRows:
        """These rows with their stored entries dropped out by g's mask ``drop``: (key,
        threshold, scale, key_at)."""
        key, threshold, scale, key_at = drop
        m = g.backend.nn.dropout_csr(self.m, key, g.lb, threshold, scale, key_at)
        return SparseRows(m, self.g)

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


class ChunkedRows(_Features):
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
            raise InputError(f"{type(self).__name__}: chunk must be >= 1 row, got {chunk}")
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

    def dropped(self, drop, g=None) -> ChunkedRows:
        """These rows with one more dropout, ``drop``: (key, threshold, scale, key_at) of
        the job's masks (g: the job's graph, these rows' own)."""
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
            self.side = side_stream(device)
            self.side.wait_stream(self.main)  # forks a captured step's stream, too
            self.freed = {}

    def put(self, k: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        if not self.gpu:
            self.pending[k] = copy_thread().submit(dst.copy_, src)
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
    if not isinstance(x, torch.Tensor | InputRows):
        raise ArgumentTypeError(f"linear: x must be a tensor or InputRows, got {type(x).__name__}")
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise InputError(
            f"linear: x is {tuple(x.shape)} ({type(x).__name__}) but the weight [out, in] is "
            f"{tuple(weight.shape)}: in_features must be x's width {x.shape[-1]}"
        )
    if isinstance(x, SparseRows):
        y = _SparseLinear.apply(weight, x)
        return y if bias is None else y + bias
    if isinstance(x, ChunkedRows):
        y = _ChunkedLinear.apply(weight, x)
        return y if bias is None else y + like(bias, y)
    return torch.nn.functional.linear(x, like(weight, x), None if bias is None else like(bias, x))


def as_features(x, device: str = "cpu"):
    """Input features as what layers take: a tensor on ``device``, SparseRows when
    sparse, or InputRows as they are."""
    if is_sparse(x):
        return SparseRows(x)
    if isinstance(x, torch.Tensor | InputRows):
        return x
    return as_tensor(x).to(device)
