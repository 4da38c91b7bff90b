"""How the torch layers hold large inputs and what training saves: dense features read a
chunk at a time (ChunkedRows), streamed from host memory (HostRows), saved tensors
offloaded (mgg.torch.offload). The footprint model (mgg.footprint) counts by the same
rules."""

from __future__ import annotations

# a model reads dense input features held on its device a chunk at a time (mgg.torch.
# ChunkedRows: dropout and the first GEMM per chunk, the dropout again in the backward)
# when their dropped-out copy would take this many bytes or more and its first layer
# multiplies them first (or the model recomputes): in INPUT_CHUNKS chunks, no copy held
CHUNKED_INPUT_ABOVE = 256 << 20
INPUT_CHUNKS = 8
# activations in host memory (mgg.torch.offload: --offload, or where the plan needs it after
# streaming the features): the saved tensors this large or larger leave the device
OFFLOAD_MIN_BYTES = 1 << 20
# [rows, hidden] tensors a GPU then holds at the peak: an op's input, output and gradient,
# and the saved tensor fetched ahead; a model's own (mgg.torch.models.Spec.offload_copies,
# measured by bench/offload.py on the CPU's simulated device; not on a GPU yet), else this
OFFLOAD_COPIES = 4
# streamed input features (mgg.torch.HostRows): per row of a chunk, two buffers and the
# dropped-out copy of one in the job's dtype
STREAM_COPIES = 3
# the smallest chunk worth a copy (or all of a rank's rows, when it has fewer)
STREAM_MIN_ROWS = 1024


def multiplies_first(out: int, width: int) -> bool | None:
    """A layer [n, width] -> [n, out] that aggregates at the narrower width, as a model's
    first, given dense rows: True, it multiplies them before aggregating; False, it
    aggregates them first at the same width, so it could take them as ChunkedRows,
    multiplied first, for one more aggregation in its backward pass; None, neither."""
    return True if out < width else False if out == width else None


def reads_in_chunks(first: bool | None, recompute: bool, nbytes: int) -> bool:
    """Whether a model reads its dense input as ChunkedRows: the dropped-out copy would take
    ``nbytes`` >= CHUNKED_INPUT_ABOVE, and its first layer multiplies it first (``first``:
    its multiplies_first), or could while the model recomputes."""
    return nbytes >= CHUNKED_INPUT_ABOVE and (first is True or (first is False and recompute))
