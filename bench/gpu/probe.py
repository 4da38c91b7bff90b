"""Probe what NVSHMEM does on this GPU machine, with several PEs sharing one GPU.

    launch/mggrun -np 2 python bench/gpu/probe.py [--out DIR] [--init uid|emulated_mpi|mpi]

Each step is tried on its own and recorded (ok / error with its message):
  0. the job has the size mggrun asked for (else every rank is a singleton);
  1. NVSHMEM init under mpiexec (through mgg.comm.nvshmem.NVSHMEMComm, as mgg runs it);
  2. symmetric arrays;  3. get_peer_array between
  PEs on the same GPU;  4. a RawModule kernel reading a peer through a pointer table;
  5. a kernel built with backend='nvcc', -dc and libnvshmem_device calling
  nvshmemx_float_get_nbi_warp after cumodule_init (its status checked);  6. mgg's own
  get-mode kernel compiled, linked and registered;  then the cleanup (free, finalize).
Every rank appends each step to DIR/probe-np<P>.jsonl the moment it ends, so a hang or
a crash later loses nothing; `bench/gpu/stage.py collect` turns them into
docs/gpu-notes.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

PEER_READ = r"""
extern "C" __global__ void read_peer(const unsigned long long* peers, int pe, float* out,
                                     int n) {
    const float* src = (const float*)peers[pe];
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = src[i];
}
"""

NBI_GET = r"""
#include <nvshmem.h>
#include <nvshmemx.h>
extern "C" __global__ void get_peer(const float* sym, float* out, int n, int pe) {
    __shared__ float stage[256];
    nvshmemx_float_get_nbi_warp(stage, sym, n, pe);
    nvshmem_quiet();
    __syncwarp();
    for (int i = threadIdx.x; i < n; i += 32) out[i] = stage[i];
}
"""


class Recorder:
    """Runs steps and appends each outcome to a JSON-lines file shared by the ranks."""

    def __init__(self, path: Path, rank: int, size: int):
        self.path, self.rank, self.size = path, rank, size
        self.results: list[dict] = []

    def step(self, name: str, fn) -> bool:
        t0 = time.perf_counter()
        try:
            rec = {"step": name, "ok": True, "detail": fn()}
        except Exception as e:  # noqa: BLE001 - the point is to record what fails
            rec = {
                "step": name,
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(limit=4),
            }
        rec.update(rank=self.rank, np=self.size, seconds=round(time.perf_counter() - t0, 3))
        self.results.append(rec)
        line = json.dumps(rec, default=str) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write per record: ranks do not interleave
        finally:
            os.close(fd)
        print(f"[rank {self.rank}] {name}: {'ok' if rec['ok'] else rec['error']}", flush=True)
        return rec["ok"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="uid", choices=["uid", "emulated_mpi", "mpi"])
    ap.add_argument("--out", default=os.environ.get("MGG_GPU_OUT") or ROOT / "bench/results/gpu")
    args = ap.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rec = Recorder(out / f"probe-np{size}.jsonl", rank, size)
    state: dict = {}

    def job_size():
        from mgg.comm.mpi import check_world_size

        asked = os.environ.get("MGG_NP")
        if asked is None:
            raise RuntimeError("not started by mggrun (MGG_NP unset): the size is unchecked")
        check_world_size(size, asked, MPI)
        lib = MPI.Get_library_version().splitlines()[0].strip()
        return {"np": size, "mpi_library": lib, "mpi4py": __import__("mpi4py").__version__}

    def init():  # mgg's own comm: cuda.core Device, UID over mpi4py, heap bookkeeping
        from mgg.comm.nvshmem import NVSHMEMComm

        c = NVSHMEMComm(init_method=args.init)
        state.update(comm=c, cupy=c.cupy, nvshmem=c.nvshmem, dev=c.device_id)
        return {
            "my_pe": int(c.nvshmem.my_pe()),
            "n_pes": int(c.nvshmem.n_pes()),
            "device": c.cupy.cuda.runtime.getDeviceProperties(c.device_id)["name"].decode(),
            "init_method": args.init,
        }

    def symmetric():
        c = state["comm"]
        sym = c.symmetric(1024, 1)
        sym.array[:] = float(rank + 1)
        c.barrier()  # device sync, then MPI
        state["sym"], state["x"] = sym, sym.array
        return {"type": type(sym.array).__module__ + "." + type(sym.array).__name__}

    def peer_array():
        c, cupy = state["comm"], state["cupy"]
        state["peers"] = c.peer_pointers(state["sym"])
        if c.unreachable:
            raise RuntimeError(f"nvshmem_ptr cannot map peers {c.unreachable}")
        if size == 1:
            return {"peers": "none (one PE)"}
        pe = (rank + 1) % size
        val = float(cupy.asnumpy(state["nvshmem"].get_peer_array(state["x"], pe)[:4]).mean())
        if val != pe + 1:
            raise RuntimeError(f"read {val} from pe {pe}, expected {pe + 1}")
        return {"read_from_pe": pe, "value": val}

    def pointer_table_kernel():
        cupy = state["cupy"]
        mod = cupy.RawModule(code=PEER_READ)
        out = cupy.zeros(1024, cupy.float32)
        pe = (rank + 1) % size
        mod.get_function("read_peer")(
            (1,), (256,), (state["peers"], np.int32(pe), out, np.int32(1024))
        )
        cupy.cuda.Device().synchronize()
        got = float(out.mean().get())
        if got != pe + 1:
            raise RuntimeError(f"kernel read {got} from pe {pe}, expected {pe + 1}")
        return {"kernel_read_from_pe": pe, "value": got}

    def nbi_get_kernel():
        from mgg.comm.nvshmem import register_module
        from mgg.kernels.cuda import nvshmem_home

        cupy = state["cupy"]
        home = nvshmem_home()
        if home is None:
            raise RuntimeError("no NVSHMEM headers found (nvidia-nvshmem-cu13 / NVSHMEM_HOME)")
        mod = cupy.RawModule(
            code=NBI_GET,
            backend="nvcc",
            options=("-dc", f"-I{home}/include", f"-L{home}/lib", "-lnvshmem_device"),
        )
        fn = mod.get_function("get_peer")
        register_module(mod)  # raises on a non-zero cumodule_init status
        out = cupy.zeros(256, cupy.float32)
        pe = (rank + 1) % size
        fn((1,), (32,), (state["x"], out, np.int32(256), np.int32(pe)))
        cupy.cuda.Device().synchronize()
        got = float(out.mean().get())
        if got != pe + 1:
            raise RuntimeError(f"nbi get read {got} from pe {pe}, expected {pe + 1}")
        return {"nbi_get_from_pe": pe, "value": got, "nvshmem_home": home}

    def mgg_get_kernel():
        from mgg.kernels.cuda import load_module

        t0 = time.perf_counter()
        for weighted in (False, True):
            load_module(state["dev"], weighted, "get")
        return {"compile_link_register_seconds": round(time.perf_counter() - t0, 2)}

    if not rec.step("0. the job has the size mggrun asked for", job_size):
        return 1
    ok = rec.step("1. NVSHMEM init (NVSHMEMComm) under mpiexec, PEs sharing one GPU", init)
    if ok:
        ok = rec.step("2. symmetric arrays (NVSHMEMComm.symmetric)", symmetric)
    if ok:
        if rec.step("3. get_peer_array between PEs on the same GPU", peer_array):
            rec.step(
                "4. RawModule kernel reading a peer through a pointer table", pointer_table_kernel
            )
        rec.step(
            "5. nvcc -dc kernel with nvshmemx_float_get_nbi_warp after cumodule_init",
            nbi_get_kernel,
        )
        rec.step("6. mgg's get-mode kernel compiles, links and registers", mgg_get_kernel)
    comm.Barrier()
    if "comm" in state:
        rec.step(
            "7. cleanup: free, cumodule_finalize, finalize (mgg.comm's own)",
            lambda: state["comm"].finalize() or "freed, modules released, finalized",
        )
    return 0 if all(r["ok"] for r in rec.results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
