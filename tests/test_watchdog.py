"""The collective watchdog of mgg.comm.mpi: a collective that some rank never joins ends
the job within MGG_COLLECTIVE_TIMEOUT seconds, with one line naming the op and the ranks
that did not join. Real mggrun jobs, several side by side where a test has more than one."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from mgg.comm.mpi import TIMEOUT_ENV, collective_timeout
from mgg.errors import InputError

from conftest import ROOT, run_mgg

NOLOCAL = {"MPIR_CVAR_NOLOCAL": "1"}  # every rank a node of its own (tests/test_network.py)

# Each rank writes "pid parent-pid" (the parent: hydra's proxy) to pid<rank> beside the
# script, so that a test can tell whether any of them outlived the job; say() writes its
# result to out<rank> (the ranks' stdout lines may interleave).
PIDS = """\
import os, pathlib, time
import numpy as np
from mgg.comm import get_comm
comm = get_comm()
here = pathlib.Path(__file__).parent
(here / f"pid{comm.rank}").write_text(f"{os.getpid()} {os.getppid()}")
def say(text):
    (here / f"out{comm.rank}").write_text(text)
"""


class Job:
    """``mggrun -np nprocs python SCRIPT`` in the background, SCRIPT being PIDS + body."""

    def __init__(self, folder, nprocs: int, body: str, timeout=None, env=None):
        folder.mkdir()
        self.folder, self.nprocs = folder, nprocs
        script = folder / "job.py"
        script.write_text(PIDS + textwrap.dedent(body))
        full = {k: v for k, v in os.environ.items() if k != TIMEOUT_ENV}
        full.update(MGG_PROGRESS="0", **(env or {}))
        if timeout is not None:
            full[TIMEOUT_ENV] = str(timeout)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(nprocs), "python",
             str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=full,
        )  # fmt: skip

    def finish(self, timeout=60):
        """(exit status, stdout, stderr, seconds the job ran)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()  # mpiexec, dying with mggrun, ends the ranks
                self.proc.communicate()
        return self.proc.returncode, out, err, time.monotonic() - self.started

    def said(self) -> list[str | None]:
        """What each rank said (None: nothing)."""
        files = [self.folder / f"out{r}" for r in range(self.nprocs)]
        return [f.read_text() if f.exists() else None for f in files]

    def left_behind(self, wait=5.0) -> list[int]:
        """The ranks and their proxies still running (after ``wait`` seconds at most)."""
        pids = set()
        for r in range(self.nprocs):
            f = self.folder / f"pid{r}"
            assert f.exists(), f"rank {r} never started"
            pids.update(map(int, f.read_text().split()))
        end = time.monotonic() + wait
        while (alive := [p for p in pids if _running(p)]) and time.monotonic() < end:
            time.sleep(0.1)
        return alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _mgg_lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("mgg:")]


def _waited_for(line: str) -> list[int]:
    """The ranks a watchdog line says its collective waited for."""
    m = re.search(r" waited [0-9.]+ s for ranks? ([0-9, ]+) \(", line)
    assert m, line
    return [int(r) for r in m.group(1).split(", ")]


@pytest.mark.mpi
def test_a_collective_that_one_rank_skips_ends_the_job_naming_op_and_rank(tmp_path):
    """The user's mistake the watchdog is for: rank 0 alone calls allreduce (an evaluation
    on rank 0 only), rank 1 goes on to a barrier and would then exit."""
    job = Job(
        tmp_path / "skip",
        2,
        """
        comm.barrier()
        if comm.rank == 0:
            comm.allreduce(np.ones(3))
            print("rank 0 passed its allreduce", flush=True)
        else:
            time.sleep(0.3)  # rank 0 is first in: its wait ends first, and it reports
            comm.barrier()
            print("rank 1 passed its barrier", flush=True)
        """,
        timeout=2,
    )
    code, out, err, seconds = job.finish()
    assert code != 0, out + err
    assert seconds < 15
    assert "passed" not in out, out
    lines = _mgg_lines(err)
    assert len(lines) == 1, err  # one rank reports, though both waited
    line = lines[0]
    assert re.match(r"mgg: allreduce #2 on rank 0 waited 2 s for rank 1 \(", line), line
    assert "rank 1 is in barrier #2" in line
    assert f"{TIMEOUT_ENV}=SECONDS" in line and "0 waits forever" in line
    assert "Traceback" not in err
    assert job.left_behind() == []


@pytest.mark.mpi
@pytest.mark.parametrize("env", [{}, NOLOCAL], ids=["one-node", "across-nodes"])
def test_the_message_names_only_the_rank_that_never_came(tmp_path, env):
    """Rank 2 of 3 never calls the barrier (it sleeps): ranks 0 and 1 wait, and the one
    line names rank 2 alone, with its last collective. Across nodes the ranks' states are
    read with MPI_Rget (MPIR_CVAR_NOLOCAL: MPICH puts every rank on a node of its own)."""
    job = Job(
        tmp_path / "sleeper",
        3,
        """
        comm.barrier()
        if comm.rank == 2:
            time.sleep(60)
        comm.barrier()
        print("passed", flush=True)
        """,
        timeout=2,
        env=env,
    )
    code, out, err, seconds = job.finish()
    assert code != 0 and seconds < 15, err
    assert "passed" not in out
    lines = _mgg_lines(err)
    assert len(lines) == 1, err
    assert re.match(r"mgg: barrier #2 on rank [01] waited 2 s for rank 2 \(", lines[0]), lines
    assert _waited_for(lines[0]) == [2]
    assert "rank 2's last collective is barrier #1" in lines[0]
    assert job.left_behind() == []


LATE = """
comm.barrier()
if comm.rank == 1:
    LATE
say(f"sum {comm.allreduce(np.array([comm.rank + 1.0]))[0]}")
"""


@pytest.mark.mpi
def test_a_late_rank_is_waited_for_up_to_the_timeout_and_0_waits_forever(tmp_path):
    """Rank 1 joins an allreduce 3 s after rank 0: the job completes with the default
    timeout and with 0 (no watchdog), fails with 1 s; work a rank announces as done alone
    (comm.alone(): rank 0 ordering the graph for all) is waited for past the timeout, and so
    is a rank caught at the deadline between its work alone and the collective ("gap": 0.1 s
    there, as a rank preempted on a loaded machine; rank 0 looks at 1 s, within the gap)."""
    sleep = "time.sleep(3)"
    gap = "with comm.alone(): time.sleep(0.95)\n    time.sleep(0.1)"
    jobs = {
        "default": Job(tmp_path / "default", 2, LATE.replace("LATE", sleep)),
        "0": Job(tmp_path / "zero", 2, LATE.replace("LATE", sleep), timeout=0),
        "1": Job(tmp_path / "one", 2, LATE.replace("LATE", sleep), timeout=1),
        "alone": Job(
            tmp_path / "alone", 2, LATE.replace("LATE", f"with comm.alone(): {sleep}"), timeout=1
        ),
        "gap": Job(tmp_path / "gap", 2, LATE.replace("LATE", gap), timeout=1),
    }
    done = {name: job.finish() for name, job in jobs.items()}
    for name in ("default", "0", "alone", "gap"):
        code, out, err, seconds = done[name]
        assert code == 0, (name, err[-2000:])
        assert jobs[name].said() == ["sum 3.0"] * 2, name
        assert seconds > (1 if name == "gap" else 3)
    code, out, err, seconds = done["1"]
    assert code != 0 and jobs["1"].said() == [None, None], err
    (line,) = _mgg_lines(err)
    assert re.match(r"mgg: allreduce #2 on rank 0 waited 1 s for rank 1 \(", line), line
    assert "rank 1's last collective is barrier #1" in line
    assert seconds < 15


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e400", "5s"])
def test_a_bad_timeout_is_refused_naming_the_variable(value):
    with pytest.raises(InputError, match=f"^{TIMEOUT_ENV}=.*a number >= 0 \\(0 waits forever\\)$"):
        collective_timeout({TIMEOUT_ENV: value})


@pytest.mark.parametrize(
    "value, seconds", [(None, 60.0), ("", 60.0), (" 2.5 ", 2.5), ("0", 0.0), ("1e3", 1000.0)]
)
def test_the_timeout_is_read_from_the_environment(value, seconds):
    env = {} if value is None else {TIMEOUT_ENV: value}
    assert collective_timeout(env) == seconds


def test_a_bad_timeout_is_one_line_from_the_cli():
    """Read when the comm is made, before any collective: `mgg` prints it as its one-line
    error and exits 2 (a job of one rank: no mpiexec)."""
    r = run_mgg("check", "rmat:scale=6,ef=4", "--json", env={TIMEOUT_ENV: "soon"})
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"mgg check: error: {TIMEOUT_ENV}='soon': expected the seconds a collective may wait "
        "for every rank to join it, a number >= 0 (0 waits forever)"
    ]


ALL_COLLECTIVES = """
import json
P, r, raw = comm.size, comm.rank, comm.comm  # raw: mpi4py's own collectives, the reference
send = np.arange(P * 2, dtype=np.float32).reshape(P, 2) + 10 * r
recv = np.empty_like(send)
comm.alltoallv(send, [1] * P, recv, [1] * P)
ref = np.empty_like(send)
raw.Alltoall(send, ref)
checks = {
    "allreduce": (comm.allreduce(np.array([r, 1.0]), "max").tolist(), [P - 1.0, 1.0]),
    "bcast": (comm.bcast({"from": r}, root=1), raw.bcast({"from": r}, root=1)),
    "allgather": (comm.allgather(("x", r)), raw.allgather(("x", r))),
    "gather": (comm.gather([r] * r, root=2), raw.gather([r] * r, root=2)),
    "alltoall": (comm.alltoall([(r, q) for q in range(P)]), [(q, r) for q in range(P)]),
    "alltoallv": (recv.tolist(), ref.tolist()),
    "big allgather": ([a.sum() for a in comm.allgather(np.ones(200_000) * r)],
                      [2e5 * q for q in range(P)]),
}
comm.barrier()
sym = comm.symmetric(4, 2)
sym.local[:] = r
sym.publish()
sym.free()
say(json.dumps({k: a == b for k, a, b in ((k, *v) for k, v in checks.items())}))
"""


@pytest.mark.mpi
def test_every_watched_collective_gives_what_mpi4py_gives(tmp_path):
    """The pickled-object collectives are rebuilt on non-blocking MPI (sizes, then bytes):
    each gives what mpi4py's own does, on 3 ranks."""
    job = Job(tmp_path / "all", 3, ALL_COLLECTIVES)
    code, out, err, _ = job.finish()
    assert code == 0, err[-3000:]
    for rank, said in enumerate(job.said()):
        assert said is not None and all(json.loads(said).values()), (rank, said)
