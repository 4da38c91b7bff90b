"""Running one command of a GPU stage or window: its own process group, killed whole at
its limit or when this process is ended, its output teed to a log, its outcome a record."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # the copy on the GPU machine is not installed

from common import write_atomic  # noqa: E402

# what every step runs with: output as printed, no progress bars, each test's outcome
# as it ends (tests/conftest.py)
STEP_ENV = {"PYTHONUNBUFFERED": "1", "MGG_PROGRESS": "0", "MGG_TEST_REPORT": "1"}


@dataclass
class Step:
    """One command of a stage. ``expect(result)`` gets the last JSON line the command
    printed (None if none), ``output(text)`` all it printed; each returns why a run that
    exited 0 still failed, or None."""

    name: str
    argv: list[str]
    timeout: float
    expect: object = None
    output: object = None


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Ended(BaseException):
    """This process was told to end (SIGTERM, SIGHUP, SIGINT: a device command's
    ``timeout``): the step in flight goes down with it."""


def end_steps_on_signals() -> None:
    """Make the signals that end this process raise Ended, so that a running step's
    process group is killed before it exits (the group is a session of its own, which a
    signal to this process does not reach: left alone it would run on into the next
    device command, on the same GPU and into the same $OUT)."""

    def ended(signum, frame):
        raise Ended(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, ended)


RUNNING: set = set()  # the steps' processes in flight (several in a parallel dry run)


def kill_running() -> None:
    """Kill every step in flight, whole process groups (what ends the threads that wait
    for them: a signal reaches only the main thread)."""
    for proc in list(RUNNING):
        _kill_group(proc)


def run_step(step: Step, limit: float, env: dict, log, echo: bool = True) -> dict:
    """Run one step with output teed to log (and stdout, with ``echo``); killed (whole
    process group) at its limit, or when this process is ended (end_steps_on_signals)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        step.argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
        errors="replace",
    )
    RUNNING.add(proc)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            if echo:
                sys.stdout.write(line)
        sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        rc = proc.wait(limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        rc = proc.returncode
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        RUNNING.discard(proc)
    reader.join(10)
    result = None
    if step.expect is not None:
        tail = [ln for ln in "".join(lines).splitlines() if ln.startswith("{")]
        try:
            result = json.loads(tail[-1]) if tail else None
        except ValueError:
            result = None
    why = None
    if timed_out:
        why = f"killed at its limit of {limit:.0f} s"
    elif rc != 0:
        why = f"exit status {rc}"
    elif step.expect is not None:
        why = step.expect(result)
    if why is None and step.output is not None:
        why = step.output("".join(lines))
    return {
        "step": step.name,
        "command": shlex.join(step.argv),
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - t0, 1),
        "limit": round(limit),
        "ok": why is None,
        "why": why,
        **({"result": result} if result is not None else {}),
    }


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1, default=str) + "\n")


def git_commit() -> str | None:
    try:
        r = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return r.stdout.strip() or None
    except OSError:
        return None
