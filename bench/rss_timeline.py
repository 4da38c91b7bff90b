"""What a job's ranks hold at their peak: run a command, sample every process under it
each 0.1 s, and print per process its peak VmRSS, when it came, and what it was made of
(RssAnon: heap and arrays; RssFile: libraries and memory-mapped shards; RssShmem: the
shared-memory windows' pages, the peers' rows a rank reads in place counted in its RSS).

    python bench/rss_timeline.py mggrun -np 4 mgg train --dataset DIR --epochs 3

The command's output is passed through with the seconds since the start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for c in map(int, f.read().split()):
                    out += [c, *children(c)]
    except OSError:
        pass
    return out


def parts(pid: int) -> dict | None:
    """The VmRSS lines of /proc/PID/status, in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            got = {
                line.split(":")[0]: int(line.split()[1]) / 1024
                for line in f
                if line.startswith(KEYS)
            }
    except OSError:
        return None
    return got if len(got) == len(KEYS) else None


def main(argv) -> int:
    if not argv:
        print(__doc__)
        return 2
    t0 = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, tuple[float, dict]] = {}

    def watch():
        while proc.poll() is None:
            for pid in children(proc.pid):
                got = parts(pid)
                if got and got["VmRSS"] > peaks.get(pid, (0, {"VmRSS": 0}))[1]["VmRSS"]:
                    peaks[pid] = (time.time() - t0, got)
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    for line in proc.stdout:
        print(f"[{time.time() - t0:7.2f}] {line}", end="")
    proc.wait()
    big = {pid: p for pid, p in peaks.items() if p[1]["VmRSS"] > 100}  # the ranks, not mpiexec
    for pid, (at, got) in sorted(big.items()):
        what = ", ".join(f"{k} {got[k]:,.0f}" for k in KEYS[1:])
        print(f"pid {pid}: peak {got['VmRSS']:,.0f} MB at {at:.1f} s ({what})")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
