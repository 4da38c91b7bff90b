"""Tensors as mgg's arrays and back, without a copy: numpy views of CPU tensors, cupy views
(or DLPack) of CUDA ones; ``Op``, the autograd Function whose CuPy work follows torch's
stream; the side stream and copy thread that move rows beside the work (mgg.torch.inputs'
HostRows, mgg.torch.offload)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..arrays import on_gpu
from ..precision import BF16, holds_bf16


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


def like(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Parameter p in the dtype of rows x when x is bfloat16 (a differentiable cast: the
    gradient reaches the float32 master p), else p itself."""
    return p.to(x.dtype) if x.dtype == torch.bfloat16 and p.dtype != x.dtype else p


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


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)


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
def side_stream(device: torch.device):
    """The CUDA stream that copies rows beside the work on ``device`` (one per device)."""
    return torch.cuda.Stream(device)


@functools.cache
def copy_thread():
    """The thread that copies rows beside the work on the CPU backend's simulated device."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(1, thread_name_prefix="mgg-copy")
