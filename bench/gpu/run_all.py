"""Everything that needs the GPU machine, as named stages (one device call can run
several; each stage has a time limit so one slow stage cannot eat the session).

    python bench/gpu/run_all.py --stages probe,tests,check,aggregation [--quick]

Stages, in the order worth running them:
  probe        bench/gpu/probe.py with 2 PEs sharing the GPU -> docs/gpu-notes.md
  tests        pytest tests/test_cuda.py (the gpu-marked tests included)
  check        mggrun -np 4 mgg check --backend cuda (NVSHMEM PEs vs scipy)
  aggregation  issue 6: single PE vs cuSPARSE and PyG, Reddit-size R-MAT
  table1 fig8 table4 fig9 fig10 e2e   issue 7: the paper's evaluation
Output: bench/results/gpu/ (JSON, markdown, PNG, raw logs) and run_all.log.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
RUN = [PY, str(ROOT / "launch" / "mggrun")]

STAGES = {
    "probe": ([*RUN, "-np", "2", PY, "bench/gpu/probe.py"], [], 300),
    "tests": ([PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"], [], 580),
    "check": (
        [
            *RUN,
            "-np",
            "4",
            "mgg",
            "check",
            "rmat:scale=16,ef=16",
            "--backend",
            "cuda",
            "--op",
            "all",
            "--dim",
            "64",
            "--json",
        ],
        [],
        300,
    ),
    "aggregation": ([PY, "bench/gpu/aggregation.py"], ["--edges", "20000000"], 580),
    "table1": ([PY, "bench/gpu/table1_direct_vs_uvm.py"], ["--scale", "0.1"], 580),
    "fig8": ([PY, "bench/gpu/fig8_mgg_vs_uvm.py"], ["--scale", "0.1"], 580),
    "table4": ([PY, "bench/gpu/table4_mgg_vs_dgcl.py"], ["--scale", "0.1"], 580),
    "fig9": ([PY, "bench/gpu/fig9_ablation.py"], ["--scale", "0.1"], 580),
    "fig10": ([PY, "bench/gpu/fig10_tuner.py"], ["--scale", "0.25"], 580),
    "e2e": ([PY, "bench/gpu/e2e_vs_pyg.py"], ["--scale", "0.05"], 580),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", default="probe,tests,check")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = ap.parse_args()
    log_dir = ROOT / "bench" / "results" / "gpu"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "run_all.log", "a") as log:
        for name in args.stages.split(","):
            cmd, quick, limit = STAGES[name]
            cmd = cmd + (quick if args.quick else [])
            t0 = time.time()
            line = f"== {name}: {' '.join(cmd)}"
            print(line, flush=True)
            log.write(line + "\n")
            try:
                r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
                out, rc = r.stdout + r.stderr, r.returncode
            except subprocess.TimeoutExpired as e:
                out = (
                    (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                )
                rc = "timeout"
            tail = out[-4000:]
            print(tail, flush=True)
            log.write(out + f"\n== {name}: rc={rc} in {time.time() - t0:.0f} s\n")
            print(f"== {name}: rc={rc} in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
