"""mggrun: mpiexec with one rank per device and per-rank environment.

    mggrun -np P [mpiexec options] COMMAND [ARGS...]

Options are those of mpiexec (hostfiles with -f/--hostfile, -ppn, ...), so mggrun works
wherever mpirun does, inside a Slurm allocation included. Each rank starts through a shim
that sets, from the launcher's variables:
    MGG_RANK, MGG_SIZE, MGG_LOCAL_RANK, MGG_LOCAL_SIZE
    MGG_DEVICE                        local rank modulo the GPUs visible on the node
    NUMBA_NUM_THREADS, OMP_NUM_THREADS   cores / local ranks (at least 1)
    MGG_NP                            the -n/-np asked for, which mgg.comm checks
                                      against the world MPI reports (a mismatch means
                                      mpi4py is bound to another MPI than this mpiexec)
A leading ``mgg`` or ``python`` in COMMAND runs under this interpreter.
MGG_MPIEXEC overrides the mpiexec used (default: the one installed beside this Python).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SHIM = "--mgg-rank-shim"
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


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


def _first(env, names, default):
    for n in names:
        if env.get(n, "").strip():
            return int(env[n].split("(")[0].split(",")[0])
    return default


def rank_environment(env=None, cpus=None, gpus=None) -> dict:
    """The variables the shim adds for this rank (explicit thread settings are kept)."""
    env = os.environ if env is None else env
    rank = _first(env, _RANK_VARS, 0)
    local = _first(env, _LOCAL_RANK_VARS, 0)
    local_size = max(1, _first(env, _LOCAL_SIZE_VARS, 1))
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    threads = str(max(1, cpus // local_size))
    out = {
        "MGG_RANK": str(rank),
        "MGG_SIZE": str(_first(env, _SIZE_VARS, 1)),
        "MGG_LOCAL_RANK": str(local),
        "MGG_LOCAL_SIZE": str(local_size),
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
                return int(value)
            except ValueError:
                raise SystemExit(f"mggrun: {name} takes a number of ranks, got {value!r}") from None
    return None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == SHIM:
        cmd = _command(argv[1:])
        os.environ.update(rank_environment())
        os.execvp(cmd[0], cmd)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    opts, cmd = _split(argv)
    if not cmd:
        raise SystemExit("mggrun: no command given (usage: mggrun -np P COMMAND [ARGS...])")
    np_asked = requested_size(opts)
    if np_asked is not None:
        os.environ["MGG_NP"] = str(np_asked)
    else:
        os.environ.pop("MGG_NP", None)
    full = [find_mpiexec(), *opts, sys.executable, "-m", "mgg.launch", SHIM, *cmd]
    os.execv(full[0], full)
    return 0


if __name__ == "__main__":
    sys.exit(main())
