"""The GPU plan: what device windows run, in the order the GPU issue asks for it.

Each step has its GPU command, its toy-size twin for the dry run on CPUs (the same
script, flags and files, so that a Python error, a missing file or a wrong flag shows
here and not in a device window), the seconds it is expected to take on an H100/H200
(until a window has timed it), its limit, and the files besides mgg/ its result depends
on (its fingerprint). Test steps name their tests; on the GPU they must all pass, none
skipped; the dry run collects them, so a renamed test fails here.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from runner import ROOT

PY = sys.executable
RUN = [PY, str(ROOT / "launch" / "mggrun")]
PYTEST = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
BENCH = ("bench/common.py", "bench/gpu/common_gpu.py")
API = f"{PY} bench/gpu/torch_api.py"


@dataclass
class Item:
    """One step of the plan. ``expect``/``dry_expect`` get the last JSON line printed
    (None if none), ``output``/``dry_output`` all of the output; each returns why a run
    that exited 0 still failed, or None."""

    name: str
    about: str
    argv: list[str]
    dry: list[str]
    estimate: float
    timeout: float
    files: tuple[str, ...] = ()
    wheels: bool = False  # needs the carried wheels (MPICH for mggrun and PEs, pymetis)
    expect: object = None
    dry_expect: object = None
    output: object = None
    dry_output: object = None
    tests: list[str] = field(default_factory=list)

    def dry_argv(self, backend: str) -> list[str]:
        """The toy-size command, its --backend (if it takes one) set to ``backend``."""
        argv = list(self.dry)
        for i in range(len(argv) - 1):
            if argv[i] == "--backend":
                argv[i + 1] = backend
        return argv


def pytest_counts(text: str) -> dict[str, int]:
    """{'passed': 3, 'skipped': 1, ...} from pytest's last summary line."""
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
    if not lines:
        return {}
    return {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", lines[-1])}


def all_passed(text: str) -> str | None:
    c = pytest_counts(text)
    if not c.get("passed"):
        return "no test passed (pytest printed no summary of passes)"
    bad = {k: v for k, v in c.items() if k not in ("passed", "warnings", "warning")}
    return f"not every test passed: {bad}" if bad else None


def collected(ids):
    """The dry run's check of a test step: every named test is collected."""

    def check(text: str) -> str | None:
        found = set(re.findall(r"^(tests/\S+?)(?:\[\S*\])?$", text, re.M))
        missing = [t for t in ids if t.split("[")[0] not in found]
        return f"not collected: {missing}" if missing else None

    return check


def tests(name, about, ids, estimate, timeout, wheels=False) -> Item:
    files = sorted({t.split("::")[0] for t in ids} | {"tests/conftest.py"})
    return Item(
        name,
        about,
        [*PYTEST, *ids],
        [*PYTEST, "--collect-only", *ids],
        estimate,
        timeout,
        tuple(files),
        wheels,
        output=all_passed,
        dry_output=collected(ids),
        tests=list(ids),
    )


def bench(name, about, script, args, dry, estimate, timeout, wheels=False, files=()) -> Item:
    path = f"bench/gpu/{script}.py"
    return Item(
        name,
        about,
        [PY, "-u", path, *args],
        [PY, "-u", path, *dry],
        estimate,
        timeout,
        (path, *BENCH, *files),
        wheels,
    )


E2E_DRY = ["--backend", "cpu", "--scale", "0.001", "--epochs", "1"]
PAPERS = ["--scale", "1", "--models", "gcn", "--hidden", "128,64", "--epochs", "3"]
PAPERS_DRY = [
    "--backend",
    "cpu",
    "--scale",
    "0.001",
    "--models",
    "gcn",
    "--hidden",
    "128,64",
    "--epochs",
    "1",
]
FULLSIZE = ["--pes", "1,2,4,8", "--models", "gcn,sage,gin,gat", "--dtypes", "float32,bfloat16"]
FULLSIZE_DRY = ["--scale", "0.001", "--pes", "1", "--models", "gcn", "--dtypes", "bfloat16",
                "--epochs", "1"]  # fmt: skip
# the sources' compile is the compile tests' (tests/test_cuda*.py): --no-compile here
KERNEL_DRY = ["--backend", "cpu", "--nodes", "2000", "--edges", "20000", "--no-compile"]
CUDA, CUDA_BF16 = "tests/test_cuda.py", "tests/test_cuda_bf16.py"
STREAM, OFFLOAD, ROWS = "tests/test_stream.py", "tests/test_offload.py", "tests/test_output_rows.py"


def plan() -> list[Item]:
    """The steps in the GPU issue's order (issue 90's device plan, items 1-6)."""
    steps = [
        Item(
            "api",
            "torch's API on the GPU machine, recorded there, against mgg's uses: what the "
            "CPU test holds the CUDA paths to (bench/gpu/torch_api.py, its 2.11 manifest)",
            [
                "bash",
                "-c",
                f"{API} record --installed -o $MGG_GPU_OUT/installed.json && "
                f"{API} check --manifest $MGG_GPU_OUT/installed.json",
            ],
            ["bash", "-c", f"{API} check"],
            15,
            90,
            ("bench/gpu/torch_api.py",),
        ),
        tests(
            "fixes",
            "the GPU tests that wait for a fix or never passed: GAT's captured step, "
            "streamed bf16 rows and gradients, a streamed job, the offload peak, labeled rows",
            [
                f"{CUDA}::test_a_captured_step_trains_as_the_eager_step_does[gat]",
                f"{STREAM}::test_streamed_rows_on_a_gpu_are_the_held_rows_and_gradients",
                f"{STREAM}::test_a_gpu_job_streams_under_its_device_budget_and_trains_alike",
                f"{OFFLOAD}::test_a_gpu_job_with_activations_on_the_host_trains_alike_and_peaks_lower",
                f"{ROWS}::test_a_gpu_trains_the_labeled_rows_alone_as_the_full_run",
            ],
            90,
            240,
        ),
        tests(
            "pes-rows",
            "two NVSHMEM PEs train the labeled rows alone as the full run",
            [f"{ROWS}::test_two_pes_train_the_labeled_rows_alone_as_the_full_run"],
            60,
            150,
            wheels=True,
        ),
        tests(
            "pes-fp32",
            "float32 NVSHMEM PEs sharing the GPU, p2p and get, equal scipy",
            [f"{CUDA}::test_nvshmem_pes_sharing_the_gpu_equal_scipy"],
            150,
            300,
            wheels=True,
        ),
        tests(
            "pes-bf16",
            "bf16 NVSHMEM PEs sharing the GPU, p2p and get, within one rounding of float64",
            [f"{CUDA_BF16}::test_bf16_nvshmem_pes_are_within_one_rounding_of_float64"],
            130,
            300,
            wheels=True,
        ),
        bench(
            "e2e-0.05",
            "training steps vs PyG at its best, stand-ins at scale 0.05: eager and captured",
            "e2e_vs_pyg",
            ["--scale", "0.05", "--epochs", "15"],
            [*E2E_DRY, "--graphs", "products", "--models", "gcn,gat"],
            100,
            240,
            files=("bench/pyg_models.py",),
        ),
        bench(
            "e2e-0.25a",
            "training steps vs PyG at its best at scale 0.25: products, proteins, orkut",
            "e2e_vs_pyg",
            ["--scale", "0.25", "--graphs", "products,proteins,orkut"],
            [*E2E_DRY, "--graphs", "products,proteins,orkut", "--models", "sage"],
            150,
            330,
            files=("bench/pyg_models.py",),
        ),
        bench(
            "e2e-0.25b",
            "training steps vs PyG at its best at scale 0.25: reddit, enwiki",
            "e2e_vs_pyg",
            ["--scale", "0.25", "--graphs", "reddit,enwiki"],
            [*E2E_DRY, "--graphs", "reddit,enwiki", "--models", "gin"],
            220,
            400,
            files=("bench/pyg_models.py",),
        ),
        bench(
            "kernel",
            "the aggregation kernel, float32 and bf16, D = 16, 64, 128, 256 vs cuSPARSE's "
            "best form; ncu's counters at D = 16 and 128",
            "kernel_ab",
            ["--bf16", "--dims", "16,64,128,256", "--ncu-dims", "16,128"],
            [*KERNEL_DRY, "--bf16", "--dims", "16,64,128,256", "--ncu-dims", "16,128"],
            330,
            500,
        ),
        bench(
            "papers",
            "papers100m at scale 1 on one GPU from memory: GCN, bf16, labeled rows; "
            "generation and partition, first epoch, epoch, peak memory vs the plan",
            "papers_gpu",
            PAPERS,
            PAPERS_DRY,
            420,
            520,
            wheels=True,
        ),
        bench(
            "papers-80g",
            "the same job under --device-memory 80G (an H100's budget: streams, offloads)",
            "papers_gpu",
            [*PAPERS, "--device-memory", "80G"],
            [*PAPERS_DRY, "--device-memory", "1G"],
            450,
            520,
            wheels=True,
        ),
        bench(
            "locality",
            "the kernel on the Reddit-size R-MAT in natural, rcm and metis order: time, "
            "ncu's L1/L2 hit rates",
            "kernel_ab",
            ["--orders", "natural,rcm,metis", "--order-dir", "/tmp/mgg-orders"],
            [*KERNEL_DRY, "--orders", "natural,rcm,metis"],
            400,
            520,
            wheels=True,
        ),
    ]
    for graph in ("reddit", "products", "proteins", "orkut", "enwiki"):
        steps.append(
            bench(
                f"fullsize-{graph}",
                f"the {graph} stand-in at full size, four models, float32 and bf16, "
                "1-8 PEs: epoch and peak memory against the plan",
                "fullsize",
                ["--graph", graph, "--scale", "1", *FULLSIZE],
                ["--backend", "cpu", "--graph", graph, *FULLSIZE_DRY],
                450,
                520,
                wheels=True,
            )
        )
    return steps
