"""The node orders of kernel_ab.py --orders: each computed once, kept in --order-dir
(the graph's fingerprint checked when read back), and the graph renumbered in it."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np


def recorded_name(name: str, parts: int) -> str:
    """The name an order file of ``--order-dir`` records: metis's with its parts."""
    return f"metis parts={parts}" if name == "metis" else name


def saved_order(keep: str | None, name: str) -> Path | None:
    return Path(keep) / f"{name}.npy" if keep and name != "natural" else None


def read_saved(path: Path, name: str, parts: int, num_nodes: int, fingerprint=None):
    """The order kept in ``path`` (OrderError naming the file where it is another graph's,
    or another order's, or METIS's into other parts)."""
    from mgg.partition import order as node_order

    o = node_order.read(path, num_nodes, fingerprint)
    if o.name != recorded_name(name, parts):
        raise node_order.OrderError(
            f"{path}: holds the order {o.name!r}, not {recorded_name(name, parts)!r}: "
            "give another --order-dir, or delete the file"
        )
    return o


def order_of(g, name: str, parts: int, keep: str | None, fingerprint: str, log=None):
    """``g``'s order ``name``: read from ``keep`` where it is there (pymetis not imported),
    else computed (and saved there)."""
    from mgg.partition import order as node_order

    saved = saved_order(keep, name)
    if name == "natural":
        o, how = node_order.Order(), "natural"
    elif saved is not None and saved.exists():
        o = read_saved(saved, name, parts, g.num_nodes, fingerprint)
        how = f"read from {saved} in {o.seconds:.2f} s"
    else:
        o = node_order.compute(g, name, parts=parts)
        how = f"computed in {o.seconds:.1f} s"
        if saved is not None:
            saved.parent.mkdir(parents=True, exist_ok=True)
            o = node_order.Order(recorded_name(name, parts), o.perm, o.seconds)
            node_order.save(saved, o, fingerprint)
            how += f", saved to {saved}"
    print(f"order {name}: {how}", flush=True)
    if log is not None:
        log[name] = {"how": how, "seconds": round(o.seconds, 3)}
    return o


def ordered_graphs(g, orders, parts: int, tmp: str, keep: str | None, log=None) -> dict:
    """{order: a graph file of ``g`` renumbered in it}; orders computed once (kept in
    ``keep``, the graph's fingerprint checked when read back); ``log``: a dict to take
    how each order came ({order: {how, seconds}})."""
    from mgg.partition import order as node_order

    out, fingerprint = {}, node_order.fingerprint_of(g)
    for name in orders:
        h = order_of(g, name, parts, keep, fingerprint, log).apply(g)
        out[name] = os.path.join(tmp, f"graph-{name}.npz")
        np.savez(out[name], indptr=h.indptr, indices=h.indices)
    return out


@contextlib.contextmanager
def refused_orders():
    """An order file refused once the graph is built (another graph's fingerprint): one
    line naming it, as the flags' refusals."""
    from mgg.partition.order import OrderError

    try:
        yield
    except OrderError as e:
        raise SystemExit(f"kernel_ab.py: error: argument --order-dir: {e}") from None


def orders_only(args) -> int:
    """--orders-only: the graph's orders computed (or found) in --order-dir, nothing else."""
    from mgg.graph.generators import rmat_n
    from mgg.partition import order as node_order

    t0 = time.perf_counter()
    g = rmat_n(args.nodes, args.edges, seed=0)
    print(f"graph: {g} ({time.perf_counter() - t0:.1f} s)", flush=True)
    fingerprint = node_order.fingerprint_of(g)
    for name in args.orders:
        if name != "natural":
            with refused_orders():
                order_of(g, name, args.parts, args.order_dir, fingerprint)
    print(f"orders in {args.order_dir}: {time.perf_counter() - t0:.1f} s in all", flush=True)
    return 0
