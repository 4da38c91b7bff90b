"""The one tuning driver: `mgg tune` (each sample one aggregation on designs built for it)
and ``Trainer(tune=True)`` (each sample a real training step) both run it, each with its
own ``measure``.

The steps: the device's search space (mgg.knobs.space), ranked by the analytical model;
where the job has a choice of windows (across nodes), the window measured first at the
configuration in force; then the noise-aware walk (mgg.tuner.search).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..knobs import DEFAULTS, Knobs, space
from .model import Device, Workload, rank_configs
from .search import Protocol, SearchResult, choose_window, model_guess, model_table, search


@dataclass
class Tuned:
    """A driver's outcome: the search's result, the space and its ranking by the model,
    the configuration in force as a point of the space, and the window chosen (None when
    the job had no choice) with each window's median seconds."""

    result: SearchResult
    space: dict
    ranked: list
    default: dict
    window: str | None = None
    window_latency: dict | None = None

    @property
    def best(self) -> dict:
        """The pick: a point of the space, plus the window where one was chosen."""
        return {**self.result.best, **({"window": self.window} if self.window else {})}

    @property
    def model_guess(self) -> dict:
        return model_guess(self.ranked)

    def to_json(self) -> dict:
        return {
            **self.result.to_json(),
            "space": self.space,
            "default": self.default,
            "model_guess": self.model_guess,
            "window_latency_s": self.window_latency,
        }


def drive(
    measure,
    *,
    device: Device,
    work: Workload,
    mode: str = "get",
    knobs: Knobs = DEFAULTS,
    search_space: dict | None = None,
    windows: tuple[str, ...] = (),
    start: str | dict = "model",
    protocol: Protocol | None = None,
) -> Tuned:
    """MGG's cross-iteration search; every rank of a job must take the same decisions, so
    ``measure`` returns the slowest rank's seconds.

    measure       cfg -> seconds; cfg is a point of the space (plus "window" once one
                  is chosen)
    device, work  what the model ranks the space for (``mode``: the GPU's remote path)
    knobs         the knobs in force: their point of the space is where windows are
                  compared (a knob left automatic takes the space's largest value)
    search_space  default mgg.knobs.space(device)
    windows       the job's choice of windows (Comm.window_choices), measured first when
                  there are two or more and the protocol's budget leaves room for them
    start         'model' (the model's guess; its ranking orders the moves), 'origin' (the
                  paper's (1, 1, 1), knob by knob, no model), or a configuration (the model
                  orders the moves)
    protocol      the sampling protocol; its budget, where set, counts the window's samples
    """
    if isinstance(start, str) and start not in ("model", "origin"):
        raise ValueError(f"start must be 'model', 'origin' or a configuration, got {start!r}")
    protocol = protocol or Protocol()
    grid = search_space or space(device)
    ranked = rank_configs(grid, work, device, mode)
    default = knobs.point(grid)
    window = latency = None
    rounds = protocol.min_samples
    cost = len(windows) * rounds
    if len(windows) > 1 and (protocol.budget is None or cost < protocol.budget):
        window, latency = choose_window(windows, default, measure, rounds)
        if protocol.budget is not None:
            protocol = replace(protocol, budget=protocol.budget - cost)
    chosen = {"window": window} if window else {}

    def sample(cfg):
        return measure({**cfg, **chosen})

    if start == "origin":
        res = search(grid, sample, protocol=protocol)
    else:
        first = start if isinstance(start, dict) else None
        res = search(grid, sample, start=first, model=model_table(ranked), protocol=protocol)
    return Tuned(res, grid, ranked, default, window, latency)
