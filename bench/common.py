"""What every benchmark shares: timing, machine facts, and the result files.

Each script writes bench/results/<name>.json and <name>.md (and a .png where a plot helps),
recording the machine, the commit and the exact command.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from step_costs import time_steps

from mgg.graph.dataset import Dataset, make_split, random_features

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SHARED_DATA = ROOT.parent / "shared" / "data"


def median_time(fn, repeat: int = 7, warmup: int = 1) -> float:
    """Median wall time of fn() in seconds, after warm-up calls."""
    return float(np.median(time_steps(fn, repeat, warmup)))


def compare(fns: dict, repeat: int = 9, warmup: int = 1) -> dict:
    """Median wall time (s) of each callable, measured round-robin so that every design
    sees the same background noise (this matters on shared machines)."""
    for f in fns.values():
        for _ in range(warmup):
            f()
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def csv_list(text: str, allowed=None, cast=str) -> list:
    """A comma-separated flag's values, cast; SystemExit naming the script and the choices
    where it is empty or holds a value not in ``allowed``."""
    vals = [cast(v) for v in text.split(",") if v]
    if not vals or (allowed is not None and any(v not in allowed for v in vals)):
        choices = f": choose from {', '.join(map(str, allowed))}" if allowed else ": empty"
        raise SystemExit(f"{Path(sys.argv[0]).stem}: {text!r}{choices}")
    return vals


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem, 1) if mem else None,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def commit() -> str:
    """$MGG_COMMIT where the command line sets it (the GPU machine's copy carries the .git
    of an older checkout), else the checkout's commit (-dirty with uncommitted changes)."""
    if os.environ.get("MGG_COMMIT"):
        return os.environ["MGG_COMMIT"]
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def command() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def memory_bandwidth(gib: float = 1.0, repeat: int = 5) -> float:
    """STREAM-style triad a = b + s*c over all threads (numba), in bytes/s."""
    import numba

    @numba.njit(parallel=True, fastmath=True)
    def triad(a, b, c, s):
        for i in numba.prange(a.size):
            a[i] = b[i] + s * c[i]

    n = int(gib * 2**30 / 4 / 3)
    a, b, c = (np.ones(n, np.float32) for _ in range(3))
    t = median_time(lambda: triad(a, b, c, np.float32(3.0)), repeat=repeat)
    return 3 * n * 4 / t


def paired_bars(path: Path, names: list[str], panels: list, sides: dict, title: str) -> None:
    """A figure of panels, side by side, each two bars per name: ``panels`` [(y label,
    {side: values}[, {side: whiskers}])], ``sides`` {side: legend label}, in the order of
    the bars; whiskers (optional) as matplotlib's yerr: [below, above] per name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    x = np.arange(len(names))
    for ax, (label, values, *whiskers) in zip(np.atleast_1d(axes), panels, strict=True):
        for i, (side, legend) in enumerate(sides.items()):
            yerr = whiskers[0][side] if whiskers else None
            ax.bar(x + 0.4 * i - 0.2, values[side], 0.4, yerr=yerr, capsize=3, label=legend)
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_ylabel(label)
    np.atleast_1d(axes)[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(
    name: str,
    payload: dict,
    table: list[dict],
    columns: list[str],
    notes: str = "",
    subdir: str = "",
    extra_meta: dict | None = None,
    out_dir: Path | None = None,
) -> Path:
    """Write <name>.json (payload + meta) and <name>.md (a table) under bench/results
    (or a sub-folder of it, or out_dir)."""
    out_dir = Path(out_dir) if out_dir else RESULTS / subdir if subdir else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": machine(),
        "commit": commit(),
        "command": command(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        **(extra_meta or {}),
    }
    out = {"meta": meta, **payload, "table": table}
    path = out_dir / f"{name}.json"
    write_atomic(path, json.dumps(out, indent=1, default=_json_default) + "\n")
    lines = [
        f"# {name}",
        "",
        f"Machine: {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"{meta['machine']['memory_gib']} GiB · commit `{meta['commit']}` · "
        f"{meta['date']}" + (f" · device **{meta['device']}**" if "device" in meta else ""),
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
    if notes:
        lines += [notes, ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    for row in table:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    write_atomic(out_dir / f"{name}.md", "\n".join(lines) + "\n")
    return path


def write_atomic(path: Path, text: str) -> None:
    """Write text so that a reader (or a kill mid-write) sees the old file or the new one,
    never half of one (mgg's one atomic writer)."""
    from mgg.atomic import atomic_write

    with atomic_write(path) as tmp:
        Path(tmp).write_text(text)


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, (int, np.integer)):
        return f"{v:,}"
    return str(v)


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


def mgg_json(nprocs: int, *args, timeout: float = 3600, env: dict | None = None, cwd=ROOT):
    """Run `mggrun -np P mgg ARGS --json` (``env``: variables added to this process's)
    and return the JSON of its last line."""
    return job_json(nprocs, "mgg", *args, "--json", timeout=timeout, env=env, cwd=cwd)


def job_json(nprocs: int, *argv, timeout: float = 3600, env: dict | None = None, cwd=ROOT) -> dict:
    """Run `mggrun -np P ARGV` (a command whose rank 0 prints JSON last) in ``cwd`` (the
    ranks import the mgg found there first) and return the JSON of its last line."""
    cmd = [sys.executable, str(ROOT / "launch" / "mggrun"), "-np", str(nprocs), *map(str, argv)]
    env = None if env is None else dict(os.environ, **env)
    return run_json(cmd, " ".join(cmd), timeout=timeout, env=env, cwd=cwd)


def run_json(cmd: list, what: str, timeout: float = 3600, env: dict | None = None, cwd=None):
    """Run ``cmd`` (a worker process that prints JSON last; ``env``: its whole environment)
    and return the JSON of its stdout's last line; RuntimeError naming ``what`` with the
    end of its stderr when it fails."""
    cmd = [str(c) for c in cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def real_graphs(
    names=(
        "cora",
        "pubmed",
        "amazon_photo",
        "amazon_computers",
        "coauthor_cs",
        "ego_twitter",
        "cnr_2000",
    ),
) -> list[Path]:
    """The real graphs of ../shared/data that are present."""
    return [p for n in names if (p := SHARED_DATA / f"{n}.npz").exists()]


def complete(ds: Dataset, seed: int = 0) -> Dataset:
    """Give a dataset what training needs: seeded random features and labels if absent."""
    n = ds.graph.num_nodes
    x = ds.x if ds.x is not None else random_features(seed, 0, n, 128)
    y = ds.y if ds.y is not None else np.random.default_rng(seed).integers(0, 16, n)
    c = ds.num_classes if ds.y is not None else 16
    masks = (ds.train_mask, ds.val_mask, ds.test_mask)
    if masks[0] is None:
        masks = make_split(y, c, 20, 30, seed=seed)
    return Dataset(ds.name, ds.graph, x, y, *masks, num_classes=c)


def default_trainer(dg, data, name: str, **kw):
    """A Trainer of the registered model ``name`` with its defaults (Adam, its lr and
    weight decay) on the job's device, without evaluation between steps (``kw``: more
    Trainer options)."""
    import mgg.torch as mt
    from mgg.job import build_optimizer
    from mgg.train import Trainer

    spec = mt.MODELS[name]
    model = mt.build_model(name, data.num_features, data.num_classes).to(data.y.device)
    opt = build_optimizer("adam", model, spec.lr, spec.weight_decay)
    return Trainer(dg, data, model, opt, eval_every=0, **kw)
