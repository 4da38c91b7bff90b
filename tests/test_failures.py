"""How mggrun jobs fail: real mpiexec runs that are killed, interrupted or refused, and
what they leave in /dev/shm (MPICH's intranode segment, /dev/shm/mpich_shm_*) and /tmp
(hydra's topology file, /tmp/hydra_hwloc_xmlfile_*)."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, mpirun

pytestmark = pytest.mark.mpi

SHM = Path("/dev/shm")
TMP = Path("/tmp")
HYDRA_FILE = "/tmp/hydra_hwloc_xmlfile_"
needs_linux = pytest.mark.skipif(
    not (SHM.is_dir() and Path("/proc/self/maps").exists()), reason="needs /dev/shm and /proc"
)


def _descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(pid))
    out, todo = [], [root]
    while todo:
        for kid in kids.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _ranks(pids) -> dict[int, int]:
    """{MGG_RANK: pid} of the ranks among ``pids``."""
    out = {}
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        rank = [e for e in env if e.startswith(b"MGG_RANK=")]
        if rank and b"--mgg-rank-shim" not in cmd:
            out[int(rank[0][9:])] = pid
    return out


def _held(pids, prefix: str) -> set[str]:
    """The files named ``prefix``* that these processes hold open."""
    out = set()
    for pid in pids:
        try:
            fds = list(os.scandir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith(prefix):
                out.add(target.removesuffix(" (deleted)"))
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _segments(pids) -> dict[str, bool]:
    """{/dev/shm/mpich_shm_* path: still linked} of the segments these processes map."""
    out = {}
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for ln in lines:
            if "/dev/shm/mpich_shm_" in ln:
                path = ln[ln.index("/dev/shm/") :]
                out[path.removesuffix(" (deleted)")] = not path.endswith(" (deleted)")
    return out


_JOBS = []


@pytest.fixture(autouse=True)
def _end_jobs():
    """A failed test must not leave its job running."""
    yield
    while _JOBS:
        job = _JOBS.pop()
        if job.proc.poll() is None:
            job.proc.kill()  # mpiexec, dying with mggrun, ends the ranks
            job.proc.communicate()
        for pid in job.running():  # what outlived a killed mggrun
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class Job:
    """mggrun run in the background, watching its processes (``pids``), the MPICH
    segments its ranks map (``seen``) and the hydra topology files they hold (``hydra``)."""

    def __init__(self, np_, *args, env=None):
        self.before = {d: set(os.listdir(d)) for d in (TMP, SHM)}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(np_), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, MGG_PROGRESS="0", **(env or {})),
        )
        self.seen: dict[str, bool] = {}
        self.ranks: dict[int, int] = {}
        self.pids: set[int] = {self.proc.pid}
        self.hydra: set[str] = set()
        _JOBS.append(self)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while self.proc.poll() is None:
            pids = _descendants(self.proc.pid)
            self.pids.update(pids)
            self.ranks.update(_ranks(pids))
            self.hydra |= _held(pids, HYDRA_FILE)
            for path, linked in _segments(self.ranks.values()).items():
                self.seen[path] = self.seen.get(path, False) or linked
            time.sleep(0.05)

    def running(self) -> list[int]:
        """The job's processes still running (after mggrun they may have outlived it)."""
        return [pid for pid in self.pids if _running(pid)]

    def wait_for(self, cond, timeout=90):
        end = time.monotonic() + timeout
        while not cond():
            assert self.proc.poll() is None, self.finish()[1][-3000:]
            assert time.monotonic() < end, "timed out waiting for the job"
            time.sleep(0.1)

    def training(self, np_):
        """All ranks are up and past get_comm (which unlinks their segment)."""
        segs = _segments(self.ranks.values())
        return len(self.ranks) == np_ and self.seen and not any(segs.values())

    def finish(self, timeout=90):
        out, err = self.proc.communicate(timeout=timeout)
        time.sleep(0.1)  # let the watcher see the end
        return out, err


def _left_over(job: Job) -> list[str]:
    """What the job made in /dev/shm and /tmp that outlived it: the MPICH segments its
    ranks mapped, the hydra files its processes held, and new names that carry one of its
    pids (other jobs run beside this one: only names this job could have made count)."""
    assert job.seen, "the job's segment was never seen"
    left = [p for p in sorted(job.seen.keys() | job.hydra) if os.path.exists(p)]
    for folder, before in job.before.items():
        for name in sorted(set(os.listdir(folder)) - before):
            numbers = re.findall(r"(?<![0-9A-Za-z])[0-9]+(?![0-9A-Za-z])", name)
            if job.pids & set(map(int, numbers)):
                left.append(str(folder / name))
    return left


@pytest.mark.parametrize("np_", ["0", "-2"])
def test_mggrun_refuses_a_nonpositive_rank_count(np_):
    r = mpirun(np_, "mgg", "info", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == f"mggrun: -np takes a positive number of ranks, got {np_}"


def test_mggrun_refuses_a_missing_command_in_one_line():
    r = mpirun(2, "nosuchcmd-mgg", "--flag", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "mggrun: nosuchcmd-mgg: command not found (nor an executable file)"
    ]
    assert "Traceback" not in r.stderr


def test_mggrun_options_still_split_from_the_command(tmp_path):
    from mgg.launch import _split, check_command

    opts, cmd = _split(["-np", "2", "-f", "hosts", "-genv", "A", "1", "mgg", "info"])
    assert (opts, cmd) == (["-np", "2", "-f", "hosts", "-genv", "A", "1"], ["mgg", "info"])
    check_command(["python", "x.py"], [])
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    check_command(["./run.sh"], ["-wdir", str(tmp_path)])
    with pytest.raises(SystemExit, match="command not found"):
        check_command(["./run.sh"], [])


@needs_linux
def test_a_user_error_at_np4_ends_with_one_code_and_no_shm_left():
    job = Job(4, "mgg", "train", "--dataset", "nosuch.npz")
    out, err = job.finish()
    assert job.proc.returncode == 2, err[-3000:]
    assert "nosuch.npz" in err and "Traceback" not in err
    assert _left_over(job) == []


@needs_linux
@pytest.mark.parametrize(
    "sig, word", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "terminated")]
)
def test_ctrl_c_or_sigterm_prints_one_line_and_exits_128_plus_the_signal(sig, word):
    graph = "planted:nodes=30000,classes=3"  # epochs long enough to be inside a kernel
    job = Job(4, "mgg", "train", "--dataset", graph, "--epochs", 10**6)
    job.wait_for(lambda: job.training(4))
    time.sleep(1.0)  # into the epochs
    t0 = time.monotonic()
    job.proc.send_signal(sig)
    out, err = job.finish(timeout=30)
    took = f"the job ended {time.monotonic() - t0:.1f} s after the signal"
    assert job.proc.returncode == 128 + sig, took
    assert err.strip().splitlines() == [f"mgg train: {word}"], took
    # mpiexec's failure banner: the ranks ended by an abort, not by mggrun's SIGTERM to
    # mpiexec (sent when no local rank is found, or after launch.ESCALATE_AFTER_S: `took`
    # tells which)
    assert "TERMINATION" not in out, f"{took}:\n{out[-1500:]}"
    assert _left_over(job) == []


@pytest.mark.slow
@needs_linux
def test_a_rank_killed_mid_training_ends_the_job_fast_and_leaves_no_shm():
    job = Job(4, "mgg", "train", "--dataset", "planted:nodes=2000,classes=4", "--epochs", 10**6)
    job.wait_for(lambda: job.training(4))
    time.sleep(1.0)  # into the epochs
    t0 = time.monotonic()
    os.kill(job.ranks[2], signal.SIGKILL)
    job.finish(timeout=60)
    elapsed = time.monotonic() - t0
    assert job.proc.returncode != 0
    assert elapsed < 30, elapsed
    assert _left_over(job) == []


MPI4PY_JOB = """
import os, sys, time
from mpi4py import MPI  # plain mpi4py: MPICH keeps its segment linked until MPI_Finalize
comm = MPI.COMM_WORLD
comm.Barrier()
go, die = sys.argv[1], sys.argv[2:] == ["die"]
while not os.path.exists(go):
    time.sleep(0.05)
if comm.rank == 1 and die:
    os.kill(os.getpid(), 9)
comm.Barrier()
"""


@needs_linux
def test_the_launcher_reaps_a_killed_jobs_segment_but_not_a_running_jobs(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(MPI4PY_JOB))
    go = tmp_path / "go"
    a = Job(2, "python", script, go)
    a.wait_for(lambda: a.seen)
    (seg_a,) = a.seen
    kill = tmp_path / "kill"
    b = Job(2, "python", script, kill, "die")
    b.wait_for(lambda: len(b.ranks) == 2 and b.seen)
    kill.touch()
    b.finish()
    assert b.proc.returncode != 0
    assert _left_over(b) == []  # no rank of b lived to unlink it: mggrun did
    assert os.path.exists(seg_a)  # a's is mapped by its live ranks: untouched
    go.touch()
    out, err = a.finish()
    assert a.proc.returncode == 0, err[-3000:]
    assert not os.path.exists(seg_a)


@needs_linux
def test_sigterm_to_mggrun_leaves_no_shm(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(MPI4PY_JOB))
    job = Job(3, "python", script, tmp_path / "never")
    job.wait_for(lambda: len(job.ranks) == 3 and job.seen)
    job.proc.send_signal(signal.SIGTERM)
    job.finish(timeout=30)
    assert job.proc.returncode != 0
    assert _left_over(job) == []


# ---- the harness: a real 2-rank `mgg train`, ended each way, and what it leaves ------------
STAND_IN = "products:scale=0.002"


def _ended(job: Job, timeout=30) -> list[int]:
    """Wait for every process of the job to end (after a SIGKILL of mggrun they outlive
    it); those still running at ``timeout``."""
    end = time.monotonic() + timeout
    while job.running() and time.monotonic() < end:
        time.sleep(0.1)
    return job.running()


def _kill(job: Job, how: str) -> None:
    if how == "sigkill-rank":
        os.kill(job.ranks[1], signal.SIGKILL)
    elif how == "sigkill-mggrun":
        job.proc.kill()
    elif how != "none":
        job.proc.send_signal(getattr(signal, how.upper()))


# how the job ends: (mggrun's exit code, its stderr lines; None: any but 0 / not checked)
ENDINGS = {
    "none": (0, None),
    "sigterm": (143, ["mgg train: terminated"]),
    "sigint": (130, ["mgg train: interrupted"]),
    "sighup": (129, ["mgg train: hung up"]),
    "sigquit": (131, ["mgg train: stopped by SIGQUIT"]),  # ended silently, not 128 + N
    "sigusr1": (138, ["mgg train: stopped by SIGUSR1"]),
    "sigkill-rank": (None, None),
    "sigkill-mggrun": (-signal.SIGKILL, None),
}


@needs_linux
@pytest.mark.parametrize("how", list(ENDINGS))
def test_a_job_ended_any_way_ends_whole_and_leaves_nothing(how):
    """Done, stopped by a signal to mggrun, a rank killed, mggrun itself killed: every
    process of the job ends, mggrun exits with the documented code and line, and nothing
    the job made stays in /tmp (hydra's topology file) or /dev/shm (MPICH's segments)."""
    epochs = 3 if how == "none" else 10**6
    job = Job(2, "mgg", "train", "--dataset", STAND_IN, "--epochs", epochs)
    if how != "none":
        job.wait_for(lambda: job.training(2))
        time.sleep(1.0)  # into the epochs
    _kill(job, how)
    out, err = job.finish(timeout=60)
    assert _ended(job) == [], f"processes of the job still run after it ended ({how})"
    code, lines = ENDINGS[how]
    if code is None:
        assert job.proc.returncode != 0
    else:
        assert job.proc.returncode == code, err[-3000:]
    if lines is not None:
        assert err.strip().splitlines() == lines
        assert "TERMINATION" not in out, out[-1500:]
    assert _left_over(job) == []


def test_what_the_ranks_run_tells_an_mgg_job_however_it_is_spelled():
    from mgg.launch import SHIM, mgg_subcommand

    venv_mgg = [sys.executable, str(Path(sys.executable).parent / "mgg"), "train", "-x"]
    assert mgg_subcommand(venv_mgg) == "train"  # a console script, as the kernel runs it
    assert mgg_subcommand(["python3", "-u", "-X", "dev", "-m", "mgg", "tune"]) == "tune"
    assert mgg_subcommand(["python", "-m", "mgg.launch", SHIM, "mgg", "check"]) == "check"
    assert mgg_subcommand(["python", "-m", "mgg.launch", SHIM, "/v/bin/mgg", "info"]) == "info"
    for other in (["sh", "run.sh", "train"], ["python", "job.py", "train"], ["mgg", "--help"]):
        assert mgg_subcommand(other) is None, other
    assert mgg_subcommand(["python", "-c", "pass", "mgg", "train"]) is None


WRAPPER = """#!/bin/sh
# a wrapper that runs mgg as its child (no exec)
{python} -m mgg "$@"
"""


@needs_linux
@pytest.mark.parametrize("spelling", ["path", "python -m", "wrapper"])
def test_sigterm_ends_an_mgg_job_cleanly_however_the_command_is_spelled(spelling, tmp_path):
    """Not only `mgg`: a path to it (a virtualenv not activated), `python -m mgg`, a
    script that runs mgg as its child all get mgg's quiet ending (no MPICH banner)."""
    wrapper = tmp_path / "run.sh"
    wrapper.write_text(WRAPPER.format(python=sys.executable))
    wrapper.chmod(0o755)
    command = {
        "path": [Path(sys.executable).parent / "mgg"],
        "python -m": ["python", "-m", "mgg"],
        "wrapper": [wrapper],
    }[spelling]
    job = Job(2, *command, "train", "--dataset", STAND_IN, "--epochs", 10**6)
    job.wait_for(lambda: job.training(2))
    time.sleep(1.0)
    job.proc.send_signal(signal.SIGTERM)
    out, err = job.finish(timeout=60)
    assert _ended(job) == []
    assert job.proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines() == ["mgg train: terminated"]
    assert "TERMINATION" not in out, out[-1500:]
    assert _left_over(job) == []


@needs_linux
def test_sigkill_of_mggrun_still_ends_the_job_and_removes_its_segment(tmp_path):
    """mggrun killed while the ranks hold MPICH's segment linked (plain mpi4py keeps it
    until MPI_Finalize): the job ends anyway, and its segment goes."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(MPI4PY_JOB))
    job = Job(2, "python", script, tmp_path / "never")
    job.wait_for(lambda: len(job.ranks) == 2 and any(job.seen.values()))
    job.proc.kill()
    job.finish(timeout=60)
    assert _ended(job) == []
    assert job.proc.returncode == -signal.SIGKILL
    assert _left_over(job) == []


def test_reap_shm_spares_held_and_young_files(tmp_path):
    from mgg.launch import reap_shm

    if not SHM.is_dir():
        pytest.skip("no /dev/shm")
    tag = f"mpich_shm_test{os.getpid():x}"
    held, free = SHM / f"{tag}_0", SHM / f"{tag}_1"
    held.write_bytes(b"x")
    free.write_bytes(b"x")
    try:
        with open(held):
            assert str(free) not in reap_shm(min_age=60)  # too young
            removed = reap_shm(min_age=0)
        assert str(free) in removed and not free.exists()
        assert str(held) not in removed and held.exists()
    finally:
        for p in (held, free):
            p.unlink(missing_ok=True)


def test_ctrl_c_in_mgg_is_one_line_without_a_traceback(monkeypatch, capsys):
    from mgg import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.info, "main", interrupted)
    for var in ("MGG_LAUNCHER", "PMI_RANK", "MGG_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["info"]) == 130
        assert capsys.readouterr().err == "mgg info: interrupted\n"
        monkeypatch.setenv("MGG_LAUNCHER", "mggrun")  # then mggrun prints it, once
        assert cli.main(["info"]) == 130
        assert capsys.readouterr().err == ""
    finally:
        signal.signal(signal.SIGINT, handler)


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGTERM])
def test_an_ending_signal_to_mgg_outside_mggrun_is_one_line_and_128_plus_it(
    monkeypatch, capsys, sig
):
    from mgg import cli
    from mgg.launch import stopped

    def signalled(args):
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler runs at the next bytecode
        return 0

    monkeypatch.setattr(cli.info, "main", signalled)
    for var in ("MGG_LAUNCHER", "PMI_RANK", "MGG_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    saved = {s: signal.getsignal(s) for s in (sig, signal.SIGXFSZ)}
    try:
        signal.signal(sig, signal.SIG_DFL)
        assert cli.main(["info"]) == 128 + sig
        assert capsys.readouterr().err == f"mgg info: {stopped(sig)}\n"
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


@needs_linux
def test_a_sigquit_to_a_bare_mgg_train_ends_it_in_one_line(tmp_path):
    env = dict(os.environ, MGG_PROGRESS="0")
    for var in ("MGG_LAUNCHER", "PMI_RANK", "MGG_SIZE", "PMI_SIZE"):
        env.pop(var, None)
    log, errors = tmp_path / "log", tmp_path / "stderr"
    argv = ["train", "--dataset", "planted:nodes=2000,classes=3", "--epochs", "1000000"]
    with open(errors, "wb") as sink:  # a file, not a pipe: no helper process holds it open
        proc = subprocess.Popen(
            [sys.executable, "-m", "mgg", *argv, "--log-dir", str(log)],
            env=env, stdout=subprocess.DEVNULL, stderr=sink,
            preexec_fn=lambda: signal.signal(signal.SIGQUIT, signal.SIG_DFL),  # not inherited
        )  # fmt: skip
    end = time.time() + 120
    while not (log / "metrics.jsonl").exists():  # training: the handlers are set
        assert proc.poll() is None and time.time() < end, errors.read_text()[-2000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGQUIT)
    proc.wait(timeout=60)
    err = errors.read_text()
    assert proc.returncode == 128 + signal.SIGQUIT, err[-2000:]
    assert err.strip().splitlines() == ["mgg train: stopped by SIGQUIT"]


DEL_JOB = """
import signal, sys, time
from mgg import cli

signal.signal(signal.SIGTERM, cli._stop)
sys.unraisablehook = cli._interrupt_hook("train")

class Dropped:
    def __del__(self):  # the signal's Stopped is raised here, where Python drops it
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):
            pass

try:
    Dropped()
    end = time.time() + 20
    while time.time() < end:
        time.sleep(0.01)
    print("still running")
except cli.Stopped as e:
    print("stopped", e.signum)
"""


def test_an_ending_signal_that_lands_in_a_del_still_ends_mgg(tmp_path):
    """Python drops an exception raised in a __del__ (reporting it only): a signal's
    Stopped landing there is sent again, to end the command where it can unwind (it left
    a bare mgg train running in one CI run)."""
    script = tmp_path / "job.py"
    script.write_text(DEL_JOB)
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["stopped", str(int(signal.SIGTERM))], r.stderr[-2000:]
    assert "Stopped" not in r.stderr  # not reported as an exception ignored


@needs_linux
def test_any_ending_signal_to_mggrun_of_ranks_that_are_not_mgg_is_one_line(tmp_path):
    """Every signal that would end mggrun (launch.ENDING) ends the job: with ranks that
    do not run mgg, the line is mggrun's, and the code 128 + the signal."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(MPI4PY_JOB))
    job = Job(2, "python", script, tmp_path / "never")
    job.wait_for(lambda: len(job.ranks) == 2 and any(job.seen.values()))
    job.proc.send_signal(signal.SIGUSR2)
    _, err = job.finish(timeout=60)
    assert _ended(job) == []
    assert job.proc.returncode == 128 + signal.SIGUSR2, err[-2000:]
    assert err.strip().splitlines()[-1] == "mggrun: stopped by SIGUSR2", err[-2000:]
    assert _left_over(job) == []


def test_a_file_size_limit_mpi_cannot_start_under_is_refused_in_one_line(tmp_path):
    """`ulimit -f 1000`: every rank died in MPI_Init with MPICH's stack; now mggrun and
    mgg refuse before MPI starts, naming the limit, the size needed and `ulimit -f`."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000 << 10, resource.RLIM_INFINITY))

    env = dict(os.environ, MGG_PROGRESS="0")
    train = ["mgg", "train", "--dataset", "planted:nodes=100,classes=2", "--epochs", "1"]
    for argv, who in (
        ([sys.executable, str(ROOT / "launch" / "mggrun"), "-np", "2", *train], "mggrun: "),
        ([sys.executable, "-m", *train], "mgg train: error: "),
    ):
        r = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
            preexec_fn=limited,
        )  # fmt: skip
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.strip().splitlines() == [
            f"{who}the file-size limit (ulimit -f) is 1000 KiB, and MPI's start-up writes "
            "files of about 4.1 MiB (every rank would die in MPI_Init): it needs 8192 KiB; "
            "raise it (ulimit -f 8192, or ulimit -f unlimited)"
        ], r.stderr[-2000:]
    # a write past the limit during a run: the file and the limit named (no SIGXFSZ death)
    r = subprocess.run(
        [sys.executable, "-m", "mgg", "convert", "planted:nodes=20000,classes=2", "big.npz"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
        preexec_fn=limited,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "mgg convert: error: big.npz: cannot write it: File too large (the file-size limit, "
        "ulimit -f, is 1000 KiB)"
    ]
    assert os.listdir(tmp_path) == []


def test_the_registry_sweeps_dead_writers_temporaries_only(tmp_path, monkeypatch):
    """mgg.atomic.temp_path records each temporary in mggrun's registry; at the job's end
    sweep_registered removes those a dead process of this host left, and nothing else."""
    from mgg import atomic

    registry = tmp_path / "registry"
    registry.mkdir()
    monkeypatch.setenv(atomic.REGISTRY, str(registry))
    mine = atomic.temp_path(tmp_path / "out")  # a live writer's (this process)
    mine.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "from mgg.atomic import temp_path; print(temp_path('f.npy'))"],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    ).stdout.strip()  # fmt: skip
    (tmp_path / dead).write_bytes(b"half")
    kept = tmp_path / "plain.npy"  # listed, but no temporary's name: never touched
    kept.write_bytes(b"x")
    with open(registry / "1", "a") as f:
        f.write(f"{kept}\n{tmp_path / 'gone.npy'}\n")
    assert atomic.sweep_registered(registry) == [tmp_path / dead]
    assert mine.exists() and kept.exists() and not registry.exists()


@needs_linux
def test_a_rank_killed_mid_write_leaves_no_temporary(tmp_path):
    """A SIGKILL of the rank writing `mgg predict --out`'s folder (held there by the
    test-only stall) left its temporary folder until the next writer swept it; mggrun now
    removes it when the job ends."""
    from mgg.cli import main

    data = "planted:nodes=2000,classes=4"
    model = tmp_path / "m"
    assert main(["train", "--dataset", data, "--epochs", "1", "--save", str(model)]) == 0
    out = tmp_path / "out" / "p"
    job = Job(2, "mgg", "predict", "--model", model, "--dataset", data, "--out", out,
              env={"MGG_TEST_STALL_OUTPUT": "p"})  # fmt: skip

    def temporary():
        return [p for p in out.parent.glob(".tmp-*") if (p / "pred.npy").exists()]

    job.wait_for(lambda: len(job.ranks) == 2 and temporary())
    writer = int(temporary()[0].name.split("-")[2])
    assert writer in job.ranks.values()
    os.kill(writer, signal.SIGKILL)
    job.finish(timeout=60)
    assert _ended(job) == []
    assert job.proc.returncode != 0
    assert list(out.parent.iterdir()) == []
