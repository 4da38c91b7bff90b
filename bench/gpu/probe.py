"""Probe what NVSHMEM does on this GPU machine, with several PEs sharing one GPU.

    launch/mggrun -np 2 python bench/gpu/probe.py [--init uid|emulated_mpi|mpi]

Each step is tried on its own and recorded (ok / error with its message):
  1. nvshmem4py init under mpiexec;  2. symmetric arrays;  3. get_peer_array between
  PEs on the same GPU;  4. a RawModule kernel reading a peer through a pointer table;
  5. a kernel built with backend='nvcc', -dc and libnvshmem_device calling
  nvshmemx_float_get_nbi_warp after cumodule_init.
Rank 0 writes bench/results/gpu/probe.json and docs/gpu-notes.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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


def step(results, name, fn):
    t0 = time.perf_counter()
    try:
        detail = fn()
        results.append(
            {"step": name, "ok": True, "detail": detail, "seconds": time.perf_counter() - t0}
        )
        return True
    except Exception as e:  # noqa: BLE001 - the point is to record what fails
        results.append(
            {
                "step": name,
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(limit=4),
                "seconds": time.perf_counter() - t0,
            }
        )
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", default="uid", choices=["uid", "emulated_mpi", "mpi"])
    args = ap.parse_args()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    results: list[dict] = []
    state: dict = {}

    def init():
        import cupy
        import nvshmem.core as nvshmem
        from cuda.core.experimental import Device

        dev_id = int(os.environ.get("MGG_DEVICE", 0))
        cupy.cuda.Device(dev_id).use()
        dev = Device(dev_id)
        dev.set_current()
        if args.init == "uid":
            uid = nvshmem.get_unique_id(empty=rank != 0)
            comm.Bcast(uid._data.view(np.int8), root=0)
            nvshmem.init(device=dev, uid=uid, rank=rank, nranks=size, initializer_method="uid")
        else:
            nvshmem.init(device=dev, mpi_comm=comm, initializer_method=args.init)
        state.update(nvshmem=nvshmem, cupy=cupy, dev=dev_id)
        return {
            "my_pe": int(nvshmem.my_pe()),
            "n_pes": int(nvshmem.n_pes()),
            "device": cupy.cuda.runtime.getDeviceProperties(dev_id)["name"].decode(),
            "init_method": args.init,
        }

    def symmetric():
        cupy, nvshmem = state["cupy"], state["nvshmem"]
        x = nvshmem.array((1024,), dtype="float32")
        x[:] = float(rank + 1)
        cupy.cuda.Device().synchronize()
        comm.Barrier()
        state["x"] = x
        return {"type": type(x).__module__ + "." + type(x).__name__, "ptr": int(x.data.ptr)}

    def peer_array():
        cupy, nvshmem = state["cupy"], state["nvshmem"]
        pe = (rank + 1) % size
        peer = nvshmem.get_peer_array(state["x"], pe)
        if peer is None:
            raise RuntimeError(f"get_peer_array returned None for pe {pe}")
        val = float(cupy.asnumpy(peer[:4]).mean())
        if val != pe + 1:
            raise RuntimeError(f"read {val} from pe {pe}, expected {pe + 1}")
        state["peers"] = cupy.asarray(
            np.array(
                [
                    state["x"].data.ptr
                    if p == rank
                    else nvshmem.get_peer_array(state["x"], p).data.ptr
                    for p in range(size)
                ],
                np.uint64,
            )
        )
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
        cupy = state["cupy"]
        import nvshmem.bindings

        from mgg.kernels.cuda import nvshmem_home

        home = nvshmem_home()
        if home is None:
            raise RuntimeError("no NVSHMEM headers found (nvidia-nvshmem-cu13 / NVSHMEM_HOME)")
        mod = cupy.RawModule(
            code=NBI_GET,
            backend="nvcc",
            options=("-dc", f"-I{home}/include", f"-L{home}/lib", "-lnvshmem_device"),
        )
        fn = mod.get_function("get_peer")
        nvshmem.bindings.cumodule_init(mod.module.ptr)
        out = cupy.zeros(256, cupy.float32)
        pe = (rank + 1) % size
        fn((1,), (32,), (state["x"], out, np.int32(256), np.int32(pe)))
        cupy.cuda.Device().synchronize()
        got = float(out.mean().get())
        if got != pe + 1:
            raise RuntimeError(f"nbi get read {got} from pe {pe}, expected {pe + 1}")
        return {"nbi_get_from_pe": pe, "value": got, "nvshmem_home": home}

    ok = step(results, "1. nvshmem4py init under mpiexec, PEs sharing one GPU", init)
    if ok:
        ok = step(results, "2. symmetric arrays (nvshmem.core.array)", symmetric)
    if ok:
        if step(results, "3. get_peer_array between PEs on the same GPU", peer_array):
            step(
                results,
                "4. RawModule kernel reading a peer through a pointer table",
                pointer_table_kernel,
            )
        step(
            results,
            "5. nvcc -dc kernel with nvshmemx_float_get_nbi_warp after cumodule_init",
            nbi_get_kernel,
        )
    all_results = comm.gather(results, root=0)
    if "nvshmem" in state:
        try:
            state["cupy"].cuda.Device().synchronize()
            comm.Barrier()
            if "x" in state:
                state["nvshmem"].free_array(state["x"])
            state["nvshmem"].finalize()
        except Exception as e:  # noqa: BLE001
            results.append({"step": "finalize", "ok": False, "error": repr(e)})
    if rank == 0:
        write(all_results, size, args.init)


def write(all_results, size, init):
    out = ROOT / "bench" / "results" / "gpu"
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "np": size,
        "init": init,
        "host": platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "ranks": all_results,
    }
    (out / "probe.json").write_text(json.dumps(payload, indent=1))
    lines = [
        "# GPU notes: what NVSHMEM does on the GPU machine",
        "",
        f"Generated by `launch/mggrun -np {size} python bench/gpu/probe.py --init {init}` "
        f"on {payload['date']} ({payload['host']}). Raw: "
        "`bench/results/gpu/probe.json`.",
        "",
        "| step | rank 0 | all ranks | detail or error |",
        "|---|---|---|---|",
    ]
    for i, r0 in enumerate(all_results[0]):
        ok_all = all(len(r) > i and r[i]["ok"] for r in all_results)
        detail = json.dumps(r0.get("detail")) if r0["ok"] else r0.get("error", "")
        lines.append(
            f"| {r0['step']} | {'ok' if r0['ok'] else 'FAILS'} | "
            f"{'ok' if ok_all else 'FAILS'} | {detail} |"
        )
    lines += ["", "The design follows these results: see docs/runtime.md, 'GPU backend'."]
    (ROOT / "docs" / "gpu-notes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
