"""Across nodes: the aggregation designs when every rank is its own node, all traffic on
MPI's network path.

    python bench/network_designs.py [--np 2,4] [--dims 16,128] [--transports nolocal,tcp]
                                    [--graphs rmat-s17,rmat-s18,cnr_2000,ego_twitter]

Each configuration is one `mggrun -np P` job of this script (--worker) with
MPIR_CVAR_NOLOCAL=1, so that MPICH gives every rank its own "node" and no shared window:

  nolocal  MPICH's UCX netmod, which still moves bytes between processes of one host
           through its shared-memory transports (sysv, cma);
  tcp      the same with UCX_TLS=tcp,self: every byte through the kernel's TCP stack
           (loopback), the closest this machine gets to a network.

In one job, timed round-robin (median of the slowest rank, mgg.harness.timing): the
pipelined design over pushed messages (msg window) and over one-sided gets (rma), bulk
halo exchange (msg: no window), direct per-edge gets (rma), and two references that
bound what overlap can win: `nocomm` (bulk halo without its exchange: the pack and the
aggregation) and `exchange` (the alltoallv alone), with the CPU time (user, system) the
exchange costs per call. A design's exposed communication is its time past nocomm;
hidden = 1 - exposed / exchange (1: all hidden; 0: none, as in bulk halo). Every design's
output is checked against scipy on rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from common import RESULTS, ROOT, real_graphs, write_results

DESIGNS = (("pipelined", "msg"), ("pipelined", "rma"), ("bulk_halo", "msg"), ("direct", "rma"))
TRANSPORTS = {
    "nolocal": {"MPIR_CVAR_NOLOCAL": "1"},
    "tcp": {"MPIR_CVAR_NOLOCAL": "1", "UCX_TLS": "tcp,self"},
}


def worker(args) -> None:
    from mgg.comm import get_comm
    from mgg.designs import get_design
    from mgg.graph.dataset import random_features
    from mgg.graph.specs import resolve
    from mgg.harness.check import gather_rows, relative_error
    from mgg.harness.timing import slowest, time_round_robin
    from mgg.kernels import cpu, reference
    from mgg.partition import build_plan

    comm = get_comm("mpi", window="msg")
    g = resolve(args.graph).graph.gcn_norm()
    plan = build_plan(g, comm.size, 16, rank=comm.rank, transposed=False)
    x = random_features(0, plan.lb, plan.ub, args.dim)
    designs = {
        f"{name}/{window}": get_design("cpu", name)(plan, comm, args.dim, window=window)
        for name, window in DESIGNS
        if name != "direct" or not args.no_direct
    }
    ref = reference.aggregate(g, random_features(0, 0, g.num_nodes, args.dim), "gcn")
    errors = {}
    for key, d in designs.items():
        d.x[...] = x
        whole = gather_rows(comm, d("gcn"))
        errors[key] = relative_error(whole, ref) if comm.rank == 0 else None
    b = designs["bulk_halo/msg"]
    out = np.empty((plan.num_local_nodes, args.dim), np.float32)

    def nocomm():  # bulk halo without its exchange
        cpu.gather_rows(b.x, b.send_rows, b.send)
        cpu.init_out("gcn", b.x, out)
        b.local("gcn", 0, plan.lnp_node.size, out)
        b.remote("gcn", 0, plan.rnp_node.size, b.remote_index, b.recv, out)

    def exchange():
        comm.alltoallv(b.send, b.send_counts, b.recv, b.recv_counts)

    calls = {k: (lambda d=d: d("gcn", out=out)) for k, d in designs.items()}
    calls.update(nocomm=nocomm, exchange=exchange)
    for _ in range(2):  # warm: every kernel compiled, every buffer touched
        for f in calls.values():
            f()
    times = time_round_robin(calls, comm, args.repeat)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(args.repeat):
        comm.barrier()
        exchange()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = slowest(comm, [(r1.ru_utime - r0.ru_utime), (r1.ru_stime - r0.ru_stime)])
    waits = {k: comm.allreduce(np.array([d.stats["wait_seconds"] / d.stats["calls"]])).item()
             / comm.size for k, d in designs.items()}  # fmt: skip
    halo_rows = int(comm.allreduce(np.array([plan.num_halo]))[0])
    for d in designs.values():
        d.free()
    if comm.rank == 0:
        print(json.dumps({
            "median_s": {k: float(np.median(v)) for k, v in times.items()},
            "errors": errors,
            "wait_s": waits,
            "exchange_user_s": float(cpu_s[0]) / args.repeat,
            "exchange_sys_s": float(cpu_s[1]) / args.repeat,
            "halo_rows": halo_rows,
            "edges": g.num_edges,
        }))  # fmt: skip


def run_job(transport, nprocs, spec, dim, repeat, no_direct):
    mggrun = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(nprocs)]
    cmd = [*mggrun, sys.executable, __file__, "--worker", "--graph", spec, "--dim", str(dim)]
    cmd += ["--repeat", str(repeat)]
    if no_direct:
        cmd.append("--no-direct")
    env = dict(os.environ, MGG_PROGRESS="0", **TRANSPORTS[transport])
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["job_seconds"] = time.perf_counter() - t0
    return res


def row_of(res, transport, graph, nprocs, dim) -> dict:
    t = {k: v * 1e3 for k, v in res["median_s"].items()}
    pm = t["pipelined/msg"]
    row = {"transport": transport, "graph": graph, "np": nprocs, "D": dim}
    row["all_ok"] = all(e is not None and e < 1e-5 for e in res["errors"].values())
    for k in t:
        row[f"{k}_ms"] = t[k]
    row["vs_bulk_halo"] = t["bulk_halo/msg"] / pm
    row["vs_rma_get"] = t["pipelined/rma"] / pm
    row["vs_direct"] = t["direct/rma"] / pm if "direct/rma" in t else None
    row["exchange_share"] = t["exchange"] / t["bulk_halo/msg"]
    row["bound_vs_bulk"] = t["bulk_halo/msg"] / t["nocomm"]  # all communication hidden
    for k in ("pipelined/msg", "pipelined/rma", "bulk_halo/msg"):
        row[f"hidden_{k.split('/')[0]}_{k.split('/')[1]}"] = (
            1 - (t[k] - t["nocomm"]) / t["exchange"]
        )
        row[f"wait_{k}_ms"] = res["wait_s"][k] * 1e3
    row["exchange_sys_ms"] = res["exchange_sys_s"] * 1e3
    row["exchange_user_ms"] = res["exchange_user_s"] * 1e3
    row["halo_MB"] = res["halo_rows"] * dim * 4 / 1e6
    return row


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    labels = [f"{r['transport']} {r['graph']} P{r['np']} D{r['D']}" for r in rows]
    xs = np.arange(len(rows))
    ax = axes[0]
    w = 0.27
    ax.bar(xs - w, [r["vs_bulk_halo"] for r in rows], w, label="vs bulk halo")
    ax.bar(xs, [r["bound_vs_bulk"] for r in rows], w, label="bound: bulk / nocomm")
    ax.bar(xs + w, [r["vs_rma_get"] for r in rows], w, label="vs pipelined rma gets")
    ax.axhline(1.3, color="k", ls="--", lw=1, label="goal 1.3x")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks(xs, labels, fontsize=7, rotation=90)
    ax.set_ylabel("pipelined (msg) speedup")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("pipelined over messages, across 'nodes'")
    ax = axes[1]
    for i, (k, c) in enumerate(
        (("pipelined_msg", "C0"), ("pipelined_rma", "C2"), ("bulk_halo_msg", "C1"))
    ):
        ax.bar(xs + (i - 1) * w, [r[f"hidden_{k}"] for r in rows], w, color=c, label=k)
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_ylim(-1.5, 1.05)
    ax.set_xticks(xs, labels, fontsize=7, rotation=90)
    ax.set_ylabel("communication hidden: 1 - (T - nocomm) / exchange")
    ax.legend(fontsize=7)
    ax.set_title("fraction of the exchange hidden behind computation")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", default="2,4")
    ap.add_argument("--dims", default="16,128")
    ap.add_argument("--transports", default="nolocal,tcp")
    ap.add_argument("--graphs", default="rmat-s17,rmat-s18,cnr_2000,ego_twitter")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--name", default="network_designs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    ap.add_argument("--dim", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--no-direct", action="store_true", help="skip direct per-edge gets")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    graphs = []
    for name in args.graphs.split(","):
        if name.startswith("rmat-s"):
            graphs.append((name, f"rmat:scale={name[6:]},ef=16"))
        else:
            graphs += [(p.stem, str(p)) for p in real_graphs((name,))]
    rows = []
    for transport in args.transports.split(","):
        for name, spec in graphs:
            for nprocs in (int(n) for n in args.np.split(",")):
                for dim in (int(d) for d in args.dims.split(",")):
                    res = run_job(transport, nprocs, spec, dim, args.repeat, args.no_direct)
                    row = row_of(res, transport, name, nprocs, dim)
                    rows.append(row)
                    print(
                        f"{transport:>7} {name:>12} P={nprocs} D={dim:<4} pipelined msg "
                        f"{row['pipelined/msg_ms']:8.2f} ms  rma {row['pipelined/rma_ms']:8.2f}"
                        f"  bulk {row['bulk_halo/msg_ms']:8.2f}  nocomm {row['nocomm_ms']:8.2f}"
                        f"  exchange {row['exchange_ms']:7.2f} -> {row['vs_bulk_halo']:.2f}x "
                        f"bulk (bound {row['bound_vs_bulk']:.2f}x), hidden "
                        f"{row['hidden_pipelined_msg']:.2f}"
                        f"{'' if row['all_ok'] else '  MISMATCH'}  [{res['job_seconds']:.0f} s]",
                        flush=True,
                    )
    plot(rows, RESULTS / f"{args.name}.png")
    cols = ["transport", "graph", "np", "D", "pipelined/msg_ms", "pipelined/rma_ms",
            "bulk_halo/msg_ms", "direct/rma_ms", "nocomm_ms", "exchange_ms", "vs_bulk_halo",
            "bound_vs_bulk", "vs_rma_get", "vs_direct", "hidden_pipelined_msg",
            "hidden_pipelined_rma", "hidden_bulk_halo_msg", "exchange_sys_ms",
            "exchange_user_ms", "halo_MB", "all_ok"]  # fmt: skip
    write_results(
        args.name,
        {"transports": TRANSPORTS},
        rows,
        cols,
        notes="Every rank its own node (MPIR_CVAR_NOLOCAL=1); nolocal: UCX's shared-memory "
        "transports between the processes, tcp: UCX_TLS=tcp,self (loopback TCP). Times: "
        "median over round-robin calls of the slowest rank, op gcn, ps 16, dist 4. nocomm: "
        "bulk halo without its exchange (pack + aggregation); exchange: its alltoallv "
        "alone. bound_vs_bulk = bulk / nocomm, the most any overlap can win. hidden = 1 - "
        "(T - nocomm) / exchange. exchange_sys_ms / user_ms: CPU time a rank spends per "
        "exchange (slowest rank). P ranks share this machine's cores.",
    )


if __name__ == "__main__":
    main()
