"""MGG's cross-iteration search (§4), made to hold on a noisy machine; for any backend.

    result = search(space, measure, model=predicted)

``space`` orders the candidate values of each knob, e.g. {'ps': [1, 2, 4, ...],
'dist': [...], 'wpb' or 'threads': [...]}; ``measure(config) -> seconds`` times one real
iteration with that configuration (inf, NaN or an exception marks it infeasible);
``model`` (optional) maps a configuration's values, in knob order, to the analytical
model's latency (inf: infeasible): it picks the start and orders the moves.

One protocol (``mgg tune``, ``mgg train --tune``, the CPU and the GPU):

- A configuration is sampled until the ~90% interval of its median (order statistics,
  no assumption on the noise) lies within ``rel_error`` of it, between ``min_samples``
  and ``max_samples`` samples.
- Two configurations are compared by sampling them round-robin, so that they share the
  machine's drift, until their intervals separate, both are precise, or both are capped;
  the lower median wins.
- The walk: from the start, try the neighbours (one knob one step) in the model's order;
  on a win keep stepping that way (past a tie, one step further), then scan the new
  point's neighbours; when no single-knob move wins, try two knobs traded in opposite
  directions; stop when none wins. At most ``max_configs`` configurations are measured
  (repeats count once), at most ``budget`` samples in all; a new one only while the
  budget leaves room to judge it, so the pick always rests on a median.
- The choice: the ``contenders`` best medians, each settled, re-measured round-robin
  ``final_rounds`` more times and on while the two best cannot be told apart; the lowest
  median wins. Its confidence is the bootstrap probability that its median is within
  ``tolerance`` of the best contender's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Protocol:
    """How much measuring a decision rests on (defaults: ``mgg tune``'s)."""

    rel_error: float = 0.03  # target half-width of a median's interval, relative
    min_samples: int = 3
    max_samples: int = 12  # per configuration, before the final round
    max_configs: int = 15  # distinct configurations the walk may measure
    budget: int | None = None  # most samples in all (a training run's epochs)
    contenders: int = 3
    final_rounds: int = 3
    tolerance: float = 0.05

    def __post_init__(self):
        if not 0 < self.rel_error < 1:
            raise ValueError(f"rel_error must be in (0, 1), got {self.rel_error}")
        if not 1 <= self.min_samples <= self.max_samples:
            raise ValueError(
                f"need 1 <= min_samples <= max_samples, got {self.min_samples}, {self.max_samples}"
            )
        if self.max_configs < 1 or (self.budget is not None and self.budget < 1):
            raise ValueError("max_configs and budget must be >= 1")


def median_interval(samples, alpha: float = 0.1) -> tuple[float, float]:
    """Distribution-free interval for the median of ``samples``: order statistics
    (x_(j), x_(n+1-j)) with the largest j whose two-sided binomial tail is <= alpha
    (the whole range when n is too small for that)."""
    x = sorted(samples)
    n = len(x)
    j, cdf = 0, 0.0
    while j < n // 2:
        cdf += math.comb(n, j) / 2**n  # P(Bin(n, 1/2) <= j)
        if 2 * cdf > alpha:
            break
        j += 1
    j = max(j, 1)
    return x[j - 1], x[n - j]


@dataclass
class SearchResult:
    best: dict
    best_latency: float  # median seconds
    start: dict
    start_latency: float
    trace: list[dict] = field(default_factory=list)  # per config, in the order first measured
    samples: int = 0  # every sample taken
    noise: float = 0.0  # median over configs of (median absolute deviation / median)
    confidence: float = 1.0  # P(best within tolerance of the best contender), bootstrap
    final: list[dict] = field(default_factory=list)  # the contenders re-measured

    @property
    def measured(self) -> int:
        return len(self.trace)

    def table(self) -> dict[tuple, float]:
        """Config values (in knob order) -> median latency."""
        return {tuple(t["config"].values()): t["latency"] for t in self.trace}

    def to_json(self) -> dict:
        return {
            "best": self.best,
            "best_latency_s": self.best_latency,
            "start": self.start,
            "start_latency_s": self.start_latency,
            "measured": self.measured,
            "samples": self.samples,
            "noise": self.noise,
            "confidence": self.confidence,
            "final": self.final,
            "trace": self.trace,
        }


class Samples:
    """Every sample taken, per configuration (key: its values in knob order)."""

    def __init__(self, space: dict, measure, protocol: Protocol):
        self.knobs = list(space)
        self.space = {k: list(v) for k, v in space.items()}
        for k, v in self.space.items():
            if not v:
                raise ValueError(f"knob {k!r} has no candidate values")
        self.measure, self.p = measure, protocol
        self.times: dict[tuple, list[float]] = {}  # insertion order: first measured
        self.phase: dict[tuple, str] = {}
        self.taken = 0

    def config(self, idx: tuple) -> dict:
        return {k: self.space[k][i] for k, i in zip(self.knobs, idx, strict=True)}

    def inside(self, idx) -> bool:
        """Is ``idx`` a configuration of the space (every index in range)?"""
        return all(0 <= i < len(self.space[k]) for i, k in zip(idx, self.knobs, strict=True))

    def n(self, idx) -> int:
        return len(self.times.get(idx, ()))

    def failed(self, idx) -> bool:
        return any(not math.isfinite(t) for t in self.times.get(idx, ()))

    def median(self, idx) -> float:
        t = self.times.get(idx)
        return math.inf if not t or self.failed(idx) else float(np.median(t))

    def precise(self, idx) -> bool:
        lo, hi = median_interval(self.times[idx])
        return hi - lo <= 2 * self.p.rel_error * self.median(idx)

    def settled(self, idx) -> bool:
        n = self.n(idx)
        return (
            self.failed(idx)
            or n >= self.p.max_samples
            or (n >= self.p.min_samples and self.precise(idx))
        )

    def left(self) -> float:
        """Samples the budget has left (inf without one)."""
        return math.inf if self.p.budget is None else self.p.budget - self.taken

    def can_sample(self) -> bool:
        return self.left() > 0

    def can_open(self, idx) -> bool:
        """May ``idx`` be sampled: measured already, or room for one more config and for
        the round-robin comparison that judges it (``min_samples`` of it and of the other)."""
        if idx in self.times:
            return self.can_sample()
        return len(self.times) < self.p.max_configs and self.left() >= 2 * self.p.min_samples

    def take(self, idx, phase: str) -> None:
        cfg = self.config(idx)
        try:
            t = float(self.measure(cfg))
        except (ValueError, RuntimeError, MemoryError):
            t = math.inf
        if not t >= 0 or t == math.inf:  # NaN, negative, inf: infeasible
            t = math.inf
        self.times.setdefault(idx, []).append(t)
        self.phase.setdefault(idx, phase)
        self.taken += 1

    def settle(self, idx, phase: str) -> None:
        while not self.settled(idx) and self.can_sample():
            self.take(idx, phase)

    def apart(self, a: tuple, b: tuple) -> bool:
        """Do the medians' intervals of ``a`` and ``b`` not overlap (or one failed)?"""
        if not (self.n(a) and self.n(b)):
            return False
        if self.failed(a) or self.failed(b):
            return True
        (la, ha), (lb, hb) = median_interval(self.times[a]), median_interval(self.times[b])
        return hb < la or ha < lb

    def better(self, a: tuple, b: tuple, phase: str) -> bool:
        """Is ``b`` faster than ``a``? Sampled round-robin until decided."""
        p = self.p
        if self.failed(a):  # anything that runs beats what does not
            self.settle(b, phase)
            return self.n(b) > 0 and not self.failed(b)
        while self.can_sample() and not self.failed(a) and not self.failed(b):
            na, nb = self.n(a), self.n(b)
            if min(na, nb) >= p.min_samples:
                if self.apart(a, b) or (self.precise(a) and self.precise(b)):
                    break
                if na >= p.max_samples and nb >= p.max_samples:
                    break
            for k in (a, b):
                if self.n(k) < p.max_samples and self.can_sample():
                    self.take(k, phase)
        return self.median(b) < self.median(a)

    def spread(self, idx) -> float:
        t = np.asarray(self.times[idx])
        med = np.median(t)
        return float(np.median(np.abs(t - med)) / med) if np.isfinite(med) and med > 0 else 0.0

    def result(self, best: tuple, start: tuple, final: list[tuple]) -> SearchResult:
        trace = [
            {
                "config": self.config(k),
                "latency": self.median(k),
                "samples": len(t),
                "spread": self.spread(k),
                "phase": self.phase[k],
            }
            for k, t in self.times.items()
        ]
        spreads = [self.spread(k) for k in self.times if not self.failed(k) and self.n(k) > 1]
        return SearchResult(
            self.config(best),
            self.median(best),
            self.config(start),
            self.median(start),
            trace,
            self.taken,
            float(np.median(spreads)) if spreads else 0.0,
            self.confidence(best, final),
            [
                {"config": self.config(k), "latency": self.median(k), "samples": self.n(k)}
                for k in final
            ],
        )

    def confidence(self, best: tuple, final: list[tuple], draws: int = 1000) -> float:
        """Bootstrap P(median of ``best`` <= (1 + tolerance) x the lowest contender median);
        seeded, so every rank computes the same number."""
        live = [k for k in final if not self.failed(k)]
        if best not in live or len(live) < 2:
            return 1.0 if best in live else 0.0
        rng = np.random.default_rng(0)
        meds = np.stack(
            [
                np.median(rng.choice(self.times[k], (draws, len(self.times[k]))), axis=1)
                for k in live
            ]
        )
        ok = meds[live.index(best)] <= (1 + self.p.tolerance) * meds.min(axis=0)
        return float(ok.mean())


def _predicted(s: Samples, model: dict, idx: tuple) -> float:
    return model.get(tuple(s.config(idx).values()), math.inf)


def _moves(s: Samples, cur: tuple, model, after: int = -1, diagonal: bool = False):
    """The neighbours of ``cur``: one knob one step or, with ``diagonal``, two knobs one
    step each in opposite directions (a trade along a constraint such as ps x wpb in
    shared memory). In the model's order (lowest predicted latency first; infeasible
    ones dropped) or, without a model, knob by knob from the one after knob ``after``
    (the last moved), up before down."""
    n = len(s.knobs)
    order = [(after + 1 + j) % n for j in range(n)]
    steps = []
    for a, k in enumerate(order):
        if not diagonal:
            steps += [{k: 1}, {k: -1}]
        else:
            steps += [{k: d, j: -d} for j in order[a + 1 :] for d in (1, -1)]
    out = []
    for st in steps:
        nxt = tuple(c + st.get(k, 0) for k, c in enumerate(cur))
        if s.inside(nxt):
            out.append(nxt)
    if model is None:
        return out
    pred = {m: _predicted(s, model, m) for m in out}
    return sorted((m for m in out if math.isfinite(pred[m])), key=pred.get)


def search(
    space: dict,
    measure,
    *,
    start: dict | None = None,
    model: dict | None = None,
    protocol: Protocol | None = None,
) -> SearchResult:
    """The noise-aware walk over ``space`` (see the module docstring).

    start   a configuration; default the model's best feasible one, else the paper's
            (1, 1, 1) (the first value of every knob)
    model   {config values in knob order: predicted seconds (inf: infeasible)}
    """
    s = Samples(space, measure, protocol or Protocol())
    origin = (0,) * len(s.knobs)
    if start is not None:
        cur = tuple(s.space[k].index(start[k]) for k in s.knobs)
    elif model:
        feasible = [m for m in _grid(s) if math.isfinite(_predicted(s, model, m))]
        cur = min(feasible, key=lambda m: _predicted(s, model, m), default=origin)
    else:
        cur = origin
    first = cur
    s.settle(cur, "start")
    if s.failed(cur) and cur != origin:  # an infeasible start: the paper's
        cur = origin
        s.settle(cur, "start")
    compared: set[frozenset] = set()
    last = -1
    while s.can_sample():
        moved = False
        for nxt in _moves(s, cur, model, last) + _moves(s, cur, model, last, diagonal=True):
            pair = frozenset((cur, nxt))
            if pair in compared or not s.can_open(nxt):
                continue
            compared.add(pair)
            changed = [k for k in range(len(cur)) if cur[k] != nxt[k]]
            phase = "move " + "+".join(s.knobs[k] for k in changed)
            if s.better(cur, nxt, phase):
                last = changed[0]
                step = tuple(b - a for a, b in zip(cur, nxt, strict=True))
                cur = _line(s, nxt, step, compared, phase)
                moved = True
                break
        if not moved:
            break
    final = _final(s)
    best = min(final, key=s.median) if final else cur
    return s.result(best, first, final)


def _line(s: Samples, cur: tuple, step: tuple, compared: set, phase: str) -> tuple:
    """Keep stepping ``step`` from ``cur`` while it wins; past a step too close to call
    (a tie in the noise), look one step further before stopping."""
    while True:
        for hop in (1, 2):
            ahead = tuple(c + hop * d for c, d in zip(cur, step, strict=True))
            if not s.inside(ahead):
                return cur
            pair = frozenset((cur, ahead))
            if pair in compared or not s.can_open(ahead):
                return cur
            compared.add(pair)
            if s.better(cur, ahead, phase):
                cur = ahead
                break
            if s.apart(cur, ahead):
                return cur
        else:
            return cur


def _final(s: Samples) -> list[tuple]:
    """The contenders: the best medians, each sampled (round-robin) until settled, the
    ranking redone until its top is settled, then ``final_rounds`` more rounds."""
    while True:
        final = sorted((k for k in s.times if not s.failed(k)), key=s.median)[: s.p.contenders]
        unsettled = [k for k in final if not s.settled(k)]
        if not unsettled or not s.can_sample():
            break
        for k in unsettled:
            if s.can_sample():
                s.take(k, s.phase[k])
    rounds = 0
    while len(final) > 1 and s.can_sample() and rounds < 2 * s.p.max_samples:
        if rounds >= s.p.final_rounds:  # then on while the two best are not told apart
            a, b = sorted(final, key=s.median)[:2]
            if s.apart(a, b) or (s.precise(a) and s.precise(b)):
                break
        for k in final:
            if s.can_sample():
                s.take(k, s.phase[k])
        rounds += 1
    return final


def _grid(s: Samples) -> list[tuple]:
    sizes = [len(s.space[k]) for k in s.knobs]
    return [tuple(int(i) for i in idx) for idx in np.ndindex(*sizes)]


def exhaustive(space: dict, measure, rounds: int = 1) -> SearchResult:
    """Every configuration measured on its own, ``rounds`` times round-robin over the
    whole grid (independent of any search: its medians judge one)."""
    s = Samples(space, measure, Protocol(max_samples=max(1, rounds), min_samples=1))
    grid = _grid(s)
    for _ in range(rounds):
        for idx in grid:
            if not s.failed(idx):
                s.take(idx, "exhaustive")
    live = [k for k in grid if not s.failed(k)]
    best = min(live, key=s.median) if live else grid[0]
    final = sorted(live, key=s.median)[: s.p.contenders]
    return s.result(best, grid[0], final)


def model_guess(ranked: list) -> dict:
    """The model's best feasible configuration (from model.rank_configs), no measurement."""
    for cfg, est in ranked:
        if est.feasible:
            return cfg
    raise ValueError("no feasible configuration in the space")


def model_table(ranked: list) -> dict:
    """{config values: predicted seconds, inf where infeasible} from model.rank_configs."""
    return {tuple(cfg.values()): (est.latency if est.feasible else math.inf) for cfg, est in ranked}


def confirm_medians(contenders: dict, measure, rounds: int) -> dict:
    """{name: median seconds} of each named configuration, the distinct ones measured
    round-robin ``rounds`` times (names sharing a configuration share its numbers)."""
    keys = {name: tuple(cfg.items()) for name, cfg in contenders.items()}
    times = {k: [] for k in dict.fromkeys(keys.values())}
    for _ in range(rounds):
        for k in times:
            times[k].append(measure(dict(k)))
    return {name: float(np.median(times[k])) for name, k in keys.items() if times[k]}


def choose_window(choices, cfg: dict, measure, rounds: int) -> tuple[str | None, dict | None]:
    """The fastest of the windows ``choices`` (how peers' rows travel: mgg.comm.mpi) at
    configuration ``cfg``, measured round-robin ``rounds`` times: (window, {window: median
    seconds}), or (None, None) when there is nothing to choose."""
    if len(choices) < 2:
        return None, None
    medians = confirm_medians({w: {**cfg, "window": w} for w in choices}, measure, rounds)
    return min(medians, key=medians.get), medians
