"""mggrun: mpiexec with one rank per device and per-rank environment.

    mggrun -np P [mpiexec options] COMMAND [ARGS...]

Options are those of mpiexec (hostfiles with -f/--hostfile, -ppn, ...), so mggrun works
wherever mpirun does, inside a Slurm allocation included. Each rank starts through a shim
that sets, from the launcher's variables:
    MGG_RANK, MGG_SIZE, MGG_LOCAL_RANK, MGG_LOCAL_SIZE
    MGG_LAUNCHER=mggrun               (``mgg`` leaves reporting a Ctrl-C to mggrun)
    MGG_DEVICE                        local rank modulo the GPUs visible on the node
    NUMBA_NUM_THREADS, OMP_NUM_THREADS   cores / local ranks (at least 1)
    MGG_NP                            the -n/-np asked for, which mgg.comm checks
                                      against the world MPI reports (a mismatch means
                                      mpi4py is bound to another MPI than this mpiexec)
A leading ``mgg`` or ``python`` in COMMAND runs under this interpreter.
MGG_MPIEXEC overrides the mpiexec used (default: the one installed beside this Python).

Failures: mggrun runs mpiexec from a child in its own session, which outlives mggrun (a
SIGKILL of mggrun reaches it as a SIGTERM), and exits with mpiexec's code. Ctrl-C (SIGINT)
goes to the local ranks as SIGINT (to the processes each rank started); so does a SIGTERM
or SIGHUP when every rank runs mgg, told from what the ranks run however COMMAND spells it
(``mgg``, a path to it, ``python -m mgg``, a wrapper script): then only mgg's processes
get it, they exit without a traceback, and mggrun prints the one line ``mgg CMD:
interrupted`` (``terminated``, ``hung up``). Every other signal that would end mggrun
(SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU, SIGXFSZ, ...: ``ENDING``) ends the job as
SIGTERM does, the line ``mgg CMD: stopped by SIGUSR1``; with ranks that do not run mgg
the line is mggrun's (``mggrun: terminated``). A job a signal stopped exits 128 + its
number (130, 143, 129, 138, ...). A second signal, one when no local rank is found, or a
first signal but SIGINT to ranks that do not run mgg goes to mpiexec as SIGTERM, and so
does the first if the job still runs 10 s later.

Temporaries: every temporary a process of the job names beside an output
(mgg.atomic.temp_path) is recorded in a folder of mggrun's (``MGG_TEMPORARIES``, under
the temp dir); at the job's end mggrun removes those still there whose writer is dead
(a rank's SIGKILL leaves a half-written file or folder; this node's only).

Limits: under a file-size limit (``ulimit -f``) below 8 MiB mggrun refuses to start, in
one line naming the limit: MPI_Init writes files of about 4.1 MiB, and every rank would
die there with MPICH's stack.

Leftovers: before and after each job mggrun removes the MPICH shared-memory files
(/dev/shm/mpich_*) of this user that no live process maps or holds open: what a killed or
aborted job leaves, since MPICH unlinks them only in MPI_Finalize. Hydra's proxy would
write the node's hwloc topology to /tmp/hydra_hwloc_xmlfile_* (a fixed path: TMPDIR is not
honoured) and unlink it only when it exits normally, which it does not when mpiexec kills
it (a rank's abort, a killed rank); it writes none when HWLOC_XMLFILE is set, so mggrun
sets that (unless the user has) to a path that cannot exist: each rank's hwloc then
discovers the node itself, and the shim removes the variable before COMMAND starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .atomic import REGISTRY, sweep_registered
from .process import file_size_refusal, launcher_int, local_size

SHIM = "--mgg-rank-shim"
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
SHM_DIR = Path("/dev/shm")
SHM_PREFIXES = ("mpich_shm_", "mpich_vci_", "mpich_shar_tmp")
STALE_AFTER_S = 2.0  # a file this young may be a starting job's, not yet mapped
STOPPED = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}
# every signal that ends a process by default and that a user, a scheduler (Slurm's
# --signal, a batch system's warning) or the kernel may send mggrun: each ends the job as
# SIGTERM does, with one line naming it and exit 128 + its number (SIGPIPE excepted:
# Python ignores it, a write to a closed pipe fails)
ENDING = tuple(
    getattr(signal, name)
    for name in (
        "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
        "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGPWR", "SIGSTKFLT", "SIGIO",
    )
    if hasattr(signal, name)
)  # fmt: skip


def stopped(signum: int) -> str:
    """The word for a job a signal ended: 'terminated', ..., else 'stopped by SIGUSR1'."""
    return STOPPED.get(signum) or f"stopped by {signal.Signals(signum).name}"


ESCALATE_AFTER_S = 10.0  # after a forwarded SIGINT, SIGTERM the job if it still runs
NO_XMLFILE = "/dev/null/mggrun-no-topology-file"  # HWLOC_XMLFILE: hydra writes no /tmp file
MGG_MODULES = ("mgg", "mgg.__main__", "mgg.cli")


def find_mpiexec() -> str:
    if os.environ.get("MGG_MPIEXEC"):
        return os.environ["MGG_MPIEXEC"]
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise SystemExit(
            "mggrun: no mpiexec found; install mgg (it brings the mpich wheel) or set MGG_MPIEXEC"
        )
    return found


def rank_environment(env=None, cpus=None, gpus=None) -> dict:
    """The variables the shim adds for this rank (explicit thread settings are kept)."""
    env = os.environ if env is None else env
    rank = launcher_int(env, _RANK_VARS, 0)
    local = launcher_int(env, _LOCAL_RANK_VARS, 0)
    nlocal = local_size(env)
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    threads = str(max(1, cpus // nlocal))
    out = {
        "MGG_RANK": str(rank),
        "MGG_SIZE": str(launcher_int(env, _SIZE_VARS, 1)),
        "MGG_LOCAL_RANK": str(local),
        "MGG_LOCAL_SIZE": str(nlocal),
        "MGG_LAUNCHER": "mggrun",
    }
    gpus = _count_gpus(env) if gpus is None else gpus
    if gpus:
        out["MGG_DEVICE"] = str(local % gpus)
    for var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        out[var] = env.get(var, threads)
    return out


def _count_gpus(env) -> int:
    vis = env.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip()])
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def _command(cmd: list[str]) -> list[str]:
    if cmd and cmd[0] == "mgg":
        return [sys.executable, "-m", "mgg", *cmd[1:]]
    if cmd and cmd[0] in ("python", "python3"):
        return [sys.executable, *cmd[1:]]
    return cmd


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(mpiexec options, command): the command starts at the first word that is neither
    an option nor an option's value."""
    takes_value = {
        "-n",
        "-np",
        "-f",
        "-hostfile",
        "--hostfile",
        "-machinefile",
        "-hosts",
        "--hosts",
        "-host",
        "-ppn",
        "-genv",
        "-env",
        "-wdir",
        "-configfile",
        "-bind-to",
        "-map-by",
        "-launcher",
        "-bootstrap",
        "-iface",
        "-errfile-pattern",
        "-outfile-pattern",
        "-prepend-pattern",
        "-genvlist",
        "-envlist",
        "-rmk",
    }
    two_values = {"-genv", "-env"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], argv[i + 1 :]
        if not a.startswith("-"):
            break
        i += 3 if a in two_values else 2 if a in takes_value and "=" not in a else 1
    return argv[:i], argv[i:]


def requested_size(opts: list[str]) -> int | None:
    """The world size asked for with -n/-np (None when the launcher decides it)."""
    for i, a in enumerate(opts):
        name, eq, value = a.partition("=")
        if name in ("-n", "-np"):
            value = value if eq else (opts[i + 1] if i + 1 < len(opts) else "")
            try:
                n = int(value)
            except ValueError:
                raise SystemExit(f"mggrun: {name} takes a number of ranks, got {value!r}") from None
            if n < 1:
                raise SystemExit(f"mggrun: {name} takes a positive number of ranks, got {n}")
            return n
    return None


def check_command(cmd: list[str], opts: list[str]) -> None:
    """Refuse, before launching, a command that no rank could start."""
    exe = _command(cmd)[0]
    wdir = next((opts[i + 1] for i, a in enumerate(opts[:-1]) if a == "-wdir"), None)
    if wdir and os.sep in exe and not os.path.isabs(exe):
        exe = os.path.join(wdir, exe)
    if shutil.which(exe) is None:
        raise SystemExit(f"mggrun: {cmd[0]}: command not found (nor an executable file)")


def _held_shm() -> set[str]:
    """The /dev/shm paths that some live process of this machine maps or holds open."""
    held = set()
    prefix = f"{SHM_DIR}/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith(prefix):
                        held.add(target)
            with open(f"/proc/{pid}/maps") as f:
                held.update(line[line.index(prefix) :].rstrip("\n") for line in f if prefix in line)
    return held


def reap_shm(min_age: float = STALE_AFTER_S, wait: bool = False) -> list[str]:
    """Unlink the MPICH shared-memory files of this user that no live process maps or
    holds open and that are ``min_age`` seconds old; return their paths. ``wait``: let a
    younger such file come of age (at most ``min_age`` seconds) rather than skip it."""
    if not SHM_DIR.is_dir() or not Path("/proc/self/maps").exists():
        return []
    uid = os.getuid()
    cands = {}
    for e in os.scandir(SHM_DIR):
        if e.name.startswith(SHM_PREFIXES):
            with contextlib.suppress(OSError):
                st = e.stat(follow_symlinks=False)
                if st.st_uid == uid and e.is_file(follow_symlinks=False):
                    cands[e.path] = max(st.st_mtime, st.st_ctime)
    removed = []
    while cands:
        held = _held_shm()
        now = time.time()
        young = {}
        for path, t in cands.items():
            if path in held:
                continue
            if now - t < min_age:
                young[path] = t
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
        if not (wait and young):
            break
        time.sleep(max(0.0, min_age - (now - max(young.values()))) + 0.05)
        cands, wait = young, False
    return removed


def _local_ranks(mpiexec: int) -> dict[int, list[int]] | None:
    """{rank pid: the pids of its process tree, itself first} of the ranks mpiexec
    started, when all run on this node under hydra's proxies (None otherwise: ranks on
    other nodes, another launcher, not started yet)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                name, rest = stat[stat.index("(") + 1 :].rsplit(")", 1)
                children.setdefault(int(rest.split()[1]), []).append((int(pid), name))
    proxies = children.get(mpiexec, [])
    if not proxies or any(name != "hydra_pmi_proxy" for _, name in proxies):
        return None
    trees = {}
    for proxy, _ in proxies:
        for rank, _ in children.get(proxy, []):
            tree, todo = [rank], [rank]
            while todo:
                kids = [pid for pid, _ in children.get(todo.pop(), [])]
                tree += kids
                todo += kids
            trees[rank] = tree
    return trees or None


def mgg_subcommand(argv: list[str]) -> str | None:
    """The subcommand when the command line ``argv`` runs mgg's (``mgg SUB``, a path to
    it, ``python [OPTIONS] -m mgg SUB``, and these behind mggrun's shim), else None."""
    if SHIM in argv:
        argv = _command(argv[argv.index(SHIM) + 1 :])
    rest = argv[1:] if argv and os.path.basename(argv[0]).startswith("python") else argv
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        rest = rest[2:] if rest[0] in ("-X", "-W") else rest[1:]
    if rest[:1] == ["-m"]:
        is_mgg, rest = len(rest) > 1 and rest[1] in MGG_MODULES, rest[2:]
    else:
        is_mgg, rest = bool(rest) and os.path.basename(rest[0]) == "mgg", rest[1:]
    return rest[0] if is_mgg and rest and not rest[0].startswith("-") else None


def _mgg_processes(trees: dict[int, list[int]]) -> tuple[str | None, list[int]]:
    """("mgg SUB", the pids that run it) when every rank's tree runs mgg, else (None, [])."""
    label, pids = None, []
    for tree in trees.values():
        found = []
        for pid in tree:
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                sub = mgg_subcommand(argv.split("\0")[:-1])
                if sub:
                    label = label or f"mgg {sub}"
                    found.append(pid)
        if not found:
            return None, []
        pids += found
    return label, pids


def _die_with_parent() -> None:
    """Get SIGTERM when the parent process dies, even by SIGKILL (kept across exec)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_job(full: list[str], env=None) -> int:
    """Run mpiexec as a child in its own session (so a terminal's Ctrl-C reaches only
    mggrun), forward signals, and remove the shared memory the job left; its exit code."""
    reap_shm()
    registry = tempfile.mkdtemp(prefix=f"mggrun-{os.getpid()}-temporaries-")
    env = {**(os.environ if env is None else env), REGISTRY: registry}
    try:
        proc = subprocess.Popen(full, start_new_session=True, preexec_fn=_die_with_parent, env=env)
    except BaseException:
        shutil.rmtree(registry, ignore_errors=True)
        raise
    state = {"stopped_by": None, "since": None, "label": None}

    def forward(signum, frame):
        state["since"] = state["since"] or time.monotonic()
        sig = signal.SIGTERM
        if not state["stopped_by"]:
            state["stopped_by"] = signum
            trees = _local_ranks(proc.pid)
            label, pids = _mgg_processes(trees) if trees else (None, [])
            if label or (trees and signum == signal.SIGINT):  # mgg exits quietly on SIGINT
                state["label"] = label
                for pid in pids or [pid for tree in trees.values() for pid in tree]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGINT)
                return
            if signum == signal.SIGINT:
                sig = signal.SIGINT
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    previous = {s: signal.signal(s, forward) for s in ENDING}
    try:
        escalated = False
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                late = state["since"] and time.monotonic() - state["since"] > ESCALATE_AFTER_S
                if late and not escalated:
                    escalated = True
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    reap_shm(wait=True)
    sweep_registered(registry)  # the temporaries of killed writers (a rank's SIGKILL)
    signum = state["stopped_by"]
    if signum and code != 0:
        print(f"{state['label'] or 'mggrun'}: {stopped(signum)}", file=sys.stderr)
        return 128 + signum  # mpiexec reports whichever rank ended first: some die by SIGKILL
    return code if code >= 0 else 128 - code


def supervise(full: list[str], env=None) -> int:
    """``run_job`` in a child of mggrun, in its own session, that outlives mggrun: mggrun
    forwards the signals that would end it (``ENDING``) to it and exits with its code, and
    a SIGKILL of mggrun reaches it as a SIGTERM, so the job still ends as after one and
    leaves nothing."""
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # until run_job forwards it
            os.setsid()
            _die_with_parent()
            if os.getppid() == parent:  # else mggrun died before it could tell
                code = run_job(full, env)
        except BaseException:  # noqa: BLE001 - a bug: show it, and never return to main
            traceback.print_exc()
        finally:
            with contextlib.suppress(OSError):
                sys.stderr.flush()
            os._exit(code)

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    previous = {s: signal.signal(s, forward) for s in ENDING}
    try:
        _, status = os.waitpid(child, 0)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def main(argv=None) -> int:
    """mggrun; a usage error prints one line and returns 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == SHIM:
        cmd = _command(argv[1:])
        os.environ.update(rank_environment())
        if os.environ.get("HWLOC_XMLFILE") == NO_XMLFILE:
            del os.environ["HWLOC_XMLFILE"]
        try:
            os.execvp(cmd[0], cmd)
        except OSError as e:
            print(f"mggrun: {argv[1]}: {e.strerror or e}", file=sys.stderr)
            return 127
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        opts, cmd = _split(argv)
        if not cmd:
            raise SystemExit("mggrun: no command given (usage: mggrun -np P COMMAND [ARGS...])")
        np_asked = requested_size(opts)
        check_command(cmd, opts)
        full = [find_mpiexec(), *opts, sys.executable, "-m", "mgg.launch", SHIM, *cmd]
    except SystemExit as e:
        if not isinstance(e.code, str):
            raise
        print(e.code, file=sys.stderr)
        return 2
    refusal = file_size_refusal()
    if refusal:  # before mpiexec, whose ranks would die in MPI_Init with MPICH's stack
        print(f"mggrun: {refusal}", file=sys.stderr)
        return 2
    env = dict(os.environ, HWLOC_XMLFILE=os.environ.get("HWLOC_XMLFILE", NO_XMLFILE))
    if np_asked is not None:
        env["MGG_NP"] = str(np_asked)
    else:
        env.pop("MGG_NP", None)
    return supervise(full, env)


if __name__ == "__main__":
    sys.exit(main())
