"""First run: what a fresh install's `make demo` spends compiling numba kernels.

    python bench/first_run.py [--np 4] [--epochs 40] [--repeat 2]

Runs `mggrun -np NP mgg demo` with an empty numba cache (cold: every kernel compiles) and
again with the cache it filled (warm), with the node's compile lock (mgg/process.py) and
without it (MGG_SERIAL_COMPILE=0), round-robin. Compile overhead = cold wall - warm wall
of the same setting (medians). Goal: under 20 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from common import RESULTS, mgg_json, write_results


def demo(np_: int, epochs: int, cache: str, serial: bool) -> dict:
    env = {"NUMBA_CACHE_DIR": cache, "MGG_SERIAL_COMPILE": "1" if serial else "0"}
    t0 = time.perf_counter()
    res = mgg_json(np_, "demo", "--epochs", epochs, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "setup_s": res["setup_s"],
        "first_epoch_s": res["history"][0]["seconds"],
    }


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    labels = [r["compile_lock"].split(" ")[0] for r in rows]
    ys = np.arange(len(rows))
    ax.barh(ys, [r["warm_wall_s"] for r in rows], color="C0", label="warm cache (the job)")
    ax.barh(
        ys,
        [r["compile_overhead_s"] for r in rows],
        left=[r["warm_wall_s"] for r in rows],
        color="C3",
        label="compiling (cold - warm)",
    )
    ax.axvline(
        rows[0]["warm_wall_s"] + 20, color="k", ls="--", lw=1, label="goal: < 20 s compiling"
    )
    ax.set_yticks(ys, [f"compile lock {x}" for x in labels])
    ax.set_xlabel("wall seconds, 4-rank mgg demo on a fresh numba cache")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    runs = {(s, c): [] for s in (True, False) for c in ("cold", "warm")}
    for i in range(args.repeat):
        for serial in (True, False):
            with tempfile.TemporaryDirectory() as cache:
                for state in ("cold", "warm"):
                    res = demo(args.np, args.epochs, cache, serial)
                    runs[serial, state].append(res)
                    print(
                        f"round {i + 1} serial={int(serial)} {state}: {res['wall_s']:.1f} s "
                        f"(setup {res['setup_s']:.1f} s, first epoch {res['first_epoch_s']:.2f} s)",
                        flush=True,
                    )
    rows = []
    for serial in (True, False):
        med = {
            state: {
                k: float(np.median([r[k] for r in runs[serial, state]]))
                for k in runs[serial, state][0]
            }
            for state in ("cold", "warm")
        }
        rows.append(
            {
                "compile_lock": "on" if serial else "off (MGG_SERIAL_COMPILE=0)",
                "cold_wall_s": med["cold"]["wall_s"],
                "warm_wall_s": med["warm"]["wall_s"],
                "compile_overhead_s": med["cold"]["wall_s"] - med["warm"]["wall_s"],
                "cold_setup_s": med["cold"]["setup_s"],
                "warm_setup_s": med["warm"]["setup_s"],
                "cold_first_epoch_s": med["cold"]["first_epoch_s"],
                "warm_first_epoch_s": med["warm"]["first_epoch_s"],
            }
        )
    plot(rows, RESULTS / "first_run.png")
    write_results(
        "first_run",
        {
            "np": args.np,
            "epochs": args.epochs,
            "repeat": args.repeat,
            "runs": {f"serial={int(s)} {c}": v for (s, c), v in runs.items()},
        },
        rows,
        list(rows[0]),
        notes=f"`mggrun -np {args.np} mgg demo --epochs {args.epochs}`, each run a fresh "
        "process tree; cold: an empty NUMBA_CACHE_DIR, warm: the cache the cold run filled. "
        f"Medians of {args.repeat} rounds, the settings interleaved. Goal: compile "
        "overhead (cold - warm) under 20 s.",
    )


if __name__ == "__main__":
    main()
