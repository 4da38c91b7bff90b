"""The distributed partitioner: every rank reads a slice of the edges, and the ranks build
their plans together, each holding O(N + E/P), never the whole graph.

1. Each rank holds a contiguous slice of the edge sequence (the file's order).
2. Global in-degree counts (one allreduce over N) give Algorithm 1's split points.
3. alltoallv sends every edge to the owner of its destination (forward rows) and to the
   owner of its source (transposed rows); arriving in rank order, the slices keep the
   file's order, so stable sorts rebuild exactly the rows the single-process Graph has.
4. Each rank splits its rows into local/remote CSRs and neighbor partitions.

The result equals ``build_plan(job_graph(graph, kind), P, ps, rank=r)`` bit for bit.
``partition_file`` is the whole protocol of ``mgg partition FILE --distributed``: read the
slices, build the plans, read the node rows, write the shards.
``comm`` is any mgg.comm.Comm (allreduce, allgather, alltoallv); nothing here imports it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numba
import numpy as np

from ..errors import MggError
from ..graph.core import (
    GRAPH_KINDS,
    GraphError,
    check_gcn_weights,
    counting_sort,
    index_dtype,
    sort_csr_rows,
)
from ..graph.dataset import check_train_selects
from ..graph.formats.slices import EdgeSlice, read_edge_slice, read_node_rows, source_checksum
from ..graph.generators import build_csr
from ..graph.papers import Papers
from ..knobs import DEFAULTS, Knobs, check_value
from ..precision import as_rows
from ..progress import progress
from .node_split import node_split, owner_of
from .order import Order, OrderError, check_one, degree_order, graph_fingerprint
from .order import read as read_order
from .plan import PartitionPlan, plan_stats, rank_plan
from .shards import (
    begin,
    commit,
    labeled_rows,
    node_info,
    order_info,
    plan_info,
    write_shard,
    writing,
)


def build_plan_distributed(
    part: EdgeSlice,
    comm,
    ps: int = DEFAULTS.ps,
    *,
    kind: str = "as_is",
    split: str = DEFAULTS.split,
    transposed: bool = True,
    sort_rows: bool = False,
) -> PartitionPlan:
    """This rank's plan of ``job_graph(graph, kind)``, where the graph is the
    concatenation of every rank's ``part`` in rank order. ``sort_rows``: each row's
    sources sorted, as Graph.permute leaves them (a renumbered graph: ``reorder``).
    Collective."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"unknown graph kind {kind!r}; choose one of {', '.join(GRAPH_KINDS)}")
    ps = check_value("ps", ps)
    rank, size = comm.rank, comm.size
    facts = _facts(part, comm)
    n = _agree_num_nodes(part, facts)
    weighted = _agree_weighted(part, facts)
    idt = index_dtype(n)
    src, dst, w = part.src.astype(idt, copy=False), part.dst.astype(idt, copy=False), part.weights
    if weighted and w is None:
        w = np.empty(0, np.float32)
    loops = kind != "as_is"
    if loops:  # every kind but as_is drops the graph's own loops first
        keep = src != dst
        if not keep.all():
            src, dst = src[keep], dst[keep]
            w = None if w is None else w[keep]
    add_loops = kind in ("self_loops", "gcn_norm")

    counts = np.bincount(dst, minlength=n).astype(np.int64) if dst.size else np.zeros(n, np.int64)
    counts = comm.allreduce(counts)
    if add_loops:
        counts += 1
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    num_edges = int(indptr[-1])
    del counts
    bounds = node_split(indptr, size, split)
    del indptr
    lb, ub = int(bounds[rank]), int(bounds[rank + 1])

    # forward rows: every edge to the owner of its destination
    f_src, f_dst, f_w = _exchange(comm, owner_of(bounds, dst), src, dst, w)
    row_ptr, row_src, row_w = counting_sort(f_dst.astype(np.int64) - lb, f_src, ub - lb, f_w)
    del f_src, f_dst, f_w
    if sort_rows:
        has_w = row_w is not None
        sort_csr_rows(row_ptr, row_src, row_w if has_w else np.empty(0, np.float32), has_w)
    if add_loops:
        row_ptr, row_src, row_w = _append_loops(row_ptr, row_src, row_w, lb)
    need_t = transposed or part.symmetric
    t_rows = None
    if need_t:
        # transposed rows: every edge to the owner of its source, sorted by (src, dst)
        t_src, t_dst, t_w = _exchange(comm, owner_of(bounds, src), src, dst, w)
        if add_loops:
            own = np.arange(lb, ub, dtype=idt)
            t_src, t_dst = np.concatenate([t_src, own]), np.concatenate([t_dst, own])
            if t_w is not None:
                t_w = np.concatenate([t_w, np.ones(own.size, np.float32)])
        # rows by source (a stable counting sort), then each row by destination (stable)
        t_ptr, t_dst, t_w = counting_sort(t_src.astype(np.int64) - lb, t_dst, ub - lb, t_w)
        sort_csr_rows(
            t_ptr, t_dst, t_w if t_w is not None else np.empty(0, np.float32), t_w is not None
        )
        t_src = np.repeat(np.arange(lb, ub, dtype=idt), np.diff(t_ptr))
        t_rows = [t_ptr, t_dst, t_w, t_src]
    symmetric, norm = False, None
    if part.symmetric:
        ok = _rows_equal((row_ptr, row_src, row_w), t_rows[:3])
        if not comm.allreduce(np.array([ok], np.int64), "min")[0]:
            raise GraphError(
                f"{part.source}: the source says the graph is undirected, but an edge has "
                "no reverse edge (or a different weight)"
            )
        symmetric = True
        t_rows = None
    if kind == "gcn_norm":
        # D^-1/2 of every node, summed in the float64 order of Graph.gcn_norm (by row)
        if weighted:
            dst_of_row = np.repeat(np.arange(lb, ub), np.diff(row_ptr))
            negative = comm.allreduce(np.array([(row_w < 0).sum()], np.int64))[0]
            check_gcn_weights(int(negative), num_edges)
            deg = np.bincount(dst_of_row - lb, weights=row_w, minlength=ub - lb)
        else:
            deg = np.diff(row_ptr).astype(np.float64)
        dinv = np.zeros(n, np.float64)
        dinv[lb:ub] = np.where(deg > 0, 1.0 / np.sqrt(np.where(deg > 0, deg, 1.0)), 0.0)
        dinv = comm.allreduce(dinv)
        if not weighted:  # the weights factor (Graph.gcn_norm's norm): the plans keep that
            norm = dinv.astype(np.float32)
        else:
            row_w = _gcn_weights(dinv, row_src, dst_of_row, row_w)
            if t_rows is not None:
                t_ptr, t_dst, t_w, t_src = t_rows
                t_rows[2] = _gcn_weights(dinv, t_src, t_dst, t_w)

    mark = np.full(n, -1, np.int32)
    args = (rank, bounds, ps, num_edges)
    plan = rank_plan(*args, symmetric, mark, row_ptr, row_src, row_w, norm=norm)
    if t_rows is not None and transposed:
        t = rank_plan(*args, False, mark, *t_rows[:3], norm=norm)
        plan = replace(plan, _transposed=t)
    return plan


def generated_slice(gen: Papers, comm) -> EdgeSlice:
    """This rank's slice of a generated graph (mgg.graph.papers), collective: the ranks
    draw their ranges of the edge stream and send each edge (both directions) to the rank
    of an equal share of the node ids, which merges its rows. The slices in rank order are
    the entries of ``gen.dataset().graph`` in CSR order."""
    rank, size, n = comm.rank, comm.size, gen.num_nodes
    gen.require_slice(size)
    bounds = np.arange(size + 1, dtype=np.int64) * n // size
    sampler, draws, rounds = gen.sampler(), gen.num_draws, 0
    while draws is not None:  # the rounds of Papers.dataset, each rank a share of them
        src, dst = gen.draws(draws * rank // size, draws * (rank + 1) // size, sampler)
        keep = src != dst
        src, dst = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
        del keep
        src, dst, _ = _exchange(comm, owner_of(bounds, dst), src, dst, None)
        indptr, indices = build_csr(src, dst, n, False)
        del src, dst
        entries = int(comm.allreduce(np.array([indices.size], np.int64))[0])
        rounds += 1
        draws = gen.more(draws, entries, rounds)
    del sampler
    lb, ub = int(bounds[rank]), int(bounds[rank + 1])
    rows = np.repeat(np.arange(lb, ub, dtype=indices.dtype), np.diff(indptr[lb : ub + 1]))
    return EdgeSlice(indices, rows, None, n, 0, True, gen.spec, f"nodes [{lb}, {ub})")


def _facts(part: EdgeSlice, comm) -> list:
    return comm.allgather(
        (
            part.num_nodes,
            part.min_nodes,
            part.weights is not None,
            part.src.size,
            part.offset,
            part.header_nodes,
        )
    )


def slice_order(part: EdgeSlice, comm, name: str, path=None) -> Order:
    """The node order of the graph whose slices the ranks hold (collective): natural,
    degree (from the global degree counts) or the permutation in ``path`` (every rank
    reads it: O(N); refused for a graph of another fingerprint). rcm and metis need the
    whole graph: OrderError saying how to bring one as a file."""
    check_one(name, path)
    if path is None and name == "natural":
        return Order()
    if path is None and name != "degree":
        raise OrderError(
            f"--order {name} needs the whole graph, which --distributed never holds: compute "
            f"it in one process (mgg partition FILE --np P --order {name} --save-order "
            "perm.npy) and pass --order-file perm.npy"
        )
    t0 = time.perf_counter()
    n = _agree_num_nodes(part, _facts(part, comm))
    counts = np.zeros((2, n), np.int64)
    if part.src.size:
        counts[0] = np.bincount(part.dst, minlength=n)
        counts[1] = np.bincount(part.src, minlength=n)
    counts = comm.allreduce(counts)
    if path is None:
        return Order(name, degree_order(counts[0] + counts[1]), time.perf_counter() - t0)
    edges = int(counts[0].sum())
    return read_order(path, n, graph_fingerprint(n, edges, counts[0], counts[1]))


def reorder(part: EdgeSlice, order: Order) -> EdgeSlice:
    """``part`` with its node ids renumbered in ``order``."""
    if order.natural:
        return part
    rank = order.rank
    return part._replace(src=rank[part.src], dst=rank[part.dst], num_nodes=rank.size)


def _agree_num_nodes(part: EdgeSlice, facts) -> int:
    declared = {f[0] for f in facts if f[0] is not None}
    if len(declared) > 1:
        raise GraphError(f"{part.source}: ranks disagree on the node count: {sorted(declared)}")
    need = max(f[1] for f in facts)
    for f in facts:  # a "# Nodes: N" header counts before the file's first edge only
        if f[5] is not None:
            if need > f[5]:  # as read_edgelist: the ids must agree with the header
                raise GraphError(
                    f"{part.source}: node id {need - 1} is >= {f[5]}, the node count of the "
                    f"file's 'Nodes: {f[5]}' header"
                )
            need = f[5]
            break
        if f[3]:
            break
    n = next(iter(declared)) if declared else need
    if need > n:
        raise GraphError(f"{part.source}: node id {need - 1} is outside [0, {n})")
    if not declared and sum(f[3] for f in facts) == 0 and n == 0:
        raise GraphError(f"{part.source}: no edges: the file holds no edge lines")
    return int(n)


def _agree_weighted(part: EdgeSlice, facts) -> bool:
    kinds = [(f[2], f[4]) for f in facts if f[3] > 0]
    if len({k for k, _ in kinds}) > 1:
        first = kinds[0]
        odd = next(k for k in kinds if k[0] != first[0])
        cols = {True: 3, False: 2}
        raise GraphError(
            f"{part.source}: {odd[1]}: {cols[odd[0]]} columns, but {cols[first[0]]} at "
            f"{first[1]}: every line needs the same columns"
        )
    return bool(kinds and kinds[0][0])


def _exchange(comm, to, src, dst, w):
    """Send edge i to rank to[i]; returns what arrives, senders in rank order and each
    sender's edges in their order (so the concatenation keeps the source's order)."""
    if comm.size == 1:
        return src, dst, w
    order = _stable_order(to, comm.size)
    send_counts = np.bincount(to, minlength=comm.size).astype(np.int64)
    recv_counts = np.array(comm.alltoall(send_counts.tolist()), np.int64)
    total = int(recv_counts.sum())
    out = []
    for a in (src, dst, w):
        if a is None:
            out.append(None)
            continue
        recv = np.empty(total, a.dtype)
        comm.alltoallv(a[order], send_counts, recv, recv_counts)
        out.append(recv)
    return tuple(out)


def _stable_order(keys, num_keys: int) -> np.ndarray:
    """int64 [E]: the permutation that sorts ``keys`` (ints in [0, num_keys)) stably; a
    counting sort, O(E + num_keys)."""
    counts = np.bincount(keys, minlength=num_keys) if keys.size else np.zeros(num_keys, np.int64)
    pos = np.zeros(num_keys, np.int64)
    np.cumsum(counts[:-1], out=pos[1:])
    order = np.empty(keys.size, np.int64)
    _scatter_order(keys, pos, order)
    return order


@numba.njit(cache=True, nogil=True)
def _scatter_order(keys, pos, order):
    for i in range(keys.size):
        k = keys[i]
        order[pos[k]] = i
        pos[k] += 1


def _append_loops(indptr, indices, w, lb):
    """Graph.add_self_loops on rows lb..: one loop (weight 1 where weighted) at the end of
    each row."""
    n = indptr.size - 1
    new_ptr = indptr + np.arange(n + 1, dtype=np.int64)
    loop_pos = new_ptr[1:] - 1
    mask = np.ones(int(new_ptr[-1]), bool)
    mask[loop_pos] = False
    out = np.empty(mask.size, indices.dtype)
    out[mask] = indices
    out[loop_pos] = np.arange(lb, lb + n)
    new_w = None
    if w is not None:
        new_w = np.empty(mask.size, np.float32)
        new_w[mask] = w
        new_w[loop_pos] = 1.0
    return new_ptr, out, new_w


def _gcn_weights(dinv, src, dst, w):
    return (dinv[src] * w * dinv[dst]).astype(np.float32)


def _rows_equal(a, b) -> bool:
    """Rows of two CSRs hold the same (neighbor, weight) multisets; ``b``'s rows are
    sorted by neighbor."""
    (pa, ia, wa), (pb, ib, wb) = a, b
    if not np.array_equal(pa, pb):
        return False
    ia = ia.copy()
    wa = None if wa is None else wa.copy()
    sort_csr_rows(pa, ia, wa if wa is not None else np.empty(0, np.float32), wa is not None)
    if not np.array_equal(ia, ib):
        return False
    if wa is None or np.array_equal(wa, wb):
        return True
    # the same neighbor twice with different weights: compare (neighbor, weight) sorted
    rows = np.repeat(np.arange(pa.size - 1), np.diff(pa))
    oa, ob = np.lexsort((wa, ia, rows)), np.lexsort((wb, ib, rows))
    return np.array_equal(wa[oa], wb[ob])


def partition_file(
    path: str | Papers,
    comm,
    *,
    kind: str,
    knobs: Knobs = DEFAULTS,
    transposed: bool = True,
    out=None,
    force: bool = False,
    seed: int = 0,
    order_file=None,
) -> tuple[dict, list[dict]]:
    """The sharding protocol of ``mggrun -np P mgg partition FILE --distributed``,
    collective: every rank reads its slice of ``path`` (an edge list, MGG binary CSR or
    .npz; or a Papers spec: generated_slice draws it), renumbers it in the node order
    (``knobs.order``: natural or degree; or the permutation in ``order_file``:
    slice_order), the ranks build their plans of
    ``job_graph(graph, kind)`` together (cut with ``knobs.ps`` and ``knobs.split``), each
    reads its node rows (by original id; dense features in ``knobs.dtype``), and with
    ``out`` each writes its shard and rank 0 commits the sharded dataset.

    returns (the partition's facts: plan_stats plus graph, kind, order, load/plan/order/
    write seconds and out; every rank's plan stats), the same on every rank
    """
    bar = progress(total=4 if out else 3, desc="partition")
    with bar:
        bar.set_postfix_str("draw slices" if isinstance(path, Papers) else "read slices")
        t0 = time.perf_counter()
        gen = path if isinstance(path, Papers) else None
        part = generated_slice(gen, comm) if gen else read_edge_slice(path, comm.rank, comm.size)
        name = gen.spec if gen else path
        load_s = comm.allreduce(np.array([time.perf_counter() - t0]), "max")[0]
        source_edges = int(comm.allreduce(np.array([len(part.src)]), "sum")[0])
        bar.update()
        order = slice_order(part, comm, knobs.order, order_file)
        part = reorder(part, order)
        bar.set_postfix_str("exchange edges, build plans")
        t0 = time.perf_counter()
        plan = build_plan_distributed(
            part,
            comm,
            knobs.ps,
            kind=kind,
            split=knobs.split,
            transposed=transposed,
            sort_rows=not order.natural,
        )
        del part
        plan_s = comm.allreduce(np.array([time.perf_counter() - t0]), "max")[0]
        bar.update()
        bar.set_postfix_str("node data")
        stats = comm.allgather(plan.stats())
        ids = order.ids(plan.lb, plan.ub)
        if gen:
            rows = gen.rows(plan.lb, plan.ub, ids)
        else:
            rows = read_node_rows(path, plan.lb, plan.ub, seed, ids)
        rows = rows._replace(x=as_rows(rows.x, knobs.dtype, f"{name}'s features"))
        if rows.masks is not None:  # each rank checked its rows; emptiness is the job's
            check_train_selects(name, comm.allreduce(rows.masks[0].sum(keepdims=True))[0])
        facts = {**plan_stats(stats, plan_s), "graph": rows.name, "kind": kind}
        facts.update(load_seconds=load_s, order=order.name, order_seconds=order.seconds)
        bar.update()
        if out:
            bar.set_postfix_str("write shards")
            t0 = time.perf_counter()
            source = gen.source() if gen else source_checksum(path)
            source = {**source, "num_edges": source_edges}
            labeled = int(comm.allreduce(np.array([labeled_rows(rows)], np.int64))[0])
            info = {"graph_kind": kind, "source": source, **node_info(rows, labeled)}
            info.update(order_info(order.name, order.seconds))
            _write_shards(comm, out, force, plan, rows, info)
            facts.update(out=str(out), write_seconds=time.perf_counter() - t0)
            bar.update()
    return facts, stats


def _write_shards(comm, out, force: bool, plan: PartitionPlan, rows, info: dict) -> None:
    """Rank 0 locks ``out`` and makes the temporary folder, every rank writes its shard,
    rank 0 commits; an error on any rank is raised on every rank (the first rank's), and
    on any exception the temporary folder is removed. Collective."""
    mine = _agree(comm, lambda: begin(out, force) if comm.rank == 0 else None)
    shared = comm.bcast(mine)  # without the lock, which stays on rank 0
    target = mine if comm.rank == 0 else shared
    with writing(target):
        table = _agree(comm, lambda: write_shard(target, plan, rows))
        tables, infos = comm.gather(table), comm.gather(plan_info(plan))
        _agree(comm, lambda: commit(target, infos, tables, info) if comm.rank == 0 else None)


def _agree(comm, fn):
    """``fn()`` on every rank; an OSError or MggError on any rank is raised on all (the
    lowest rank's), so that none waits in a collective for a rank that failed."""
    value, error = None, None
    try:
        with comm.alone():  # a rank writing for all (rank 0's commit) is waited for
            value = fn()
    except (OSError, MggError) as e:
        error = e
    errors = comm.allgather(error)
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return value
