"""The GPU machine's environment, set up as docs/gpu-notes.md says: nvshmem4py and mpi4py
installed from .whl/ into /tmp/mgg-site, the mpich wheel unzipped (pip --target would drop
its lib/), PATH, LD_LIBRARY_PATH and MGG_MPIEXEC pointed at it, and a 2-rank mpiexec
proving that launcher and library agree. Anything missing is a SetupError saying what."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from runner import ROOT, STEP_ENV

WHEELS = ("nvshmem4py", "mpi4py", "mpich")  # distributions (nvshmem4py_cu13 is one)
SITE = Path("/tmp/mgg-site")
MPICH = Path("/tmp/mgg-mpich")


class SetupError(RuntimeError):
    """The GPU machine lacks something a stage needs."""


def find_wheels(folder: Path) -> dict[str, Path]:
    """The nvshmem4py, mpi4py and mpich wheels in folder: exactly one of each."""
    if not folder.is_dir():
        raise SetupError(
            f"{folder} does not exist: run bench/gpu/fetch_wheels.sh here and carry .whl"
        )
    found = {}
    for prefix in WHEELS:
        hits = sorted(
            p
            for p in folder.glob("*.whl")
            if p.name.split("-")[0] in (prefix, f"{prefix}_cu13", f"{prefix}_cu12")
        )
        if len(hits) != 1:
            have = ", ".join(sorted(p.name for p in folder.glob("*.whl"))) or "no wheels"
            raise SetupError(
                f"{folder} needs exactly one {prefix} wheel, found {len(hits)} (it holds: {have})"
            )
        found[prefix] = hits[0]
    return found


def unzip_keeping_modes(wheel: Path, dest: Path) -> None:
    """Extract a wheel with its files' permission bits (zipfile drops them: mpiexec
    would not be executable)."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = Path(z.extract(info, dest))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode)


def mpich_prefix(root: Path) -> Path:
    """The unzipped mpich wheel's install prefix (…/mpich-X.data/data)."""
    hits = sorted(root.glob("mpich-*.data/data"))
    if not hits or not (hits[0] / "bin" / "mpiexec").exists():
        raise SetupError(f"no mpich-*.data/data/bin/mpiexec under {root}")
    return hits[0]


def environment(base: dict, site: Path, mpich: Path, out: Path) -> dict:
    """The variables every step runs with: carried packages first on PYTHONPATH, the
    wheel's MPICH on PATH and LD_LIBRARY_PATH, and as mggrun's launcher."""
    env = dict(base)

    def front(var, value):
        env[var] = value + (os.pathsep + env[var] if env.get(var) else "")

    front("PYTHONPATH", f"{site}{os.pathsep}{ROOT}")
    front("PATH", str(mpich / "bin"))
    front("LD_LIBRARY_PATH", str(mpich / "lib"))
    env.update(
        MGG_MPIEXEC=str(mpich / "bin" / "mpiexec"),
        NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME="lo",
        MGG_GPU_OUT=str(out),
        **STEP_ENV,
    )
    return env


VERSIONS = r"""
import json, importlib.metadata as md
v = {}
def dist(*names):
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            pass
    return None
import cupy
rt = cupy.cuda.runtime
v["device"] = rt.getDeviceProperties(0)["name"].decode()
v["driver"] = rt.driverGetVersion()
v["cuda_runtime"] = rt.runtimeGetVersion()
v["cupy"] = cupy.__version__
v["cuda-core"] = dist("cuda-core", "cuda_core")
v["cuda-bindings"] = dist("cuda-bindings", "cuda_bindings")
v["nvidia-nvshmem"] = dist("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12")
v["nvshmem4py"] = dist("nvshmem4py-cu13", "nvshmem4py-cu12")
v["mpi4py"] = dist("mpi4py")
v["numba"] = dist("numba")
v["torch"] = dist("torch")
import nvshmem.core  # needs cuda.core >= 0.5
from mgg.comm.nvshmem import cuda_device
v["cuda_device_class"] = cuda_device(0).__class__.__module__
print(json.dumps(v))
"""

PREFLIGHT = (
    "from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "assert c.Get_size() == 2, f'world of {c.Get_size()}, not 2'; "
    "c.Get_rank() or print(MPI.Get_library_version().splitlines()[0])"
)


def setup(wheels: Path, out: Path, say) -> tuple[dict, dict]:
    """Install and check everything (see the module docstring); (env, versions)."""
    py = sys.executable
    found = find_wheels(wheels)
    extra = sorted((wheels / "extra").glob("*.whl"))  # what a step needs besides: pymetis
    if not (SITE / ".done").exists():
        r = subprocess.run(
            [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
            + ["--target", str(SITE), str(found["nvshmem4py"]), str(found["mpi4py"])]
            + [str(w) for w in extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode:
            raise SetupError(f"pip install of the carried wheels failed: {r.stderr[-1500:]}")
        (SITE / ".done").write_text("")
    fallback = sorted((wheels / "fallback").glob("*.whl"))
    if not (MPICH / ".done").exists():
        unzip_keeping_modes(found["mpich"], MPICH)
        (MPICH / ".done").write_text("")
    env = environment(os.environ, SITE, mpich_prefix(MPICH), out)

    def versions():
        return subprocess.run(
            [py, "-c", VERSIONS], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT
        )

    r = versions()
    if r.returncode and fallback:  # the image's cuda-core may predate what nvshmem4py needs
        say(f"nvshmem4py does not import with the image's packages; adding {fallback}")
        subprocess.run(
            [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
            + ["--target", str(SITE), "--upgrade", *map(str, fallback)],
            check=True,
            timeout=120,
        )
        r = versions()
    if r.returncode:
        raise SetupError(f"the GPU packages do not import: {r.stderr.strip()[-1500:]}")
    ver = json.loads(r.stdout.strip().splitlines()[-1])
    mpiexec = env["MGG_MPIEXEC"]
    r = subprocess.run(
        [mpiexec, "-n", "2", py, "-c", PREFLIGHT],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if r.returncode:
        raise SetupError(
            f"{mpiexec} -n 2 did not give a world of 2 (mpi4py bound to another MPI?): "
            f"{(r.stdout + r.stderr).strip()[-1500:]}"
        )
    ver["mpi_library"] = r.stdout.strip().splitlines()[-1]
    return env, ver
