"""`mgg convert`: a graph or dataset from one file format into another."""

from __future__ import annotations

import os
import sys
import time

from ..errors import InputError
from .common import INPUTS, emit, quiet

IN = "a file (.npz, .txt/.gz edge list, .graph, *_beg_pos.bin), an OGB directory or a spec"
OUT = (
    ".npz (keeps node data), .txt/.csv/.tsv/.el/.edges[.gz] (edge list), .graph/.metis[.gz] "
    "(METIS) or *_beg_pos.bin (MGG binary CSR)"
)


def add(sub):
    s = sub.add_parser("convert", help="convert a graph or dataset between file formats")
    s.add_argument("input", help=IN)
    s.add_argument("output", help=OUT)
    s.add_argument("--json", action="store_true")
    return s


def main(args) -> int:
    import warnings

    from ..atomic import check_folder
    from ..graph.formats import dropped_on_write, format_name, write_format, write_graph
    from ..graph.specs import ogb_source, resolve
    from ..partition.shards import ShardedDataset, is_sharded

    INPUTS.append(args.input)
    if not args.output.strip():
        raise InputError(f"the output {args.output!r}: an empty path: name a file")
    check_folder(args.output)
    write_format(args.output)  # before reading the input
    if is_sharded(args.input):
        source = ShardedDataset(args.input).manifest.get("source", {})
        was = source.get("path") or source.get("spec")
        raise InputError(
            f"{args.input}: is a sharded dataset (mgg partition --out), whose shards hold "
            "partition plans, not the graph: convert takes a graph file, OGB directory or "
            f"spec; convert its source{f' ({was})' if was else ''} instead"
        )
    if all(map(os.path.exists, (args.input, args.output))) and os.path.samefile(
        args.input, args.output
    ):
        raise ValueError(f"{args.output}: is the input itself: write to another path")
    t0 = time.perf_counter()
    ogb = ogb_source(args.input)
    if ogb is not None and write_format(args.output) in ("npz", "mgg"):
        return _stream(args, ogb, t0)
    ds = resolve(args.input)
    lost = dropped_on_write(ds, args.output)
    if lost:
        print(
            f"mgg convert: warning: {args.output} ({format_name(args.output)}) cannot hold "
            f"the {', '.join(lost)} of {args.input}: dropped",
            file=sys.stderr,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what is dropped was reported above
        write_graph(ds, args.output)
    res = {
        "in": args.input,
        "out": args.output,
        "num_nodes": ds.graph.num_nodes,
        "num_edges": ds.graph.num_edges,
        "seconds": time.perf_counter() - t0,
    }
    if not quiet(args):
        print(
            f"{args.input} -> {args.output} ({format_name(args.output)}): "
            f"{res['num_nodes']:,} nodes, {res['num_edges']:,} edges in {res['seconds']:.2f} s"
        )
    emit(args, res)
    return 0


def _stream(args, ogb, t0) -> int:
    """An OGB directory into .npz or the MGG binary CSR in bounded memory."""
    from ..graph.formats import format_name
    from ..graph.formats.ogb_stream import convert_ogb
    from ..memory import peak_rss_mb

    res = convert_ogb(ogb[0], args.output, **ogb[1], show=None if not quiet(args) else False)
    if res["dropped"]:
        print(
            f"mgg convert: warning: {args.output} ({format_name(args.output)}) cannot hold "
            f"the {', '.join(res['dropped'])} of {args.input}: dropped",
            file=sys.stderr,
        )
    res = {
        "in": args.input,
        "out": args.output,
        "num_nodes": res["num_nodes"],
        "num_edges": res["num_edges"],
        "seconds": time.perf_counter() - t0,
        "streamed": {"ranges": res["ranges"], "chunk": res["chunk"]},
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    if not quiet(args):
        print(
            f"{args.input} -> {args.output} ({format_name(args.output)}): "
            f"{res['num_nodes']:,} nodes, {res['num_edges']:,} edges in {res['seconds']:.2f} s, "
            f"streamed: {res['streamed']['ranges']} row range"
            f"{'s' if res['streamed']['ranges'] != 1 else ''} of at most "
            f"{res['streamed']['chunk']:,} entries, peak {res['peak_rss_mb']:,.0f} MB"
        )
    emit(args, res)
    return 0
