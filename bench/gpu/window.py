"""One device window, one command: the GPU plan's steps, in order, until a deadline.

On the GPU machine (device run: carry [".whl"], timeout_s 600; `--command` prints it):
    python3 bench/gpu/stage.py window --out $OUT --deadline 560
On the developer's machine:
    python3 bench/gpu/stage.py window --plan          what the next window runs, and why
    python3 bench/gpu/stage.py window --dry-run --backend cpu --out DIR   every step, toy size
    python3 bench/gpu/stage.py collect FILES_AT       results home: bench/results/gpu/window/

The plan (bench/gpu/plan.py) is the GPU issue's device plan in its order. A step is
done when bench/results/gpu/window/STEP/step.json says it ran to its end at the current
code: the fingerprint of what it depends on (mgg/ and its own scripts and tests) is
today's. A window runs the steps not done, in order, each only if the seconds it is
expected to take (its last run's, else its estimate) fit in what is left before the
deadline, and each with what is left as its limit; one that does not fit is passed
over for a later, shorter one. $OUT holds at most MAX_FILES files, rewritten as each
step ends: window.json (every step's record), window.log (all output) and
steps*.tar.gz (each ended step's folder: step.json, step.log and the files its
benchmark wrote, partial ones too), so whatever the deadline cuts still comes back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from runner import ROOT, STEP_ENV, Ended, Step, git_commit, kill_running, run_step, write_json

HOME = ROOT / "bench" / "results" / "gpu" / "window"
MAX_FILES = 8  # what a device command brings back
MAX_BYTES = 15 * 2**20  # one returned file's limit is 16 MiB
LOG_BYTES = 8 * 2**20  # window.log stops growing here (each step's own log is whole)
PACK_SECONDS = 10.0  # kept back from the last step's limit: packing, exiting
SETUP_SECONDS = 30.0  # the carried wheels installed and checked, before a step needs them
SLACK = 1.15  # a step's last run times this is what it is expected to take again
CUT = "cut: the command ended during this step"
CODE_SUFFIXES = (".py", ".cu", ".cuh")


def fingerprint(files, root: Path | None = None) -> str:
    """sha256 (16 hex digits) of the code under mgg/ and of ``files`` (files or folders,
    relative to root): their paths and bytes. The GPU machine has the same files and no
    usable git, so the code is hashed, not a commit named."""
    root, paths = root or ROOT, set()
    for rel in ("mgg", *files):
        p = root / rel
        if p.is_dir():
            paths |= {
                q
                for q in p.rglob("*")
                if q.is_file() and q.suffix in CODE_SUFFIXES and "__pycache__" not in q.parts
            }
        elif p.is_file():
            paths.add(p)
        else:
            raise FileNotFoundError(f"{rel}: no such file or folder (a plan step depends on it)")
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def last_record(name: str, home: Path = HOME) -> dict | None:
    path = home / name / "step.json"
    return json.loads(path.read_text()) if path.exists() else None


def status(item, home: Path = HOME) -> tuple[bool, float, str]:
    """(done, seconds expected, why) of a plan step against its committed record."""
    rec = last_record(item.name, home)
    if rec is None:
        return False, item.estimate, "never ran"
    took = rec.get("seconds") if rec.get("completed") else None
    expected = max(took * SLACK, 1.0) if took else item.estimate
    if rec.get("fingerprint") != fingerprint(item.files):
        return False, expected, f"code changed since {rec.get('commit')}"
    if not rec.get("completed"):
        return False, expected, f"cut in {rec.get('commit')}: {rec.get('why')}"
    return True, expected, f"{'ok' if rec.get('ok') else 'FAILED'} at {rec.get('commit')}"


class Log:
    """window.log, capped at LOG_BYTES (each step's own log is whole); steps write
    through their Tee, from several threads in a parallel dry run."""

    def __init__(self, path: Path):
        self.file, self.size, self.lock = open(path, "a", buffering=1), 0, threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            if self.size < LOG_BYTES:
                self.file.write(text)
                self.size += len(text)
                if self.size >= LOG_BYTES:
                    self.file.write("\n[window.log stops here: each step's own log is whole]\n")


class Tee:
    """A step's output: its step.log whole, and window.log and stdout, each line
    prefixed with the step's name where steps run side by side."""

    def __init__(self, log: Log, own, prefix: str = ""):
        self.log, self.own, self.prefix = log, own, prefix

    def write(self, text: str) -> None:
        self.own.write(text)
        shown = self.prefix + text if self.prefix else text
        self.log.write(shown)
        sys.stdout.write(shown)

    def flush(self) -> None:
        sys.stdout.flush()


class Packer:
    """Each ended step's folder into $OUT/steps*.tar.gz, a step whole in one volume, a
    volume no larger than MAX_BYTES unless one step alone is; written atomically."""

    def __init__(self, out: Path, work: Path, volumes: int):
        self.out, self.work, self.volumes, self.packs = out, work, volumes, [[]]

    def add(self, name: str) -> None:
        self.packs[-1].append(name)
        path = self._write(len(self.packs) - 1)
        full = len(self.packs) == self.volumes
        if path.stat().st_size > MAX_BYTES and len(self.packs[-1]) > 1 and not full:
            self.packs[-1].pop()
            self._write(len(self.packs) - 1)
            self.packs.append([name])
            self._write(len(self.packs) - 1)

    def _write(self, i: int) -> Path:
        path = self.out / ("steps.tar.gz" if i == 0 else f"steps-{i + 1}.tar.gz")
        tmp = path.with_name(path.name + ".tmp")
        with tarfile.open(tmp, "w:gz") as t:
            for name in self.packs[i]:
                t.add(self.work / name, arcname=name)
        os.replace(tmp, path)
        return path


def device_name() -> str | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def run_window(
    plan, out: Path, deadline: float, env_for, *, dry=False, redo=(), info=None, home=HOME,
    jobs=1, say=print,
):  # fmt: skip
    """Run the plan's steps that are not done (or are in ``redo``) inside ``deadline``
    seconds from now; a dry run runs every step, whatever its record, ``jobs`` at a time
    (a window: one at a time, on its one GPU). ``env_for(item)`` gives a step's
    environment (set up on first need) or raises; ``info`` (versions, ...) joins the
    summary. Returns the summary written to window.json."""
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mgg-window-"))
    packer, log, lock = Packer(out, work, MAX_FILES - 2), Log(out / "window.log"), threading.Lock()
    summary = {
        "window": "dry run" if dry else "GPU",
        "commit": os.environ.get("MGG_COMMIT") or git_commit() or "unknown",
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "deadline_s": deadline,
        "dry_run": dry,
        "device": device_name() or "no GPU",
        "steps": [],
    }
    recs, order = {}, {item.name: i for i, item in enumerate(plan)}
    stopping = threading.Event()

    def shown(rec):  # a step in flight is recorded as cut until it ends
        if "fingerprint" in rec and "rc" not in rec and "why" not in rec:
            return {**rec, "ok": False, "completed": False, "why": CUT}
        return rec

    def save():
        with lock:
            steps = sorted(recs.values(), key=lambda r: order[r["step"]])
            summary["steps"] = [shown(r) for r in steps]
            summary["seconds"] = round(time.monotonic() - t0, 1)
            summary["ok"] = all(r["ok"] for r in summary["steps"] if r.get("started"))
            summary.update(info or {})
            write_json(out / "window.json", summary)

    def left():
        return deadline - (time.monotonic() - t0) - PACK_SECONDS

    def launch(item, need):
        rec = recs[item.name] = {"step": item.name, "commit": summary["commit"],
                                 "device": summary["device"]}  # fmt: skip
        try:
            tee_prefix = f"[{item.name}] " if jobs > 1 else ""
            run_item(item, rec, work, need, left, env_for, log, save, tee_prefix)
        finally:  # a step cut by Ended is packed too, with what it wrote
            if stopping.is_set() and rec.get("started"):
                rec.update(ok=False, completed=False, why="cut: the command was ended")
                write_json(work / item.name / "step.json", rec)
            with lock:
                if rec.get("started"):
                    packer.add(item.name)
            save()

    todo = []
    for item in plan:
        done, expected, why = status(item, home)
        if done and not dry and item.name not in redo:
            say(f"== {item.name}: done ({why})")
            continue
        todo.append((item, 0.0 if dry else min(expected, item.timeout)))
    save()
    pool = ThreadPoolExecutor(jobs) if jobs > 1 else None
    try:
        if pool is None:
            for item, need in todo:
                if need > left() or left() < 5:
                    why = f"not started: expected {need:.0f} s, {left():.0f} s left"
                    recs[item.name] = {"step": item.name, "started": False, "ok": False,
                                       "why": why}  # fmt: skip
                    say(f"== {item.name}: {why}")
                    save()
                    continue
                launch(item, need)
        else:
            pending = {pool.submit(launch, item, need) for item, need in todo}
            while pending:  # in short waits: a signal is handled between them
                _, pending = wait(pending, timeout=0.5)
    except Ended as e:
        summary["ended_by"] = str(e)
        stopping.set()
        kill_running()
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        save()
        log.file.close()
        shutil.rmtree(work, ignore_errors=True)
    return summary


def run_item(item, rec: dict, work: Path, need, left, env_for, log: Log, save, prefix=""):
    """Run one plan step into work/NAME/ within ``left()`` seconds, once its environment
    is set up, filling its record ``rec`` (also written there as step.json)."""
    try:
        env = env_for(item)
    except Exception as e:  # SetupError and what setup's subprocesses raise
        rec.update(started=False, ok=False, why=f"setup failed: {e}")
        return
    if need > left():
        rec.update(started=False, ok=False, why=f"not started: {left():.0f} s left after setup")
        return
    folder = work / item.name
    folder.mkdir()
    argv, limit = item.argv, min(item.timeout, left())
    rec.update(
        about=item.about,
        started=True,
        fingerprint=fingerprint(item.files),
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    save()  # the step in flight: recorded as cut until it ends
    env = {**env, **STEP_ENV, "MGG_GPU_OUT": str(folder)}
    with open(folder / "step.log", "w", buffering=1) as own:
        tee = Tee(log, own, prefix)
        tee.write(f"== {item.name} (limit {limit:.0f} s): {shlex.join(argv)}\n")
        try:
            step = Step(item.name, argv, limit, item.expect, item.output)
            rec.update(run_step(step, limit, env, tee, echo=False))
        except Ended:
            rec.update(ok=False, completed=False, why="cut: the command was ended")
            write_json(folder / "step.json", rec)
            raise
        rec["completed"] = not rec["timed_out"]
        tee.write(f"== {item.name}: {'ok' if rec['ok'] else rec['why']} ({rec['seconds']} s)\n")
    write_json(folder / "step.json", rec)


# ---- the developer's side ------------------------------------------------------------------
def print_plan(plan, deadline: float, home: Path = HOME) -> int:
    """What the next window would run: each step's state and expected seconds, and which
    of the pending ones fit in ``deadline`` (in order, passing over those that do not)."""
    left, setup = deadline - PACK_SECONDS, SETUP_SECONDS
    print(f"{'step':<18} {'state':<8} {'expect':>7}  next window ({deadline:.0f} s)  why")
    for item in plan:
        done, expected, why = status(item, home)
        need = min(expected, item.timeout) + (setup if item.wheels else 0)
        if done:
            verdict = "-"
        elif need <= left:
            left -= need
            setup = 0 if item.wheels else setup
            verdict = "runs"
        else:
            verdict = "waits"
        state = "done" if done else "pending"
        print(f"{item.name:<18} {state:<8} {expected:>6.0f}s  {verdict:<22} {why}")
    return 0


def collect_window(folder: Path, home: Path = HOME) -> list[Path]:
    """Bring a returned window home: each step's folder into home/STEP/ (replacing the
    last run's), window.json and window.log into home/runs/ by date. A dry run's
    results are refused: they say nothing about a GPU."""
    summary = json.loads((folder / "window.json").read_text())
    if summary.get("dry_run"):
        raise SystemExit(f"{folder}: a dry run, not a GPU window: nothing to collect")
    got = []
    for tar in sorted(folder.glob("steps*.tar.gz")):
        with tarfile.open(tar) as t:
            names = {m.name.split("/")[0] for m in t.getmembers()}
            for name in names:
                shutil.rmtree(home / name, ignore_errors=True)
            t.extractall(home, filter="data")
        got += [home / n for n in sorted(names)]
    stamp = summary["date"].replace(" ", "_").replace(":", "")
    runs = home / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(folder / "window.json", runs / f"{stamp}.json")
    if (folder / "window.log").exists():
        shutil.copyfile(folder / "window.log", runs / f"{stamp}.log")
    return got


def render(home: Path = HOME) -> list[str]:
    """The window's part of docs/gpu-notes.md: each step's last record."""
    recs = [json.loads(p.read_text()) for p in sorted(home.glob("*/step.json"))]
    if not recs:
        return []
    lines = ["## Window steps (generated)", "",
             "| step | result | seconds | device | commit | date | why |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in recs:
        result = "ok" if r.get("ok") else ("FAILED" if r.get("completed") else "cut")
        lines.append(
            f"| {r['step']} | {result} | {r.get('seconds', '-')} | {r.get('device', '?')} "
            f"| `{r.get('commit')}` | {r.get('date')} | {(r.get('why') or '').replace('|', '/')} |"
        )
    return ["", *lines]


def command(deadline: float) -> str:
    commit = git_commit() or "unknown"
    return (
        f'device run, carry [".whl"], timeout_s 600:\n'
        f"  MGG_COMMIT={commit} python3 bench/gpu/stage.py window --out $OUT "
        f"--deadline {deadline:g}"
    )


def main(argv) -> int:
    """`stage.py window ...`: run a window, or (--plan, --command) say what one would."""
    import argparse

    from gpu_env import SetupError, setup
    from plan import plan

    ap = argparse.ArgumentParser(prog="stage.py window", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="the output folder ($OUT on the GPU machine)")
    ap.add_argument("--deadline", type=float, default=560.0, help="seconds, setup included")
    ap.add_argument("--dry-run", action="store_true", help="every step at toy size")
    ap.add_argument("--backend", choices=["cpu", "cuda"], help="the dry run's (default cpu)")
    ap.add_argument("--jobs", type=int, help="a dry run's steps side by side (default: cores)")
    ap.add_argument("--only", default="", help="these steps (comma-separated) alone")
    ap.add_argument("--redo", default="", help="these steps even if done")
    ap.add_argument("--plan", action="store_true", help="print what the next window runs")
    ap.add_argument("--command", action="store_true", help="print the device command")
    ap.add_argument("--wheels", default=str(ROOT / ".whl"))
    ap.add_argument("--no-setup", action="store_true", help="use this environment as it is")
    args = ap.parse_args(argv)
    steps = plan()
    names = [s.name for s in steps]
    for flag in ("only", "redo"):
        bad = [n for n in getattr(args, flag).split(",") if n and n not in names]
        if bad:
            ap.error(f"--{flag}: no step {', '.join(bad)} (steps: {', '.join(names)})")
    if args.only:
        steps = [s for s in steps if s.name in args.only.split(",")]
    if args.backend and not args.dry_run:
        ap.error("--backend: only a --dry-run takes it (a window runs on the GPU)")
    if args.jobs is not None and (args.jobs < 1 or (args.jobs > 1 and not args.dry_run)):
        ap.error(f"--jobs {args.jobs}: 1 or more, and 1 in a window (steps share its GPU)")
    jobs = (args.jobs or os.cpu_count() or 1) if args.dry_run else 1
    if not 30 <= args.deadline <= 590:
        ap.error(f"--deadline {args.deadline:g}: between 30 and 590 s (a command has 600)")
    if args.plan:
        return print_plan(steps, args.deadline)
    if args.command:
        print(command(args.deadline))
        return 0
    if not args.out:
        ap.error("--out is required to run a window")
    backend = args.backend or "cpu"
    for s in steps:
        if args.dry_run:
            s.argv, s.expect, s.output = s.dry_argv(backend), s.dry_expect, s.dry_output
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
    info, ready = {}, {}

    def env_for(item):
        if args.dry_run or args.no_setup or not item.wheels:
            return ready.get("env", base)
        if "error" in ready:
            raise SetupError(ready["error"])
        if "env" not in ready:
            t = time.monotonic()
            try:
                ready["env"], info["versions"] = setup(Path(args.wheels), Path(args.out), print)
                info["setup_s"] = round(time.monotonic() - t, 1)
            except Exception as e:
                ready["error"] = str(e)
                raise
        return ready["env"]

    try:
        summary = run_window(
            steps, Path(args.out), args.deadline, env_for, dry=args.dry_run,
            redo=set(args.redo.split(",")) - {""}, info=info, jobs=jobs,
        )  # fmt: skip
    except Ended as e:
        print(f"stage.py window: ended by {e}; the step in flight was killed", file=sys.stderr)
        return 124
    for s in summary["steps"]:
        state = "ok" if s["ok"] else ("-" if not s.get("started") else "FAIL")
        print(f"  {s['step']:<16} {state:<5} {s.get('seconds', '-'):>6}  {s.get('why') or ''}")
    return 0 if summary["ok"] else 1
