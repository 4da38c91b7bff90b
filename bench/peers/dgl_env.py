"""DGL's own virtualenv, for DGL as a benchmark peer of mgg (nothing of it in mgg's
dependencies: DGL 2.1 wants torch 2.1 and numpy < 2, which mgg's venv does not hold).

``python bench/peers/dgl_env.py`` builds the venv at bench/peers/.dgl-venv (or reuses it:
a stamp file inside records the pins it was built with; when they match, nothing is
done) and prints one progress line per step to stderr. Other bench scripts call
``run_worker(...)`` (``from peers.dgl_env import run_worker`` with bench/ on sys.path),
which builds the venv where needed and runs bench/peers/dgl_worker.py in it.

torch comes from PyTorch's CPU-only index where that is reachable, else from PyPI (the
CUDA build, with its nvidia-* wheels: about 2.5 GiB more on disk; it runs on the CPU all
the same). A failure raises RuntimeError with one line naming the step that failed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

# DGL 2.1.0 is the newest DGL with a CPU wheel for this platform (2.2 has none); it is
# built against torch 2.1.2 (graphbolt loads a library named after torch's version) and
# numpy 1. The rest: what ``import dgl`` (graphbolt, dgl.data, dgl.distributed) needs.
PINS = [
    "torch==2.1.2",
    "dgl==2.1.0",
    "numpy<2",
    "pandas<2.3",
    "scipy<1.14",
    "torchdata==0.7.1",
    "networkx<3.5",
    "pydantic>=2,<3",
    "pyyaml>=6,<7",
    "requests>=2.19,<3",
    "psutil>=5.8,<8",
    "tqdm>=4,<5",
]
PYTHON = (3, 11)  # DGL 2.1.0's wheels: cp38 .. cp311
HERE = Path(__file__).resolve().parent
VENV = HERE / ".dgl-venv"
STAMP = VENV / "mgg-dgl-pins.json"
WORKER = HERE / "dgl_worker.py"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _say(msg: str) -> None:
    print(f"dgl_env: {msg}", file=sys.stderr, flush=True)


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def env() -> dict:
    """The environment to run the venv's python in: DGL on its PyTorch backend (so that it
    neither warns nor writes ~/.dgl/config.json) and its config and download folders
    inside the venv instead of ~/.dgl."""
    e = dict(os.environ)
    e["DGLBACKEND"] = "pytorch"
    e["DGLDEFAULTDIR"] = e["DGL_DOWNLOAD_DIR"] = str(VENV / "dgl-home")
    e.pop("PYTHONPATH", None)  # nothing of mgg's venv or bench/ leaks in
    return e


def _interpreter() -> str:
    """A python of version PYTHON to create the venv with."""
    want = "{}.{}".format(*PYTHON)
    cands = []
    if sys.version_info[:2] == PYTHON:
        cands.append(getattr(sys, "_base_executable", None) or sys.executable)
    cands += [shutil.which(f"python{want}"), shutil.which("python3")]
    for c in cands:
        if not c:
            continue
        try:
            out = subprocess.run(
                [c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if out == want:
            return c
    raise RuntimeError(f"dgl_env: no python {want} found (DGL 2.1.0 has wheels up to 3.11)")


def _cpu_index_reachable() -> bool:
    try:
        with urllib.request.urlopen(f"{CPU_INDEX}/torch/", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def _run(step: str, cmd: list[str]) -> None:
    _say(step)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env())
    if p.returncode:
        lines = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        raise RuntimeError(f"dgl_env: {step} failed (exit {p.returncode}): {last}")
    _say(f"  done in {time.perf_counter() - t0:.0f} s")


def _wanted() -> dict:
    return {"pins": PINS, "python": "{}.{}".format(*PYTHON)}


def ready() -> bool:
    """Whether the venv exists, built with today's PINS."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return False
    return _venv_python().exists() and {k: stamp.get(k) for k in _wanted()} == _wanted()


def build(force: bool = False) -> Path:
    """Build the venv (or reuse it where its stamp matches PINS); its python."""
    HERE.mkdir(parents=True, exist_ok=True)
    with open(__file__) as lock:  # one builder at a time (a second one waits, then reuses)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and ready():
            _say(f"reusing {VENV} (pins match)")
            return _venv_python()
        t0 = time.perf_counter()
        if VENV.exists():
            _say(f"removing {VENV} (no stamp, or other pins)")
            shutil.rmtree(VENV)
        _run(f"creating venv {VENV}", [_interpreter(), "-m", "venv", str(VENV)])
        py = str(_venv_python())
        pip = [py, "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
        torch_pin = next(p for p in PINS if p.startswith("torch=="))
        cpu = _cpu_index_reachable()
        if cpu:
            _run(
                f"installing {torch_pin} (CPU build, {CPU_INDEX})",
                pip + ["--index-url", CPU_INDEX, torch_pin, "numpy<2"],
            )
        else:
            _say(f"{CPU_INDEX} unreachable: torch from PyPI (CUDA build, runs on the CPU)")
        _run(f"installing {' '.join(PINS)}", pip + PINS)
        _run(
            "checking that dgl imports",
            [py, "-c", "import dgl, dgl.nn, torch; print(dgl.__version__, torch.__version__)"],
        )
        freeze = subprocess.run(
            [py, "-m", "pip", "freeze"], capture_output=True, text=True
        ).stdout.split()
        stamp = {**_wanted(), "torch_index": CPU_INDEX if cpu else "pypi", "freeze": freeze}
        STAMP.write_text(json.dumps(stamp, indent=1) + "\n")
        _say(f"ready in {time.perf_counter() - t0:.0f} s: {py}")
        return _venv_python()


def python() -> Path:
    """The DGL venv's python, the venv built first where needed."""
    return build()


def run_worker(*args, timeout: float = 3600) -> dict:
    """dgl_worker.py ``args`` run in the DGL venv (built where needed), with ``env()``: the
    JSON line it prints."""
    from common import run_json

    cmd = [python(), WORKER, *args]
    return run_json(cmd, f"dgl_worker {args[0]}", timeout=timeout, env=env())


if __name__ == "__main__":
    try:
        print(build(force="--force" in sys.argv[1:]))
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
