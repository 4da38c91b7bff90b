"""The training job in one frozen value: what a run trains (model, its sizes, optimizer),
how it holds memory (recompute, offload, output rows, streamed rows), where it runs
(design, backend) and the paper's knobs (:class:`mgg.knobs.Knobs`, the dtype among them).

Every parameter of a job has one home, a field of :class:`Job` with its default and help,
from which each command's flag is made (``mgg.cli.common.job_args``: train, plan, predict,
embed, check, tune). A value enters once, through :meth:`Job.parse`, which refuses it naming the
flag; past that, code reads the fields. The memory plan takes a Job and returns it with
what it decided (:func:`mgg.footprint.planned`: ``offload``, ``stream_rows``); a model is
built from the Job (:meth:`Job.build_model`), never changed after.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from .backend import NAMES as BACKENDS
from .errors import InputError
from .knobs import Knobs

MODEL_HELP = (
    "gcn, sage, gin or gat, each with the paper's defaults, or any model registered in "
    "mgg.torch.MODELS"
)
OUTPUT_ROWS = ("all", "labeled")
# the optimizers of mgg.optim by name: its class, and the bytes of state it keeps per
# parameter (what the footprint model counts)
OPTIMIZERS = {"adam": ("Adam", 8), "sgd": ("SGD", 0)}  # Adam: two moments; SGD: none
DESIGNS = "pipelined|bulk_halo|direct (cpu)"
# Policies on a job's sizes, checked before any work (the model and the plans are built
# layer by layer and rank by rank, and a size past these would run for hours first):
# layers: the deepest GNN published (RevGNN, 1,001 layers) with room; a model is built and
# planned layer by layer before its first step (mgg plan: about 1 s per 1,000 layers)
MAX_LAYERS = 1024
LAYERS_WHY = (
    "a policy: the model is built and planned layer by layer before its first step, and "
    "the deepest published GNN (RevGNN) has 1,001"
)
# ranks: a plan is built for every rank and each keeps state per peer (mgg partition of
# Cora: 17 s at 1,024 ranks, 39 s at 8,192; 4,096 ranks of a 300-node graph over 90 s on a
# loaded machine)
MAX_RANKS = 1024
RANKS_WHY = (
    "a policy: a plan is built for every rank and each keeps state per peer (mgg partition "
    "of Cora: 17 s at 1,024 ranks, 39 s at 8,192)"
)


@dataclass(frozen=True)
class Param:
    """A job parameter's flag: its ``kind`` ('int': an integer >= 1, 'fraction': in
    [0, 1), 'positive', 'nonnegative', 'flag': a switch, 'choice': one of ``choices``,
    'text'), help, and the commands that take it."""

    kind: str
    help: str
    commands: tuple[str, ...] = ("train",)
    choices: tuple[str, ...] | None = None


def _param(default, kind: str, help: str, commands=("train", "plan"), choices=None):
    return field(default=default, metadata={"param": Param(kind, help, commands, choices)})


EVERY = ("train", "plan", "predict", "embed", "check", "tune")


@dataclass(frozen=True)
class Job:
    """One training (or inference) job's parameters; None: the model's default."""

    model: str = _param("gcn", "text", MODEL_HELP)
    hidden: int | None = _param(None, "int", "hidden units (default: the model's)")
    layers: int | None = _param(None, "int", "layers (default: the model's)")
    heads: int | None = _param(None, "int", "attention heads (gat; default 8)")
    input_dropout: float | None = _param(
        None, "fraction", "dropout on the features (gin; default 0.9)", ("train",)
    )
    dropout: float | None = _param(None, "fraction", "default: the model's", ("train",))
    optimizer: str = _param("adam", "choice", "the optimizer", choices=tuple(OPTIMIZERS))
    lr: float | None = _param(None, "positive", "learning rate (default: the model's)", ("train",))
    weight_decay: float | None = _param(
        None, "nonnegative", "L2, default the model's (5e-4)", ("train",)
    )
    recompute: bool = _param(
        False,
        "flag",
        "keep only each layer's input for the backward pass and compute the layer again "
        "there (less memory, one more forward per step)",
    )
    offload: bool = _param(
        False,
        "flag",
        "keep what the backward pass needs in host memory until it runs, copied beside the "
        "work (the device then holds one layer's working tensors; the default where the "
        "device plan needs it after streaming the features; not with --cuda-graph)",
    )
    output_rows: str = _param(
        "all",
        "choice",
        "all: the output layer computes every row; labeled: only the rows of a split "
        "(train, validation, test), over their in-edges: what the loss and the metrics read "
        "(gcn, sage)",
        choices=OUTPUT_ROWS,
    )
    row_normalize: bool = _param(False, "flag", "feature rows sum to 1", ("train",))
    design: str = _param("pipelined", "text", DESIGNS, ("train", "plan", "predict", "embed"))
    backend: str = _param("cpu", "choice", "where the job runs", EVERY, BACKENDS)
    # decided by the memory plan (mgg.footprint.planned), not a flag: the rows of dense
    # features a chunk streams through the device (0: the features live there)
    stream_rows: int = 0
    knobs: Knobs = field(default_factory=Knobs)

    @property
    def dtype(self) -> str:
        return self.knobs.dtype

    @classmethod
    def parse(cls, values: dict, *, knobs: Knobs | None = None, label=None) -> Job:
        """A Job from ``values`` (parameter name -> value; None: the default), each checked,
        refused naming its flag (``label(name)``, default ``--name``)."""
        label = label or (lambda name: "--" + name.replace("_", "-"))
        known = [f.name for f in fields(cls) if f.name != "knobs"]
        for name in values:
            if name not in known:
                raise InputError(f"unknown job parameter {name!r}; the job has {', '.join(known)}")
        given = {k: v for k, v in values.items() if v is not None}
        job = cls(**given, **({"knobs": knobs} if knobs is not None else {}))
        job.check(label)
        return job

    def check(self, label=lambda name: "--" + name.replace("_", "-")) -> None:
        """Each parameter within its kind, the model registered and taking the options
        given (heads: gat's; input_dropout: gin's; output_rows labeled: gcn's and sage's)."""
        from .torch import MODELS

        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        for f in fields(self):
            p = f.metadata.get("param")
            value = getattr(self, f.name)
            if p is not None and value is not None:
                _check(label(f.name), p, value)
        if self.layers is not None and self.layers > MAX_LAYERS:
            raise InputError(
                f"{label('layers')} {self.layers:,}: at most {MAX_LAYERS:,} layers ({LAYERS_WHY})"
            )
        from .designs import get_design

        get_design(self.backend, self.design)  # an unknown design: refused before any work
        for option, model in (("heads", "gat"), ("input_dropout", "gin")):
            if getattr(self, option) is not None and self.model != model:
                raise ValueError(f"{label(option)} is an option of --model {model}")
        if self.output_rows == "labeled" and not getattr(self.spec.cls, "picks_rows", False):
            raise ValueError(
                f"--output-rows labeled: the last layer of --model {self.model} computes every "
                "row; gcn and sage compute the labeled rows alone"
            )
        if not (isinstance(self.stream_rows, int) and self.stream_rows >= 0):
            raise InputError(f"stream_rows must be an integer >= 0, got {self.stream_rows!r}")

    @property
    def spec(self):
        """The registered model's spec (mgg.torch.models.Spec: its defaults)."""
        from .torch import MODELS

        return MODELS[self.model]

    def options(self) -> dict:
        """The model's constructor options this job sets (heads, input_dropout)."""
        names = ("heads", "input_dropout")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

    def build_model(self, in_dim: int, out_dim: int, seed: int = 0):
        """The job's model [n, in_dim] -> [n, out_dim], weights drawn from ``seed``."""
        from .torch import build_model

        return build_model(
            self.model,
            in_dim,
            out_dim,
            hidden=self.hidden,
            layers=self.layers,
            dropout=self.dropout,
            seed=seed,
            recompute=self.recompute,
            offload=self.offload,
            **self.options(),
        )

    def build_optimizer(self, model):
        """The job's optimizer over ``model`` (its lr and weight decay, else the model's)."""
        spec = self.spec
        lr = spec.lr if self.lr is None else self.lr
        decay = spec.weight_decay if self.weight_decay is None else self.weight_decay
        return build_optimizer(self.optimizer, model, lr, decay)

    def with_plan(self, offload: bool, stream_rows: int) -> Job:
        """This job with what a memory plan decided."""
        return replace(self, offload=self.offload or bool(offload), stream_rows=int(stream_rows))


def _check(flag: str, p: Param, value) -> None:
    """``value`` within ``p``'s kind, else an InputError naming ``flag``."""
    number = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool
    )
    ok = {
        "int": isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 1,
        "fraction": number and 0 <= value < 1,
        "positive": number and np.isfinite(value) and value > 0,
        "nonnegative": number and np.isfinite(value) and value >= 0,
        "flag": isinstance(value, bool),
        "choice": value in (p.choices or ()),
        "text": isinstance(value, str) and bool(value),
    }[p.kind]
    if not ok:
        want = {
            "int": "an integer >= 1",
            "fraction": "a number in [0, 1)",
            "positive": "a number > 0",
            "nonnegative": "a number >= 0",
            "flag": "true or false",
            "choice": "one of " + ", ".join(p.choices or ()),
            "text": "a name",
        }[p.kind]
        raise InputError(f"{flag} must be {want}, got {value!r}")


def check_ranks(ranks: int, flag: str = "--np") -> None:
    """InputError naming ``flag`` when a job of ``ranks`` ranks is past MAX_RANKS (before
    any plan loops over them)."""
    if int(ranks) > MAX_RANKS:
        raise InputError(f"{flag} {int(ranks):,}: at most {MAX_RANKS:,} ranks ({RANKS_WHY})")


def params(command: str) -> list[tuple[str, object, Param]]:
    """(name, default, Param) of each job parameter ``command`` takes as a flag."""
    out = []
    for f in fields(Job):
        p = f.metadata.get("param")
        if p is not None and command in p.commands:
            out.append((f.name, f.default, p))
    return out


def build_optimizer(name: str, model, lr: float, weight_decay: float):
    """An mgg.optim optimizer (torch's fused Adam or SGD) over the model's parameter
    groups (``param_groups`` where the model has them: GCN decays its first layer only)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"the learning rate must be a positive number, got {lr}")
    groups = (
        model.param_groups(weight_decay)
        if hasattr(model, "param_groups")
        else [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    )
    from . import optim

    return getattr(optim, OPTIMIZERS[name][0])(groups, lr=lr)
