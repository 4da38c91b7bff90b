"""What one training step costs the host, the same way for mgg and its peers: wall time,
the torch calls and ATen ops it dispatches, its autograd nodes, and how much of it is
spent in Python rather than in compiled code (kernels: numba's, torch's, numpy's)."""

from __future__ import annotations

import collections
import cProfile
import pstats
import sys
import time
import warnings

import numpy as np

# cProfile's entries for calls into compiled code: torch's and numpy's builtins (the
# autograd engine's run_backward included: its own time is C++), scipy's sparsetools
NATIVE = ("torch", "numpy", "scipy", "_sparsetools", "_fused", "run_backward", "dgl")


def time_steps(step, n: int, warmup: int = 3) -> list[float]:
    """Seconds of each of ``n`` calls of ``step()`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def dispatch_counts(step) -> dict:
    """One ``step()`` under torch's function and dispatch modes: {"torch_calls": the
    Python-level torch API calls (attribute reads left out), "aten_ops": the ATen ops
    that reached the dispatcher, backward and optimizer included}."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = collections.Counter()

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") not in ("__get__", "__set__"):
                counts["torch_calls"] += 1
            return func(*args, **(kwargs or {}))

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts["aten_ops"] += 1
            return func(*args, **(kwargs or {}))

    with Calls(), Ops():
        step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {"torch_calls": counts["torch_calls"], "aten_ops": counts["aten_ops"]}


def autograd_nodes(loss) -> int:
    """The nodes of the autograd graph that ``loss`` (a tensor) backpropagates through."""
    seen, stack = set(), [loss.grad_fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        stack += [g for g, _ in f.next_functions]
    return len(seen)


def _kernel_codes() -> set:
    """(file, line, name) of every numba-compiled function loaded: cProfile files their
    calls under their Python function's code."""
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:
        return set()
    codes = set()
    with warnings.catch_warnings():  # isinstance on a deprecated alias (torch's) warns
        warnings.simplefilter("ignore")
        for mod in list(sys.modules.values()):
            for obj in list(getattr(mod, "__dict__", {}).values()):
                if isinstance(obj, CPUDispatcher):
                    c = obj.py_func.__code__
                    codes.add((c.co_filename, c.co_firstlineno, c.co_name))
    return codes


def profile_steps(step, n: int) -> dict:
    """``n`` calls of ``step()`` under cProfile: per step, {"native_ms": the time in
    compiled code (numba kernels, torch's, numpy's and scipy's builtins), "kernel_calls":
    numba kernel calls, "python_calls": Python function calls}."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    prof.disable()
    kernels = _kernel_codes()
    native = numba_calls = py_calls = 0.0
    for (file, line, name), (_, ncalls, tottime, _, _) in pstats.Stats(prof).stats.items():
        if (file, line, name) in kernels:
            native += tottime
            numba_calls += ncalls
        elif file == "~":
            if any(word in name for word in NATIVE):
                native += tottime
        else:
            py_calls += ncalls
    return {
        "native_ms": native / n * 1e3,
        "kernel_calls": numba_calls / n,
        "python_calls": py_calls / n,
    }


GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_sparse_addmm")


def aten_split(step, n: int) -> dict:
    """``n`` calls of ``step()`` under torch's profiler: per step, {"gemm_ms": the ATen
    matrix products' own time, "aten_ms": every ATen op's own time, "profiled_ms": the
    profiled step (the profiler's overhead in it)}."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        wall = time.perf_counter() - t0
    ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    gemm = sum(e.self_cpu_time_total for e in ops if e.key in GEMMS)
    aten = sum(e.self_cpu_time_total for e in ops)
    return {"gemm_ms": gemm / n / 1e3, "aten_ms": aten / n / 1e3, "profiled_ms": wall / n * 1e3}


def step_report(step, forward_loss, n: int) -> dict:
    """Everything above for ``step`` (one training step) and ``forward_loss()`` (the
    step's loss, its graph kept): the median step, the Python share (the median step less
    the profiled native time), counts and autograd nodes."""
    times = time_steps(step, n)
    counts = dispatch_counts(step)
    nodes = autograd_nodes(forward_loss())
    prof = profile_steps(step, max(5, n // 2))
    wall = float(np.median(times)) * 1e3
    return {
        "step_ms": wall,
        "python_ms": max(0.0, wall - prof["native_ms"]),
        **prof,
        **counts,
        "autograd_nodes": nodes,
    }
