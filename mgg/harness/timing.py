"""Timing a collective call, one protocol for everything that times one (``mgg check``,
``mgg tune``, the Trainer's tuning, bench/): every rank enters each call together
(barrier), the device is synchronized before the clock stops, and a call's time is the
slowest rank's, so every rank sees the same numbers and takes the same decisions."""

from __future__ import annotations

import time

import numpy as np


def slowest(comm, seconds) -> np.ndarray:
    """Per call, the slowest rank's seconds (collective)."""
    seconds = np.asarray(seconds, np.float64)
    return seconds if comm is None or comm.size == 1 else comm.allreduce(seconds, "max")


def time_round_robin(calls: dict, comm=None, repeat: int = 5, sync=None) -> dict:
    """{name: [seconds per repeat]}: every call timed ``repeat`` times, round-robin so
    that they share the machine's noise, each round starting one call further on (a call
    after one that thrashes the caches, as direct gets do, is slower); collective."""
    times = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeat if names else 0):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn = calls[name]
            if comm is not None:
                comm.barrier()
            t0 = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            times[name].append(time.perf_counter() - t0)
    return {name: slowest(comm, t).tolist() for name, t in times.items()}


def fresh_sample(build, warm, call, cfg: dict):
    """One sample of configuration ``cfg`` on a design built for it alone: ``build(cfg)``
    (entered if it is a context manager), ``warm(design)`` untimed, then the seconds of
    ``call(design)``. A design's speed varies from one allocation to the next (up to 15%
    between builds on a busy CPU against 2% between calls of one build), so every sample
    is of a new one and the medians average over allocations too."""
    design = build(cfg)
    ctx = hasattr(design, "__enter__")
    if ctx:
        design.__enter__()
    try:
        warm(design)
        return call(design)
    finally:
        if ctx:
            design.__exit__(None, None, None)
