"""MGG's cross-iteration search (§4), for any backend.

    result = search(space, measure)

``space`` orders the candidate values of each knob, e.g. {'ps': [1, 2, 4, ...],
'dist': [...], 'wpb': [...]}; ``measure(config) -> seconds`` runs one real iteration
with that configuration (inf, or an exception, marks it infeasible). Every measurement
goes into a lookup table, so no configuration is run twice.

The walk: start at the first value of every knob (the paper's (1, 1, 1)) or at a given
start; grow ps while the latency falls (from a start inside the space, shrink it when
growing does not help), then dist, then the third knob (wpb); when that
stops helping, step ps back to its second-best value and grow the others again; stop
when no move beats the top three latencies seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class SearchResult:
    best: dict
    best_latency: float
    start: dict
    start_latency: float
    trace: list[dict] = field(default_factory=list)  # {config, latency, phase} in order

    @property
    def measured(self) -> int:
        return len(self.trace)

    def table(self) -> dict[tuple, float]:
        """The lookup table: config values (in knob order) -> latency."""
        return {tuple(t["config"].values()): t["latency"] for t in self.trace}

    def to_json(self) -> dict:
        return {
            "best": self.best,
            "best_latency_s": self.best_latency,
            "start": self.start,
            "start_latency_s": self.start_latency,
            "measured": self.measured,
            "trace": self.trace,
        }


class _Walk:
    def __init__(self, space: dict, measure, max_measurements: int | None):
        self.knobs = list(space)
        self.space = {k: list(v) for k, v in space.items()}
        for k, v in self.space.items():
            if not v:
                raise ValueError(f"knob {k!r} has no candidate values")
        self.measure = measure
        self.max = max_measurements
        self.table: dict[tuple, float] = {}
        self.trace: list[dict] = []

    def config(self, idx: tuple) -> dict:
        return {k: self.space[k][i] for k, i in zip(self.knobs, idx, strict=True)}

    def exhausted(self) -> bool:
        return self.max is not None and len(self.table) >= self.max

    def latency(self, idx: tuple, phase: str) -> float:
        if idx in self.table:
            return self.table[idx]
        if self.exhausted():
            return math.inf
        cfg = self.config(idx)
        try:
            lat = float(self.measure(cfg))
        except (ValueError, RuntimeError, MemoryError):
            lat = math.inf
        if not lat == lat:  # NaN
            lat = math.inf
        self.table[idx] = lat
        self.trace.append({"config": cfg, "latency": lat, "phase": phase})
        return lat

    def top3(self) -> float:
        vals = sorted(self.table.values())
        return vals[min(2, len(vals) - 1)]

    def best(self) -> tuple:
        return min(self.table, key=self.table.get)

    def grow(self, idx: tuple, knob: int, phase: str) -> tuple:
        """Step one knob up while the latency falls; if the first step up does not help
        (or there is none), step down instead. Return where it stopped."""
        cur = self.latency(idx, phase)
        moved = False
        for step in (1, -1):
            while (
                0 <= idx[knob] + step < len(self.space[self.knobs[knob]]) and not self.exhausted()
            ):
                nxt = idx[:knob] + (idx[knob] + step,) + idx[knob + 1 :]
                lat = self.latency(nxt, phase)
                if not lat < cur:
                    break
                idx, cur, moved = nxt, lat, True
            if moved:
                break
        return idx


def search(
    space: dict, measure, *, start: dict | None = None, max_measurements: int | None = None
) -> SearchResult:
    """Cross-iteration search over ``space`` (knobs in order: ps, dist, then the third)."""
    w = _Walk(space, measure, max_measurements)
    if start is None:
        idx = (0,) * len(w.knobs)
    else:
        idx = tuple(w.space[k].index(start[k]) for k in w.knobs)
    start_lat = w.latency(idx, "start")
    start_idx = idx
    if not math.isfinite(start_lat) and any(idx):  # an infeasible start: the paper's
        idx = (0,) * len(w.knobs)
        w.latency(idx, "start")
    # 1-2: grow ps, then dist, then the third knob
    for k in range(len(w.knobs)):
        idx = w.grow(idx, k, f"grow {w.knobs[k]}")
    # 3: step ps back to its second-best value and grow the other knobs again, as long
    # as the moves beat the top three latencies seen
    by_ps: dict[int, float] = {}
    for t_idx, lat in w.table.items():
        by_ps[t_idx[0]] = min(lat, by_ps.get(t_idx[0], math.inf))
    ranked = sorted(by_ps, key=by_ps.get)
    if len(ranked) > 1 and math.isfinite(by_ps[ranked[1]]):
        retry = (ranked[1],) + w.best()[1:]
        bar = w.top3()
        if w.latency(retry, "retry ps") < bar:
            for k in range(1, len(w.knobs)):
                retry = w.grow(retry, k, "retry ps")
    b = w.best()
    return SearchResult(w.config(b), w.table[b], w.config(start_idx), start_lat, w.trace)


def exhaustive(space: dict, measure) -> SearchResult:
    """Measure every configuration (to judge the search)."""
    w = _Walk(space, measure, None)
    sizes = [len(w.space[k]) for k in w.knobs]

    def rec(prefix):
        if len(prefix) == len(sizes):
            w.latency(tuple(prefix), "exhaustive")
            return
        for i in range(sizes[len(prefix)]):
            rec(prefix + [i])

    rec([])
    b = w.best()
    first = (0,) * len(sizes)
    return SearchResult(w.config(b), w.table[b], w.config(first), w.table[first], w.trace)


def model_guess(ranked: list) -> dict:
    """The model's best feasible configuration (from model.rank_configs), no measurement."""
    for cfg, est in ranked:
        if est.feasible:
            return cfg
    raise ValueError("no feasible configuration in the space")
