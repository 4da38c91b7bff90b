"""`mgg` command line: `mgg info | partition | plan | check | tune | train | predict | embed |
demo | convert`.

Thin: parse, resolve the backend, comm and dataset, call the library, print. One module
per command (its flags: ``add``, its run: ``main``), what they share in ``common``. Every
subcommand that reports results takes ``--json`` and then prints its result as one JSON
object on the last line of stdout. Errors print one line and exit 2; in a multi-rank job
a failing rank takes the whole job down.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import threading
import time

from . import check, convert, demo, embed, info, partition, plan, predict, train, tune
from .common import INPUTS

COMMANDS = (info, partition, plan, check, tune, train, predict, embed, demo, convert)
GPU_PACKAGES = ("cupy", "cupyx", "nvshmem", "cuda")


class Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line as mgg's others (no usage block above)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="mgg", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command")
    for command in COMMANDS:
        s = command.add(sub)
        s.set_defaults(func=command.main)
    return p


# the commands that bring MPI up (backend.comm), which cannot start under a small
# file-size limit
MPI_COMMANDS = ("partition", "check", "tune", "train", "predict", "embed", "demo")


def main(argv=None) -> int:
    import signal

    from ..process import file_size_refusal

    p = parser()
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    from ..process import ENV_ERRORS

    if ENV_ERRORS:  # NUMBA_NUM_THREADS=0, ...: set aside at import, refused here
        print(f"mgg {args.command}: error: {ENV_ERRORS[0]}", file=sys.stderr)
        return 2
    refusal = args.command in MPI_COMMANDS and file_size_refusal()
    if refusal:  # before MPI_Init, which would die with MPICH's stack
        if int(os.environ.get("PMI_RANK") or 0) == 0:  # one line from a plain mpiexec
            print(f"mgg {args.command}: error: {refusal}", file=sys.stderr)
        return 2
    with contextlib.suppress(ValueError, AttributeError):  # not the main thread; no SIGXFSZ
        # a write past the file-size limit fails (EFBIG, named below), not kills the rank
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _on_ending_signals()
    return run(args)


class Stopped(BaseException):
    """A signal that would end mgg (SIGTERM, SIGQUIT, SIGUSR1, ...), raised in the main
    thread so that its writers' temporaries are removed on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


def _on_ending_signals() -> None:
    """Outside mggrun (which names them itself), each signal that would end mgg ends it
    with one line naming it and exit 128 + its number, as Ctrl-C does."""
    import signal

    from ..launch import ENDING

    if os.environ.get("MGG_LAUNCHER") == "mggrun":
        return
    for sig in ENDING:
        if sig not in (signal.SIGINT, signal.SIGXFSZ):  # KeyboardInterrupt; ignored above
            with contextlib.suppress(ValueError, OSError):  # not the main thread
                if signal.getsignal(sig) is signal.SIG_DFL:
                    signal.signal(sig, _stop)


# ---- the abort policy ----------------------------------------------------------------------
def run(args) -> int:
    """Run ``args.func(args)``: errors print one line and exit 2, from one rank (rank 0's
    abort ends the job); Ctrl-C exits 130 without a traceback."""
    from ..comm import abort_job, finalize, job_rank
    from ..errors import GraphError, MggError, one_line

    if getattr(args, "json", False):
        os.environ["MGG_PROGRESS"] = "0"  # --json: no progress bars, whatever stderr is
    previous_hook, sys.unraisablehook = sys.unraisablehook, _interrupt_hook(args.command)
    try:
        code = args.func(args) or 0
        finalize()  # NVSHMEM, where the command used it
        return code
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except Stopped as e:
        return _interrupted(args.command, signum=e.signum)
    except (MggError, ValueError, OSError, RuntimeError, MemoryError) as e:
        msg = one_line(e)
        if isinstance(e, OSError) and e.errno == errno.EFBIG:
            from ..process import file_size_limit

            msg += f" (the file-size limit, ulimit -f, is {file_size_limit()})"
        if isinstance(e, GraphError) and INPUTS and INPUTS[-1] not in msg:
            msg = f"{INPUTS[-1]}: {msg}"  # found past the reader: name the input anyway
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in GPU_PACKAGES:
            raise
        msg = (
            f"{e}: the cuda backend needs the gpu extra "
            "(pip install 'mgg[gpu]', or 'mgg[gpu-cu12]' with CUDA 12 drivers)"
        )
    finally:
        sys.unraisablehook = previous_hook
    if job_rank() > 0:  # every rank usually hits the same error: let rank 0's abort end
        from ..comm.mpi import ABORT_GRACE_SECONDS  # this one before it repeats it

        time.sleep(ABORT_GRACE_SECONDS + 0.5)
    print(f"mgg {args.command}: error: {msg}", file=sys.stderr)
    sys.stderr.flush()
    abort_job(2)
    return 2


def _interrupt_hook(command: str):
    """An unraisable-exception hook: Python only reports a Ctrl-C (or an ending signal's
    Stopped) that lands in a __del__ (numba's compiler has many), so act on it here."""
    default = sys.unraisablehook

    def hook(u):
        if issubclass(u.exc_type, KeyboardInterrupt):
            _interrupted(command, exit_now=True)
        if issubclass(u.exc_type, Stopped):  # dropped with the __del__ it landed in: sent
            # again once this hook returned, it lands in the main flow (or here again)
            resend = threading.Timer(0.05, os.kill, (os.getpid(), u.exc_value.signum))
            resend.daemon = True
            resend.start()
            return
        default(u)

    return hook


def _interrupted(command: str, exit_now: bool = False, signum: int = 2) -> int:
    """Ctrl-C (or ``signum``): no traceback, exit code 128 + the signal, and one line, from
    rank 0 (under mggrun from mggrun, which alone is sure to outlive every rank). In a
    multi-rank job the rank aborts the job, skipping MPI_Finalize (which could wait on a
    peer still inside a collective); an abort, unlike a bare exit, ends the others without
    mpiexec's failure banner."""
    import signal

    from ..launch import stopped

    signal.signal(signum, signal.SIG_IGN)
    env, code = os.environ, 128 + signum
    if env.get("MGG_LAUNCHER") != "mggrun" and int(env.get("PMI_RANK") or 0) == 0:
        print(f"mgg {command}: {stopped(signum)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if exit_now or int(env.get("MGG_SIZE") or env.get("PMI_SIZE") or 1) > 1:
        from ..comm import abort_job

        abort_job(code)
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
