"""The one entry point for the GPU machine: a window or a stage per device command.

A device window (15 minutes, one prepared command; bench/gpu/window.py):
    python3 bench/gpu/stage.py window --out $OUT --deadline 560
One stage by hand (carrying .whl; `command` prints it):
    python3 bench/gpu/stage.py STAGE --out $OUT [--quick]
On the developer's machine:
    python3 bench/gpu/stage.py list                 the stages, their steps and limits
    python3 bench/gpu/stage.py command STAGE        the device command for this checkout
    python3 bench/gpu/stage.py collect DIR|TAR ...  bring returned results home
    python3 bench/gpu/stage.py window --plan|--dry-run|--command   see window.py

Before a stage runs, the environment is set up as docs/gpu-notes.md says: nvshmem4py
and mpi4py installed from .whl/ into /tmp/mgg-site, the mpich wheel unzipped (pip
--target would drop its lib/), PATH, LD_LIBRARY_PATH and MGG_MPIEXEC pointed at it, and
a 2-rank mpiexec proving that launcher and library agree. The versions that matter are
printed and kept. Anything missing fails the stage in seconds, saying what.

Each stage ends inside STAGE_BUDGET seconds: its steps run with their own limits,
shortened to what is left, each in its own process group (killed whole at its limit).
Everything lands in --out/STAGE/: stage.json (versions, every step's outcome, rewritten
after each step), stage.log (all output, as it is printed) and the benchmark's own
files, which it writes row by row; so a command killed at its limit still returns what
it measured. More than MAX_FILES files are packed into one tarball.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import window
from gpu_env import SetupError, setup
from runner import (
    ROOT,
    STEP_ENV,
    Ended,
    Step,
    end_steps_on_signals,
    git_commit,
    run_step,
    write_json,
)

STAGE_BUDGET = 450.0  # seconds a stage may take, setup included (a command has 600)
MIN_STEP = 15.0  # a step with less time left than this is skipped, not started
MAX_FILES = 8  # what a device command brings back
CHECK_GRAPH = "rmat:scale=14,ef=16"
NOTES = ROOT / "docs" / "gpu-notes.md"
HOME = ROOT / "bench" / "results" / "gpu"


@dataclass
class Stage:
    name: str
    about: str
    steps: list[Step] = field(default_factory=list)


# ---- the stages --------------------------------------------------------------------------
BENCHES = {  # stage: (script, what it measures, stand-in scale)
    "table1": ("table1_direct_vs_uvm", "direct NVSHMEM vs UVM", "0.1"),
    "fig8": ("fig8_mgg_vs_uvm", "MGG vs UVM, GCN and GIN, P = 2, 4, 8", "0.1"),
    "table4": ("table4_mgg_vs_dgcl", "MGG vs DGCL-style, with preprocessing", "0.1"),
    "fig9": ("fig9_ablation", "neighbor partitioning and interleaving ablations", "0.1"),
    "fig10": ("fig10_tuner", "the tuner on the Reddit stand-in vs the exhaustive grid", "0.25"),
    "e2e": ("e2e_vs_pyg", "GCN, SAGE, GIN and GAT training steps vs PyG on one GPU", "0.25"),
}


def _check_json(np_: int, mode: str):
    """What a `mgg check --json` step must print: P ranks, every op equal to scipy, and
    the remote path asked for."""

    def expect(res: dict | None) -> str | None:
        if res is None:
            return "no JSON result printed"
        if res.get("np") != np_:
            return f"the job ran with {res.get('np')} ranks, not {np_}"
        bad = [f"{r['design']}/{r['op']}" for r in res["runs"] if not r["ok"]]
        if bad:
            return f"differs from scipy: {', '.join(bad)}"
        modes = {r["remote_path"]["mode"] for r in res["runs"] if "remote_path" in r}
        if mode != "auto" and modes != {mode}:
            return f"ran the {sorted(modes)} remote path, not {mode}"
        return None

    return expect


def stages(quick: bool = False) -> dict[str, Stage]:
    py = sys.executable
    run = [py, str(ROOT / "launch" / "mggrun")]
    test = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    bf16 = [*test, "tests/test_cuda_bf16.py"]
    kernels = [*test, "tests/test_cuda.py", "tests/test_virtual_designs.py"]
    host = [*test, "tests/test_stream.py", "tests/test_output_rows.py", "tests/test_offload.py"]
    bench = [py, "-u"]

    def script(name, *args, timeout=420):
        return Step(name, [*bench, f"bench/gpu/{name}.py", *args], timeout)

    out = {
        "probe": Stage(
            "probe",
            "NVSHMEM with 1, 2 and 4 PEs sharing the GPU: init, symmetric arrays, "
            "nvshmem_ptr, a pointer-table kernel, a device-side get, mgg's get kernel",
            [
                Step(f"probe-np{p}", [*run, "-np", str(p), py, "bench/gpu/probe.py"], t)
                for p, t in ((1, 90), (2, 120), (4, 150))
            ],
        ),
        "tests": Stage(
            "tests",
            "the single-process gpu-marked tests: kernels, designs, training (eager and "
            "captured), compute-sanitizer; streamed, offloaded and labeled rows",
            [
                Step("single", [*kernels, "-m", "gpu and not mpi", "-k", "not memcheck"], 280),
                Step("memcheck", [*kernels, "-m", "gpu", "-k", "memcheck"], 40),
                Step("host", [*host, "-m", "gpu and not mpi"], 110),
            ],
        ),
        "pes": Stage(
            "pes",
            "the gpu-marked tests of NVSHMEM PEs sharing the GPU (p2p and get modes), "
            "training on two PEs",
            [Step("pes", [*kernels, "tests/test_output_rows.py", "-m", "gpu and mpi"], 420)],
        ),
        "check": Stage(
            "check",
            f"mggrun -np P mgg check {CHECK_GRAPH} --backend cuda for P = 1, 2, 4 in the "
            "p2p and the get mode, every op and design against scipy",
            [
                Step(
                    f"np{p}-{mode}",
                    [
                        *run,
                        "-np",
                        str(p),
                        "mgg",
                        "check",
                        "rmat:scale=10,ef=8" if quick else CHECK_GRAPH,
                        "--backend",
                        "cuda",
                        "--remote",
                        mode,
                        "--op",
                        "all",
                        "--dim",
                        "32",
                        "--repeat",
                        "3",
                        "--json",
                    ],
                    68,
                    _check_json(p, mode),
                )
                for p in (1, 2, 4)
                for mode in ("p2p", "get")
            ],
        ),
        "aggregation": Stage(
            "aggregation",
            "one PE vs cuSPARSE at its best and PyG, Reddit-size R-MAT (or --graphs), D = 16, "
            "128, mgg in float32 and bfloat16",
            [script("aggregation", "--bf16", *(["--edges", "20000000"] if quick else []))],
        ),
        "bf16": Stage(
            "bf16",
            "the gpu-marked bfloat16 tests (issue 52): kernels, designs, compute-sanitizer, "
            "NVSHMEM PEs in the p2p and get modes",
            [
                Step("single", [*bf16, "-m", "gpu and not mpi"], 220),
                Step("pes", [*bf16, "-m", "gpu and mpi"], 200),
            ],
        ),
        "kernel": Stage(
            "kernel",
            "this checkout's aggregation kernel (and, with --args, another) in float32 and "
            "bfloat16 vs cuSPARSE at D = 16 and 128, and ncu's counters",
            [script("kernel_ab", "--bf16", *(["--edges", "20000000"] if quick else []))],
        ),
        "locality": Stage(
            "locality",
            "the aggregation kernel on the Reddit-size R-MAT in natural, rcm and metis node "
            "order (issue 53): time and ncu's L1/L2 hit rates",
            [
                script(
                    "kernel_ab",
                    "--orders",
                    "natural,rcm,metis",
                    *(["--edges", "20000000"] if quick else []),
                    timeout=430,
                )  # fmt: skip
            ],
        ),
        "stream": Stage(
            "stream",
            "input features streamed from pinned host memory (issue 59, stage 3): a GCN "
            "epoch held vs under --device-memory budgets that stream rows/2, /4, /8",
            [
                Step(
                    "stream",
                    [
                        *bench,
                        "bench/stream.py",
                        "--backend",
                        "cuda",
                        "--graph",
                        "products:scale=0.02" if quick else "products:scale=0.25",
                        "--repeat",
                        "1" if quick else "2",
                    ],
                    420,
                )  # fmt: skip
            ],
        ),
        "offload": Stage(
            "offload",
            "activations kept in pinned host memory (--offload, issue 59, stage 3): GCN "
            "and GAT at 2 and 4 layers, held vs offloaded, with and without --recompute: "
            "the pools' peak, the epoch, the plan's activations",
            [
                Step(
                    "offload",
                    [
                        *bench,
                        "bench/offload.py",
                        "--backend",
                        "cuda",
                        "--models",
                        "gcn,gat",
                        "--graph",
                        "products:scale=0.02" if quick else "products:scale=0.25",
                        "--repeat",
                        "1",
                    ],
                    430,
                )  # fmt: skip
            ],
        ),
        "fullsize": Stage(
            "fullsize",
            "a stand-in at full size (issue 59, stage 1; --args picks the graph and the PEs): "
            "every model in float32 and bfloat16, the epoch and each PE's peak device memory "
            "against the plan",
            [
                Step(
                    "fullsize",
                    [
                        *bench,
                        "bench/gpu/fullsize.py",
                        "--graph",
                        "products",
                        "--scale",
                        "0.02" if quick else "1",
                        "--pes",
                        "1",
                    ],
                    430,
                )  # fmt: skip
            ],
        ),
        "papers": Stage(
            "papers",
            "papers100m drawn and partitioned by the ranks, GCN and SAGE in bf16 (hidden 128, "
            "--output-rows labeled) from its shards (issue 59, stage 2: scale 1 with --args "
            "'papers=--scale 1 --pes 4' on an nvidia-h200): partition, first epoch, epoch, "
            "peak device memory against the plan, or the plan's refusal",
            [
                Step(
                    "papers",
                    [
                        *bench,
                        "bench/gpu/papers_gpu.py",
                        "--scale",
                        "0.01" if quick else "0.1",
                        "--pes",
                        "1",
                    ],
                    430,
                )  # fmt: skip
            ],
        ),
        "nvshmem": Stage(
            "nvshmem",
            "the aggregation on 2 and 4 NVSHMEM PEs (p2p and get) vs as many virtual PEs",
            [script("nvshmem_vs_virtual", *(["--graph", "products:scale=0.02"] if quick else []))],
        ),
    }
    for name, (file, about, scale) in BENCHES.items():
        out[name] = Stage(name, about, [script(file, "--scale", "0.02" if quick else scale)])
    return out


# ---- running a stage -----------------------------------------------------------------------
def run_stage(stage: Stage, out: Path, env: dict, summary: dict, budget=STAGE_BUDGET) -> dict:
    """Run every step of a stage inside the budget (counted from summary['t0'], so that
    setup counts too); stage.json is rewritten after each step."""
    out.mkdir(parents=True, exist_ok=True)
    summary.setdefault("steps", [])
    t0 = summary.pop("t0", time.monotonic())
    with open(out / "stage.log", "a", buffering=1) as log:
        for step in stage.steps:
            left = budget - (time.monotonic() - t0)
            if left < MIN_STEP:
                rec = {"step": step.name, "ok": False, "why": f"not started: {left:.0f} s left"}
            else:
                limit = min(step.timeout, left)
                head = f"== {stage.name}/{step.name} (limit {limit:.0f} s): "
                log.write(head + shlex.join(step.argv) + "\n")
                print(head + shlex.join(step.argv), flush=True)
                # a command killed during this step leaves this record, not silence
                cut = {
                    "step": step.name,
                    "ok": False,
                    "why": "cut: the command ended during this step",
                }
                write_json(
                    out / "stage.json", {**summary, "ok": False, "steps": summary["steps"] + [cut]}
                )
                rec = run_step(step, limit, env, log)
                log.write(f"== {step.name}: {'ok' if rec['ok'] else rec['why']}\n")
            summary["steps"].append(rec)
            summary["ok"] = all(s["ok"] for s in summary["steps"])
            summary["seconds"] = round(time.monotonic() - t0, 1)
            write_json(out / "stage.json", summary)
    return summary


def pack_if_needed(top: Path, stage_dir: Path, limit: int = MAX_FILES) -> Path | None:
    """When top holds more than ``limit`` files, pack stage_dir into one tarball beside
    it (a device command brings back at most ``limit``)."""
    files = [p for p in top.rglob("*") if p.is_file()]
    if len(files) <= limit:
        return None
    tar = top / f"{stage_dir.name}.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        t.add(stage_dir, arcname=stage_dir.name)
    shutil.rmtree(stage_dir)
    return tar


def print_table(summary: dict) -> None:
    print(f"\n{summary['stage']}: {'ok' if summary.get('ok') else 'FAILED'}")
    for s in summary["steps"]:
        print(
            f"  {s['step']:<12} {'ok' if s['ok'] else 'FAIL'}  {s.get('seconds', '-')} s"
            + ("" if s["ok"] else f"  {s['why']}")
        )


def cmd_run(args) -> int:
    table = stages(args.quick)
    unknown = [s for s in args.stages if s not in table]
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; stages: {', '.join(table)}")
    for spec in args.args:
        name, _, more = spec.partition("=")
        if name not in table or len(table[name].steps) != 1:
            raise SystemExit(f"--args {spec!r}: {name!r} is not a one-step (benchmark) stage")
        table[name].steps[0].argv += shlex.split(more)
    top = Path(args.out)
    code = 0
    for i, name in enumerate(args.stages):
        t0 = time.monotonic()
        out = top / name
        out.mkdir(parents=True, exist_ok=True)
        summary = {
            "stage": name,
            "about": table[name].about,
            "commit": os.environ.get("MGG_COMMIT") or git_commit() or "unknown",
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "quick": args.quick,
            "t0": t0,
        }
        if args.no_setup:
            env = dict(os.environ, MGG_GPU_OUT=str(out), **STEP_ENV)
        else:
            try:
                env, summary["versions"] = setup(Path(args.wheels), out, print)
            except (SetupError, subprocess.SubprocessError, OSError) as e:
                summary.update(ok=False, setup_error=str(e), steps=[])
                summary.pop("t0")
                write_json(out / "stage.json", summary)
                print(f"stage {name}: setup failed: {e}", file=sys.stderr)
                return 2
            summary["device"] = summary["versions"].get("device")
            print(json.dumps(summary["versions"]), flush=True)
        summary = run_stage(table[name], out, env, summary)
        print_table(summary)
        # a later stage killed at the command's limit packs nothing: pack this one now
        pack_if_needed(top, out, 0 if i + 1 < len(args.stages) else MAX_FILES)
        code = code or (0 if summary["ok"] else 1)
    return code


# ---- the developer's side ------------------------------------------------------------------
def cmd_list(args) -> int:
    for name, st in stages(args.quick).items():
        total = sum(s.timeout for s in st.steps)
        print(
            f"{name:<12} {st.about}  [steps: {total:.0f} s of limits, stage {STAGE_BUDGET:.0f} s]"
        )
        for s in st.steps:
            print(f"    {s.name:<12} {s.timeout:>4.0f} s  {shlex.join(s.argv[1:])}")
    return 0


def cmd_command(args) -> int:
    commit = git_commit() or "unknown"
    for name in args.stages:
        quick = " --quick" if args.quick else ""
        print(
            f'device run, carry [".whl"], timeout_s 580:\n'
            f"  MGG_COMMIT={commit} python3 bench/gpu/stage.py {name} --out $OUT{quick}"
        )
    if not (ROOT / ".whl").is_dir():
        print("first: bench/gpu/fetch_wheels.sh (puts the three wheels into .whl/)")
    return 0


def cmd_collect(args) -> int:
    """Copy each returned stage folder (or tarball) into bench/results/gpu/STAGE/ and
    regenerate the generated part of docs/gpu-notes.md."""
    got = []
    for src in map(Path, args.paths):
        if src.is_dir() and (src / "window.json").exists():
            got += window.collect_window(src)
            continue
        for item in [src] if src.is_file() else sorted(src.iterdir()):
            if item.is_file() and item.name.endswith(".tar.gz"):
                with tarfile.open(item) as t:
                    dest = HOME
                    dest.mkdir(parents=True, exist_ok=True)
                    t.extractall(dest, filter="data")
                    got += [dest / n for n in {m.name.split("/")[0] for m in t.getmembers()}]
            elif item.is_dir() and (item / "stage.json").exists():
                dest = HOME / item.name
                dest.mkdir(parents=True, exist_ok=True)
                for f in item.iterdir():
                    if f.is_file():
                        shutil.copyfile(f, dest / f.name)
                got.append(dest)
    if not got:
        raise SystemExit(
            f"no stage results (a folder with stage.json, or a tarball) in {args.paths}"
        )
    render_notes()
    for d in got:
        print(f"collected {d}")
    print(f"updated {NOTES}")
    return 0


BEGIN = "<!-- BEGIN generated by bench/gpu/stage.py collect -->"
END = "<!-- END generated -->"


def render_notes(home: Path | None = None, notes: Path | None = None) -> str:
    """The generated part of docs/gpu-notes.md: every collected stage run and every
    probe step, from the files under home (default bench/results/gpu)."""
    home, notes = home or HOME, notes or NOTES
    lines = ["## Stage runs (generated)", ""]
    runs = sorted(home.glob("*/stage.json"))
    if not runs:
        lines.append("None yet: no stage has run on a GPU.")
    else:
        lines += [
            "| stage | result | device | commit | date | steps |",
            "|---|---|---|---|---|---|",
        ]
        for path in runs:
            s = json.loads(path.read_text())
            steps = (
                ", ".join(
                    f"{st['step']} {'ok' if st['ok'] else 'FAIL (' + str(st.get('why')) + ')'}"
                    for st in s.get("steps", [])
                )
                or f"setup failed: {s.get('setup_error')}"
            )
            lines.append(
                f"| {s['stage']} | {'ok' if s.get('ok') else 'FAILED'} | {s.get('device', '?')} "
                f"| `{s.get('commit')}` | {s.get('date')} | {steps} |"
            )
        vers = [json.loads(p.read_text()).get("versions") for p in runs]
        vers = [v for v in vers if v]
        if vers:
            lines += [
                "",
                "Versions (last run): " + ", ".join(f"{k} {v}" for k, v in vers[-1].items()),
            ]
    probes = sorted(home.glob("probe/probe-np*.jsonl"))
    if probes:
        lines += [
            "",
            "## Probe (generated)",
            "",
            "| PEs | step | ranks ok | detail or error |",
            "|---|---|---|---|",
        ]
        for path in probes:
            recs = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
            np_ = recs[0]["np"] if recs else "?"
            for name in dict.fromkeys(r["step"] for r in recs):
                mine = [r for r in recs if r["step"] == name]
                first = next((r for r in mine if not r["ok"]), mine[0])
                text = json.dumps(first.get("detail")) if first["ok"] else first.get("error", "")
                lines.append(
                    f"| {np_} | {name} | {sum(r['ok'] for r in mine)}/{np_} | "
                    f"{text.replace('|', '/')[:300]} |"
                )
    lines += window.render(home / "window")
    block = "\n".join([BEGIN, "", *lines, "", END])
    text = notes.read_text() if notes.exists() else ""
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    notes.write_text(text)
    return block


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb")
    for verb in ("list", "command", "collect"):
        s = sub.add_parser(verb)
        if verb == "command":
            s.add_argument("stages", nargs="+")
        if verb == "collect":
            s.add_argument("paths", nargs="+")
        s.add_argument("--quick", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "window":
        return window.main(argv[1:])
    if argv and argv[0] in ("list", "command", "collect"):
        args = ap.parse_args(argv)
        return {"list": cmd_list, "command": cmd_command, "collect": cmd_collect}[args.verb](args)
    run = argparse.ArgumentParser(prog="stage.py", description=__doc__.splitlines()[0])
    run.add_argument("stages", nargs="+", help=", ".join(stages()))
    run.add_argument("--out", required=True, help="the output folder ($OUT on the GPU machine)")
    run.add_argument("--wheels", default=str(ROOT / ".whl"))
    run.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    run.add_argument("--no-setup", action="store_true", help="use this environment as it is")
    run.add_argument(
        "--args",
        action="append",
        default=[],
        metavar="STAGE=ARGS",
        help="more arguments for a benchmark stage's script, e.g. 'e2e=--graphs products'",
    )
    try:
        return cmd_run(run.parse_args(argv))
    except Ended as e:
        print(f"stage.py: ended by {e}; the step in flight was killed with it", file=sys.stderr)
        return 124


if __name__ == "__main__":
    end_steps_on_signals()
    sys.exit(main())
