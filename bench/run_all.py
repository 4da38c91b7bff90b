"""Run every CPU benchmark in turn (`make bench`); results land in bench/results/.

python bench/run_all.py [--quick] [--only NAME[,NAME...]]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (arguments, quick arguments)
BENCHES = {
    "partition_throughput": (["--reddit"], ["--max-scale", "18"]),
    "cpu_aggregation": (["--real"], ["--scale", "16", "--repeat", "5"]),
    "distributed_designs": (["--real"], ["--rmat-scale", "14", "--repeat", "3"]),
    "train_vs_peers": (
        [],
        ["--graphs", "cora", "--products", "", "--models", "gcn,gat", "--epochs", "5"]
        + ["--rounds", "1", "--no-dgl"],
    ),
    "host_floor": ([], ["--graphs", "planted", "--models", "gcn", "--rounds", "1", "--peers", ""]),
    "first_run": ([], ["--np", "2", "--epochs", "3", "--repeat", "1"]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(BENCHES)
    for name in names:
        full, quick = BENCHES[name]
        cmd = [sys.executable, str(HERE / f"{name}.py"), *(quick if args.quick else full)]
        print(f"== {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True, cwd=HERE)


if __name__ == "__main__":
    main()
