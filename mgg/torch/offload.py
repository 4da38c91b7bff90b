"""Activations in host memory: what autograd saves for the backward pass, kept on the host
instead of the device and brought back when the backward pass needs it (the activations
that do not fit, after the input features: mgg.torch.HostRows).

In ``offloaded(...)``, each tensor an op saves that takes OFFLOAD_MIN_BYTES or more leaves
the device as it is saved: a copy on a side stream into pinned host memory, so the forward
pass goes on while it runs and the device block is freed once it is done. A tensor saved
by several ops is copied once (HongTu's deduplicated transfers). In the backward pass each
comes back when its op unpacks it, and the copy of the one saved before it (most likely
the next to be needed) starts at once beside that op's work: one tensor in flight at a
time. No step waits on the host for a copy; on a GPU the work waits for a tensor's copy
to the host where the next one is saved (its block may be CuPy's, which frees in stream
order only), so each copy overlaps the work between two saves. On the CPU backend the
device is simulated, as HostRows' is: a copy thread moves the bytes, and the host copies
live in a shared anonymous mapping, which Linux counts apart from the heap (RssShmem, not
RssAnon): what the simulated device holds is measurable.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import weakref
from dataclasses import dataclass

import torch

from ..errors import ResourceError
from ..memory import format_bytes
from . import chunks
from .interop import copy_thread, side_stream


@dataclass
class Offloaded:
    """What one forward pass moved to the host: ``tensors`` and ``bytes`` (each once)."""

    tensors: int = 0
    bytes: int = 0


class _Mover:
    """Copies beside the work: on a GPU a side stream (the work waits on its event only
    where it reads the copy); on the CPU the copy thread."""

    def __init__(self, device: torch.device):
        self.device, self.gpu = device, device.type == "cuda"
        self.reading = None  # (a tensor, the token of its copy to the host)
        if self.gpu:
            self.main, self.side = torch.cuda.current_stream(device), side_stream(device)

    def to_host(self, t: torch.Tensor):
        """(host copy of t, its token): the copy starts after the work that made t."""
        if not self.gpu:
            host = _host_block(t.shape, t.dtype)
            return host, copy_thread().submit(_copy, host, t)  # the thread holds t
        self.settle()
        try:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        except RuntimeError as e:
            raise _no_host(t.numel() * t.element_size(), e) from None
        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            host.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        self.reading = t, done
        return host, done

    def settle(self) -> None:
        """The work waits for the last copy to the host before its tensor may be freed: a
        block of CuPy's pool (kernel outputs) has no record_stream; torch's would."""
        if self.reading is not None:
            self.main.wait_event(self.reading[1])
            self.reading = None

    def to_device(self, host: torch.Tensor, after):
        """(a device copy of host, its token), started after ``after`` (host's own copy)."""
        if not self.gpu:
            dev = torch.empty(host.shape, dtype=host.dtype)

            def copy():
                after.result()
                _copy(dev, host)

            return dev, copy_thread().submit(copy)
        # a block of the work stream's pool: torch's allocator keeps a stream's freed
        # blocks for that stream, so a side-stream block would never reuse the blocks the
        # offloaded activations freed, and would add to the peak
        dev = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        self.side.wait_stream(self.main)  # the block's last use by the work is done
        with torch.cuda.stream(self.side):  # in order after host's own copy on this stream
            dev.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        return dev, done

    def wait(self, token) -> None:
        """The work from here on sees the copy of ``token`` (to_device's)."""
        if self.gpu:
            torch.cuda.current_stream(self.device).wait_event(token)
        else:
            token.result()


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    with torch.no_grad():  # the copy thread's own grad mode
        dst.copy_(src)


def _host_block(shape, dtype: torch.dtype) -> torch.Tensor:
    """The simulated host memory of the CPU backend: a shared anonymous mapping, which
    Linux counts apart (RssShmem) from the simulated device's heap (RssAnon)."""
    numel = math.prod(shape)
    try:
        block = mmap.mmap(-1, max(numel * dtype.itemsize, 1))  # the tensor keeps it mapped
    except OSError as e:
        raise _no_host(numel * dtype.itemsize, e) from None
    return torch.frombuffer(block, dtype=dtype, count=numel).view(shape)


def _no_host(nbytes: int, error) -> ResourceError:
    return ResourceError(
        f"--offload: host memory ran out for a saved tensor of {format_bytes(nbytes)} "
        f"({str(error).splitlines()[0]}): give the job more host memory, or more ranks (--np)"
    )


class _Saved:
    """One tensor on the host: its copy, the copy's token, and a device copy fetched ahead."""

    __slots__ = ("state", "index", "host", "stored", "ahead", "used", "__weakref__")

    def __init__(self, state, index: int, host: torch.Tensor, stored):
        self.state, self.index, self.host, self.stored = state, index, host, stored
        self.ahead = None  # (device tensor, token) of a prefetch
        self.used = False  # unpacked once: not fetched ahead again

    def __del__(self):
        """A prefetch never unpacked (its op's backward did not read it): the work waits
        for its copy before the block, freed now, can be the work's again."""
        if self.ahead is not None and self.state.mover.gpu:
            self.state.mover.main.wait_event(self.ahead[1])


class _State:
    """A forward pass's saved tensors in the order saved (weakly: the autograd graph owns
    them), its mover and what it moved."""

    def __init__(self, mover: _Mover, stats: Offloaded):
        self.mover, self.stats = mover, stats
        self.min_bytes = chunks.OFFLOAD_MIN_BYTES
        self.saved: list[weakref.ref] = []
        self.fetching = None  # weakly, the one fetched ahead and not yet unpacked

    def fetch_before(self, index: int) -> None:
        """Start the copy back of the tensor saved last before ``index`` that is still
        saved and not yet unpacked, unless one is fetched ahead already."""
        ahead = self.fetching() if self.fetching is not None else None
        if ahead is not None and ahead.ahead is not None:
            return
        for i in range(index - 1, -1, -1):
            s = self.saved[i]()
            if s is not None and not s.used and s.ahead is None:
                s.ahead = self.mover.to_device(s.host, s.stored)
                self.fetching = weakref.ref(s)
                return


def _pack(state: _State, skip: set, seen: dict, t: torch.Tensor):
    if (
        t.element_size() * t.numel() < state.min_bytes
        or t.device != state.mover.device
        or t.layout != torch.strided
        or not t.is_floating_point()  # indices: the graph's structure, held anyway
        or t.untyped_storage().data_ptr() in skip
    ):
        return t
    key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t._version)
    same, saved = seen.get(key, (None, None))
    if same is not None and same() is t:  # this tensor, saved again by another op
        return saved
    host, stored = state.mover.to_host(t)
    saved = _Saved(state, len(state.saved), host, stored)
    state.saved.append(weakref.ref(saved))
    seen[key] = weakref.ref(t), saved  # a block freed and reused is another tensor
    state.stats.tensors += 1
    state.stats.bytes += t.element_size() * t.numel()
    return saved


def _unpack(saved):
    if not isinstance(saved, _Saved):
        return saved
    state = saved.state
    if saved.ahead is not None:
        (dev, token), saved.ahead = saved.ahead, None
    else:
        dev, token = state.mover.to_device(saved.host, saved.stored)
    saved.used = True
    state.mover.wait(token)
    state.fetch_before(saved.index)
    return dev


@contextlib.contextmanager
def offloaded(g, keep=()):
    """Within it, the floating-point tensors autograd saves on the device of the job of
    DistGraph ``g`` (OFFLOAD_MIN_BYTES or more, not sharing storage with ``keep``: tensors
    that stay on the device anyway, such as the input features and the parameters) are
    kept in host memory until the backward pass. Yields an Offloaded that counts them."""
    gpu = g.backend.gpu
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    stats = Offloaded()
    state = _State(_Mover(device), stats)
    skip = {t.untyped_storage().data_ptr() for t in keep if isinstance(t, torch.Tensor)}
    seen: dict = {}
    try:
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: _pack(state, skip, seen, t), _unpack
        ):
            yield stats
    finally:
        if state.mover.gpu:
            state.mover.settle()
        seen.clear()  # the keys name device blocks that the graph no longer holds
