"""A training step captured as a CUDA graph and replayed: no host work per step.

Full-graph training has static shapes, so after ``WARMUP`` eager steps on a side stream
(torch's recipe: lazy handles, kernels compiled, optimizer state made) the whole step —
forward, loss, backward, optimizer step — is captured once, and every later step is one
``replay``: no Python, autograd or launch work. What changes from step to step lives on
the device: the parameters and the optimizer's state (updated in place) and the dropout
masks' keys. The kernels read those from ``keys.key_slots`` (int64 [SLOTS]), which the
host fills before each step with the keys an eager step passes by value
(key64(seed, step, k) for its k-th mask), so a replayed step draws an eager step's masks.

While capturing, CuPy launches on the capturing stream (in autograd's backward thread
too: mgg.torch.interop.Op) and allocates from torch's graph pool: a block from CuPy's own
pool would be freed after the capture and handed out again under the graph's feet.
One rank only: a step with peers exchanges halo rows and gradients through MPI on the
host.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..hashing import keys64

SLOTS = 64  # dropout masks a captured step may draw
WARMUP = 3  # eager steps on the side stream before the capture


def step_keys(seed: int, epoch: int) -> np.ndarray:
    """A step's dropout keys as int64 bits [SLOTS]: key64(seed, epoch, k) for its k-th
    mask, the keys DistGraph.next_dropout_key gives an eager step, in one call."""
    return keys64(seed, epoch, last=np.arange(SLOTS, dtype=np.uint64)).view(np.int64)


@contextlib.contextmanager
def cupy_on(stream: torch.cuda.Stream, graph_pool: bool = False):
    """CuPy launches on torch's ``stream`` (and, with ``graph_pool``, allocates through
    torch's caching allocator, which a capture routes to its graph's pool)."""
    import cupy

    before = cupy.cuda.get_allocator()
    if graph_pool:  # every thread's (not using_allocator's one): autograd's backward
        cupy.cuda.set_allocator(_torch_malloc)  # thread allocates too
    try:
        with cupy.cuda.ExternalStream(stream.cuda_stream, stream.device.index):
            yield
    finally:
        cupy.cuda.set_allocator(before)


def _torch_malloc(size: int):
    """A CuPy allocation held by a torch tensor (freed to torch when CuPy drops it)."""
    import cupy

    dev = cupy.cuda.Device().id
    t = torch.empty(max(size, 1), dtype=torch.uint8, device=f"cuda:{dev}")
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), size, t, dev), 0)


class CapturedStep:
    """``step(epoch)``: ``body(epoch)`` (one training step returning its loss, a 0-d
    tensor) run eagerly ``WARMUP`` times, then captured and replayed. Returns the step's
    loss as a tensor of its own (read it whenever: nothing here waits for the device).
    Dropout reads its keys from this step's slots only while its body runs (warm-up and
    capture) and in its replays: another trainer's step on ``g`` passes them by value."""

    def __init__(self, g, body, device: torch.device):
        self.g, self.body = g, body
        self.stream = torch.cuda.Stream(device)
        self.slots = torch.zeros(SLOTS, dtype=torch.int64, device=device)
        self.graph = None
        self.loss: torch.Tensor | None = None
        self.warm = 0

    def __call__(self, epoch: int) -> torch.Tensor:
        keys = torch.from_numpy(step_keys(self.g.keys.seed, epoch))
        self.slots.copy_(keys, non_blocking=True)
        main = torch.cuda.current_stream(self.slots.device)
        if self.graph is None:
            self.stream.wait_stream(main)
            capture = self.warm == WARMUP
            graph = torch.cuda.CUDAGraph() if capture else None
            self.g.keys.key_slots = self.slots
            try:
                with cupy_on(self.stream, graph_pool=capture):
                    if capture:
                        with torch.cuda.graph(graph, stream=self.stream):
                            self.loss = self.body(epoch)
                    else:
                        with torch.cuda.stream(self.stream):
                            loss = self.body(epoch)
            finally:
                self.g.keys.key_slots = None
            main.wait_stream(self.stream)
            if not capture:
                self.warm += 1
                loss.record_stream(main)  # read there, later
                return loss
            self.graph = graph
        self.graph.replay()
        return self.loss.clone()
