"""papers100m drawn and partitioned in memory: the rate per core of each stage, and what
it makes of scale 1 on the GPU machine's 16 cores (an extrapolation).

    python bench/papers_rate.py [--scales 0.02,0.05] [--threads 1,2] [--repeat 5]
                                [--ranks 2] [--probe 0.2] [--dtype bfloat16]

Each (scale, threads) runs --repeat times, each in a fresh process (NUMBA_NUM_THREADS=T),
the path of `mgg train papers100m:scale=S` at P = 1, stage by stage, with wall seconds
and the stage's peak RSS (VmHWM reset before it): sampler (node weights, class order,
the guide), draws (every round's), csr (the CSR built, each later round merged in),
node rows (labels and split: Papers.dataset), plan (partition.plan.job_plan, GCN's
graph, P = 1) and features (drawn in --dtype: prepare's order). Medians over the repeats.
``--ranks P``: also `mggrun -np P mgg partition papers100m:scale=S --distributed` (each
rank one thread), its wall seconds and largest rank's peak RSS.

Extrapolation (not a measurement): a stage's seconds at 16 threads are t1 / (16 e), e =
(t1 / t2) / 2 the parallel efficiency of its measured 1 -> 2 thread speedup, scaled by
the work at scale 1 over the work at the largest measured scale (nodes, draws or entries:
linear), the draws slowed by what a probe (--probe: the sampler's tables beyond the
cache) measures; bounds: Amdahl's law with the serial share that speedup implies, and
16 times one thread. The peak of each stage, fitted a + b S over the measured scales, at
S = 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import RESULTS, ROOT, csv_list, mgg_json, write_results

GOAL_S = 240.0  # generation and partition of scale 1 on 16 cores (the issue's)
GOAL_BYTES = 100 * 2**30  # peak host memory, within the GPU machine's 128 GiB
CORES = 16
STAGES = ("sampler", "draws", "csr", "node_rows", "plan", "features")
UNITS = {  # what a stage's work grows with, and its name
    "sampler": ("nodes", "nodes"),
    "draws": ("draws", "draws"),
    "csr": ("draws", "draws"),
    "node_rows": ("nodes", "nodes"),
    "plan": ("entries", "entries"),
    "features": ("values", "feature values"),
}


def worker(scale: float, dtype: str) -> dict:
    """One process's run of the stages (the caller sets NUMBA_NUM_THREADS)."""
    import numba
    import numpy as np

    from mgg.graph.core import Graph
    from mgg.graph.specs import papers_spec
    from mgg.memory import peak_rss_mb, reset_peak_rss
    from mgg.partition.plan import job_plan
    from mgg.precision import row_dtype

    gen = papers_spec(f"papers100m:scale={scale:g}")
    warm = papers_spec("papers100m:scale=0.0002").dataset()  # numba's cache loaded, untimed
    warm.rows(0, 10, dtype=row_dtype(dtype))
    job_plan(warm.graph, "gcn_norm", 1, rank=0)
    del warm
    out = {"threads": numba.get_num_threads(), "seconds": {}, "peak_mb": {}}
    sec, peak = out["seconds"], out["peak_mb"]
    n = gen.num_nodes

    def stage(name, fn, *args):
        reset_peak_rss()
        t0 = time.perf_counter()
        value = fn(*args)
        sec[name] = sec.get(name, 0.0) + time.perf_counter() - t0
        peak[name] = max(peak.get(name, 0.0), peak_rss_mb())
        return value

    reset_peak_rss()
    t0 = time.perf_counter()
    indptr, indices, draws = gen.csr(sec)
    whole = time.perf_counter() - t0
    for name in ("sampler", "draws", "csr"):
        peak[name] = peak_rss_mb()  # the graph's peak, its steps together
    sec["csr"] += whole - sum(sec[k] for k in ("sampler", "draws", "csr"))  # the rest
    graph = Graph(indptr, indices, None, n, symmetric=True, check=False)
    ids = np.arange(n, dtype=np.int64)
    y, masks = stage("node_rows", lambda: (gen.labels(ids), gen.masks(ids)))
    plan = stage("plan", lambda: job_plan(graph, "gcn_norm", 1, 16, rank=0))
    x = stage("features", gen.x, ids, y, row_dtype(dtype))
    del x, masks
    out.update(
        nodes=n, draws=draws, entries=int(indices.size), plan_entries=plan.num_edges,
        values=n * gen.features,
    )  # fmt: skip
    out["total_s"] = sum(sec.values())
    out["peak_total_mb"] = max(peak.values())
    return out


def run_worker(scale: float, threads: int, dtype: str) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--worker", f"{scale:g}", "--dtype", dtype]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="0.02,0.05")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--probe", type=float, default=0.2, help="draws at this scale (0: none)")
    ap.add_argument("--ranks", type=int, default=2, help="the --distributed run's (0: none)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--worker", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--probe-worker", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=20_000_000, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.dtype)))
        return
    if args.probe_worker is not None:
        print(json.dumps(probe_worker(args.probe_worker, args.count)))
        return
    if args.repeat < 1:
        raise SystemExit("papers_rate: --repeat must be >= 1")
    scales = csv_list(args.scales, cast=float)
    threads = csv_list(args.threads, cast=int)
    if threads[:2] != [1, 2]:
        raise SystemExit("papers_rate: --threads must start 1,2 (the extrapolation's speedup)")
    runs, rows, loads = {(sc, t): [] for sc in scales for t in threads}, [], []
    for scale in scales:
        for _ in range(args.repeat):  # the thread counts in turn: a busy spell hits both
            for t in threads:
                loads.append(load())
                runs[(scale, t)].append(run_worker(scale, t, args.dtype))
                print(json.dumps({"scale": scale, **runs[(scale, t)][-1], "load": loads[-1]}))
        rows += [row_of(scale, t, runs[(scale, t)]) for t in threads]
    probe = draw_probe(args.probe, max(scales)) if args.probe else None
    reps = min(args.repeat, 3)
    dist = distributed(scales, args.ranks, args.dtype, reps, loads) if args.ranks else []
    extra = extrapolate(runs, scales, probe)
    rows += extra["rows"]
    payload = {
        "runs": {f"{s:g}/{t}": r for (s, t), r in runs.items()},
        "distributed": dist,
        "extrapolation": extra,
        "draw_probe": probe,
        "load_average": loads,
        "goal": {"seconds": GOAL_S, "peak_bytes": GOAL_BYTES, "cores": CORES},
    }
    notes = notes_of(args, extra, dist, loads, probe)
    cols = ["scale", "threads", *[f"{s}_s" for s in STAGES], "total_s", "peak_mb"]
    cols += ["draws_per_s_core", "entries_per_s_core", "features_per_s_core"]
    write_results("papers_rate", payload, rows + dist, cols + ["ranks"], notes)
    plot(rows, extra)


def row_of(scale: float, threads: int, reps: list[dict]) -> dict:
    """The medians of the repeats, and the rates per core."""
    med = {s: statistics.median(r["seconds"][s] for r in reps) for s in STAGES}
    r0 = reps[0]
    row = {"scale": scale, "threads": threads, **{f"{s}_s": med[s] for s in STAGES}}
    row["total_s"] = statistics.median(r["total_s"] for r in reps)
    row["peak_mb"] = statistics.median(r["peak_total_mb"] for r in reps)
    row["peak_stage_mb"] = {s: statistics.median(r["peak_mb"][s] for r in reps) for s in STAGES}
    graph_s = med["draws"] + med["csr"] + med["sampler"]
    row["draws_per_s_core"] = r0["draws"] / graph_s / threads
    row["entries_per_s_core"] = r0["entries"] / graph_s / threads
    row["features_per_s_core"] = r0["values"] / med["features"] / threads
    row.update({k: r0[k] for k in ("nodes", "draws", "entries", "plan_entries", "values")})
    return row


def extrapolate(runs: dict, scales: list[float], probe: dict | None) -> dict:
    """Scale 1 on CORES threads from the largest scale's 1 and 2 thread medians, three
    ways: each stage at the parallel efficiency e = (t1 / t2) / 2 of its measured speedup
    (the estimate), by Amdahl's law with the serial share that speedup implies (a bound
    from above: on a shared 2-core VM a busy spell looks serial), and ideal (e = 1: a
    bound from below); the draws slowed by the probe's ratio, where the sampler's tables
    outgrow the cache."""
    from mgg.graph.specs import papers_spec

    top = max(scales)
    one, two = row_of(top, 1, runs[(top, 1)]), row_of(top, 2, runs[(top, 2)])
    gen = papers_spec("papers100m")
    work = {  # at scale 1: nodes and values exact, draws and entries in proportion
        "nodes": gen.num_nodes,
        "values": gen.num_nodes * gen.features,
        "draws": one["draws"] * gen.entries / (one["entries"] or 1),
        "entries": one["plan_entries"] * gen.num_nodes / one["nodes"],
    }
    slower = {s: 1.0 for s in STAGES}
    if probe is not None:
        slower["draws"] = max(1.0, probe["ratio"])
    models = {"estimate": {}, "amdahl": {}, "ideal": {}}
    efficiency = {}
    for s in STAGES:
        t1, t2 = one[f"{s}_s"], two[f"{s}_s"]
        e = min(max(t1 / t2 / 2, 0.5), 1.0) if t2 > 0 else 1.0
        unit = UNITS[s][0]
        base = (
            t1 * slower[s] * work[unit] / (one["plan_entries"] if unit == "entries" else one[unit])
        )
        f = 2 - 1 / e  # Amdahl's parallel share of the same speedup
        models["estimate"][s] = base / (CORES * e)
        models["amdahl"][s] = base * ((1 - f) + f / CORES)
        models["ideal"][s] = base / CORES
        efficiency[s] = e
    peaks = {}
    for s in STAGES:  # a + b S through the measured scales (the largest two)
        pts = sorted((sc, row_of(sc, 1, runs[(sc, 1)])["peak_stage_mb"][s]) for sc in scales)
        (s0, p0), (s1, p1) = pts[-2] if len(pts) > 1 else (0.0, 0.0), pts[-1]
        b = (p1 - p0) / (s1 - s0)
        peaks[s] = (p1 + b * (1.0 - s1)) * 2**20
    rows = []
    for name, secs in models.items():
        label = "extrapolated" if name == "estimate" else name
        row = {"scale": 1.0, "threads": f"{CORES} ({label})", "total_s": sum(secs.values())}
        row.update({f"{s}_s": secs[s] for s in STAGES})
        rows.append(row)
    rows[0]["peak_mb"] = max(peaks.values()) / 2**20
    return {
        "from_scale": top,
        "efficiency": efficiency,
        "seconds": models["estimate"],
        "total_s": rows[0]["total_s"],
        "amdahl_seconds": models["amdahl"],
        "amdahl_total_s": rows[1]["total_s"],
        "ideal_seconds": models["ideal"],
        "ideal_total_s": rows[2]["total_s"],
        "draws_slower": slower["draws"],
        "peak_bytes": peaks,
        "peak_max_bytes": max(peaks.values()),
        "work": work,
        "rows": rows,
    }


def draw_probe(scale: float, top: float, count: int = 20_000_000) -> dict:
    """ns per draw on one thread at ``scale`` (the sampler's tables beyond the cache) and
    at ``top``, the same count of draws, the median of 3 each, in a fresh process."""
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = {}
    for s in (top, scale):
        cmd = [sys.executable, __file__, "--probe-worker", f"{s:g}", "--count", str(count)]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
        out[s] = json.loads(r.stdout.strip().splitlines()[-1])["ns_per_draw"]
    res = {"scale": scale, "at": top, "ns_per_draw": {f"{k:g}": v for k, v in out.items()}}
    res["ratio"] = out[scale] / out[top]
    print(json.dumps(res), flush=True)
    return res


def probe_worker(scale: float, count: int) -> dict:
    from mgg.graph.specs import papers_spec

    gen = papers_spec(f"papers100m:scale={scale:g}")
    sampler = gen.sampler()
    gen.draws(0, 1000, sampler)
    times = []
    for k in range(3):
        t0 = time.perf_counter()
        gen.draws(k * count, (k + 1) * count, sampler)
        times.append(time.perf_counter() - t0)
    return {"ns_per_draw": statistics.median(times) / count * 1e9}


def distributed(scales, ranks: int, dtype: str, repeat: int, loads: list) -> list[dict]:
    """`mggrun -np P mgg partition SPEC --distributed`: wall seconds (median), peak RSS."""
    out = []
    for scale in scales:
        secs, peaks = [], []
        for _ in range(repeat):
            loads.append(load())
            t0 = time.perf_counter()
            env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
            part = mgg_json(
                ranks, "partition", f"papers100m:scale={scale:g}", "--distributed",
                "--dtype", dtype, env=env,
            )  # fmt: skip
            secs.append(time.perf_counter() - t0)
            peaks.append(max(part["peak_rss_mb"]))
        out.append(
            {
                "scale": scale,
                "threads": f"{ranks} ranks x 1",
                "ranks": ranks,
                "total_s": statistics.median(secs),
                "peak_mb": statistics.median(peaks),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def notes_of(args, extra: dict, dist: list, loads: list, probe: dict | None) -> str:
    e = extra
    fit = "within" if e["total_s"] <= GOAL_S else "OVER"
    stages = ", ".join(f"{s} {e['seconds'][s]:.0f} s" for s in STAGES)
    eff = ", ".join(f"{s} {e['efficiency'][s]:.2f}" for s in STAGES)
    slower = ""
    if probe:
        far, near = (probe["ns_per_draw"][f"{probe[k]:g}"] for k in ("scale", "at"))
        slower = (
            f"; the draws {e['draws_slower']:.2f}x slower per draw, as a probe at scale "
            f"{probe['scale']:g} (the sampler's tables beyond the cache: {far:.0f} ns a draw "
            f"on one thread) measured them against scale {probe['at']:g} ({near:.0f} ns)"
        )
    return (
        f"`mgg train papers100m:scale=S` at P = 1, its stages in one process each run "
        f"(features in {args.dtype}), medians of {args.repeat} (1 and 2 threads in turn); "
        "seconds per stage and the peak RSS over them; per core: draws and CSR entries per "
        "second of sampler + draws + csr, feature values per second of the features "
        "stage, divided by the threads. The scale 1 rows are an **extrapolation, not a "
        f"measurement**: 111,059,956 nodes, {e['work']['entries']:,.0f} plan entries, on "
        f"{CORES} cores, from scale {e['from_scale']:g}, work in proportion to nodes, draws "
        f"or entries{slower}. `16 (extrapolated)`: each stage at the parallel efficiency "
        f"of its measured 1 -> 2 thread speedup ({eff}): {stages}; total "
        f"**{e['total_s']:.0f} s** ({fit} the {GOAL_S:.0f} s goal). Bounds: `16 (amdahl)`, "
        f"that speedup's serial share held serial at 16 threads, {e['amdahl_total_s']:.0f}"
        f" s (pessimistic: a busy spell on this shared VM reads as serial work); `16 "
        f"(ideal)`, 16 times one thread, {e['ideal_total_s']:.0f} s. Peak RSS fitted "
        f"linearly over the scales, at scale 1: **{e['peak_max_bytes'] / 2**30:.1f} GiB** "
        f"(goal <= {GOAL_BYTES / 2**30:.0f} GiB of 128). A 2-core VM: load averages (1, 5, "
        f"15 min) between {min(min(v) for v in loads):.2f} and "
        f"{max(max(v) for v in loads):.2f} while measuring (a run's own threads count); "
        "one-thread times of a stage vary by about 10% run to run, and the speedups, and "
        "so the extrapolation, are as good as those. "
        + (
            f"Rows `{dist[0]['threads']}`: `mggrun -np {dist[0]['ranks']} mgg partition "
            "SPEC --distributed` (no shards written), wall seconds and the largest rank's "
            "peak RSS."
            if dist
            else ""
        )
    )


def plot(rows: list[dict], extra: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [f"s={r['scale']:g}\nT={r['threads']}" for r in rows]
    for k, name in enumerate(("extrapolated", "amdahl", "ideal")):
        labels[len(rows) - 3 + k] = f"s=1, T={CORES}\n{name}"
    bottom = [0.0] * len(rows)
    for s in STAGES:
        vals = [r[f"{s}_s"] for r in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=s)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.axhline(GOAL_S, color="k", ls=":", lw=1, label=f"goal {GOAL_S:.0f} s (scale 1)")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("papers100m: generation and partition, by stage")
    ax.legend(fontsize=7)
    peaks = extra["peak_bytes"]
    bx.bar(range(len(STAGES)), [peaks[s] / 2**30 for s in STAGES])
    bx.axhline(GOAL_BYTES / 2**30, color="k", ls=":", lw=1, label="goal 100 GiB")
    bx.axhline(128, color="r", ls=":", lw=1, label="the machine's 128 GiB")
    bx.set_xticks(range(len(STAGES)), STAGES, fontsize=8)
    bx.set_ylabel("GiB")
    bx.set_title("peak RSS at scale 1 by stage (extrapolated)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "papers_rate.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
