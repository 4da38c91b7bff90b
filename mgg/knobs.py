"""The paper's knobs, in one home: every tunable of a job, its default, the values it may
take, which backend takes it, the tuner's search space per device, and its JSON form.

  ps       neighbor partition size: edges per LNP / RNP                   cpu, cuda
  dist     interleaving distance: remote work in flight while local work  cpu, cuda
           runs (cpu: fetch batches or message chunks; cuda: partitions
           of each kind per warp)
  wpb      warps per block of the aggregation kernel                      cuda
  threads  numba threads per rank (auto: all numba has)                   cpu
  window   how peers' rows reach a rank: shm (loads, one node), rma       cpu
           (one-sided gets), msg (two-sided messages) (auto: shm on one
           node, else msg)
  split    how nodes are cut into ranks: edges (Algorithm 1), nodes,      cpu, cuda
           mixed (both shares)
  remote   how the CUDA kernel reads peers: p2p (loads via nvshmem_ptr),  cuda
           get (device gets) (auto: p2p where every peer maps)
  dtype    what node rows are stored, exchanged and aggregated in:        cpu, cuda
           float32, or bfloat16 summed in float32 (mgg.precision)
  order    how nodes are numbered before the split (mgg.partition.order): cpu, cuda
           natural, degree (hubs first), rcm, metis

A value enters once (a flag, a ``--config`` key, a keyword argument, a checkpoint)
through :meth:`Knobs.parse`, which refuses it naming where it came from and what is
allowed; past that, code reads the fields of a frozen :class:`Knobs`. A design says which
knobs it takes (``Design.knobs``); a job takes those plus its backend's (``JOB_KNOBS``).
A new knob is one field here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace

from . import precision
from .errors import InputError
from .precision import DTYPES

WINDOWS = ("shm", "rma", "msg")
SPLITS = ("edges", "nodes", "mixed")
REMOTES = ("p2p", "get")
ORDERS = ("natural", "degree", "rcm", "metis")
AUTO = "auto"  # a flag's spelling of None where a knob has an automatic choice
TUNABLE = ("ps", "dist", "wpb", "threads", "window")  # what a tuner and configure() set
# besides the design's
JOB_KNOBS = {
    "cpu": ("ps", "split", "threads", "dtype", "order"),
    "cuda": ("ps", "split", "dtype", "order"),
}
POWERS = (1, 2, 4, 8, 16, 32, 64, 128)
INT_MAX = 2**31 - 1  # the top of every integer knob and flag: a C int, what kernels take


class KnobError(InputError):
    """A knob's value is out of range, or the knob is unknown or not taken here."""


@dataclass(frozen=True)
class Spec:
    """What a knob may be: an integer in [low, high], or one of ``choices``; ``auto`` says
    what None means (None: the knob has no automatic choice)."""

    help: str
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] | None = None
    auto: str | None = None

    def allowed(self) -> str:
        if self.choices is not None:
            text = ", ".join(self.choices)
        elif self.high is None:
            text = f"an integer >= {self.low}"
        else:
            text = f"an integer in [{self.low}, {self.high}]"
        return text + (f", or {AUTO} ({self.auto})" if self.auto else "")


def _knob(default, help: str, **spec):
    return field(default=default, metadata={"spec": Spec(help, **spec)})


@dataclass(frozen=True)
class Knobs:
    """One job's knobs (None: the automatic choice, where the knob has one). ``given``:
    the knobs a user set (parse records them; built directly, those off their default),
    so that a default can yield to a dataset's own (a sharded dataset's ps) and a knob
    this job does not take is refused."""

    ps: int = _knob(16, "neighbor partition size (edges per LNP/RNP)", low=1, high=INT_MAX)
    dist: int = _knob(
        4,
        "interleaving distance (cpu: fetch batches, or chunks with window msg, in flight; "
        "cuda: partitions per warp)",
        low=1,
        high=INT_MAX,
    )
    wpb: int = _knob(4, "warps per block of the CUDA kernel", low=1, high=32)
    threads: int | None = _knob(None, "numba threads per rank", low=1, auto="all numba has")
    window: str | None = _knob(
        None,
        "how peers' rows reach a rank (MPI): shm (loads, one node), rma (one-sided gets), "
        "msg (two-sided messages)",
        choices=WINDOWS,
        auto="shm on one node, else msg",
    )
    split: str = _knob(
        "edges",
        "how nodes are cut into ranks: balance edges (Algorithm 1), node counts, or both",
        choices=SPLITS,
    )
    remote: str | None = _knob(
        None,
        "how the CUDA kernel reads peers: loads via nvshmem_ptr (p2p) or device gets (get)",
        choices=REMOTES,
        auto="p2p if every peer maps",
    )
    dtype: str = _knob(
        "float32",
        "what node rows are stored, exchanged and aggregated in (bfloat16: half the bytes, "
        "summed in float32; weights stay float32)",
        choices=DTYPES,
    )
    order: str = _knob(
        "natural",
        "how nodes are numbered before the split: the graph's own order, hubs first "
        "(degree), reverse Cuthill-McKee (rcm) or METIS's parts (metis, needs pymetis)",
        choices=ORDERS,
    )
    given: frozenset | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for name in SPECS:
            check_value(name, getattr(self, name))
        if self.given is None:
            off = frozenset(k for k, f in _FIELDS.items() if getattr(self, k) != f.default)
            object.__setattr__(self, "given", off)

    @classmethod
    def parse(
        cls,
        given: Mapping,
        *,
        takes: Iterable[str] | None = None,
        job: str = "this job",
        label: Callable[[str], str] | None = None,
        base: Knobs | None = None,
    ) -> Knobs:
        """``base`` (default: the defaults) with the knobs ``given`` ({name: value}; a None
        value is not given), each refused with a KnobError unless it is a knob, one that
        ``takes`` (the names ``job`` takes; None: any) includes, with a value it may take.
        ``label(name)`` names a knob in errors: ``--ps``, ``--config key 'ps'`` (default the
        knob's name)."""
        label = label or str
        values = {}
        for name, value in given.items():
            if name not in SPECS:
                raise KnobError(f"{label(name)} is not a knob; the knobs are {', '.join(SPECS)}")
            if value is not None:
                values[name] = check_value(name, value, label=label(name))
        base = base or cls()
        out = replace(base, **values, given=base.given | frozenset(values))
        if takes is not None:
            out.check_taken(takes, job, label)
        return out

    def check_taken(self, takes: Iterable[str], job: str = "this job", label=None) -> None:
        """Refuse (KnobError) a knob the user set that ``job`` does not take."""
        takes = tuple(takes)
        label = label or str
        for name in SPECS:
            if name in self.given and name not in takes:
                them = ", ".join(k for k in SPECS if k in takes)
                raise KnobError(f"{label(name)} is not a knob of {job}, which takes {them}")

    @classmethod
    def from_json(cls, obj, *, source: str = "--config", **kw) -> Knobs:
        """Knobs from their JSON form (an object, or its text), each key checked as
        :meth:`parse` checks it, named ``SOURCE key 'K'`` in errors."""
        if isinstance(obj, str | bytes):
            try:
                obj = json.loads(obj)
            except json.JSONDecodeError as e:
                raise KnobError(f"{source}: not JSON ({e.msg}, column {e.colno})") from None
            except ValueError as e:  # a number of more than 4300 digits
                raise KnobError(f"{source}: not JSON mgg reads ({e})") from None
        if not isinstance(obj, dict):
            raise KnobError(f'{source}: knobs are a JSON object like {{"ps": 32}}, got {obj!r}')
        return cls.parse(obj, label=lambda k: f"{source} key {k!r}", **kw)

    def to_json(self, names: Iterable[str] | None = None) -> dict:
        """{name: value} of ``names`` (default: every knob), the form ``from_json`` reads."""
        return {k: getattr(self, k) for k in (SPECS if names is None else names)}

    def point(self, space: Mapping) -> dict:
        """This configuration as a point of the tuner's ``space``: a knob left to its
        automatic choice (threads) takes the space's largest value."""
        return {
            k: max(v) if getattr(self, k) is None else getattr(self, k) for k, v in space.items()
        }

    def options(self, names: Iterable[str]) -> dict:
        """{name: value} of those of ``names`` that are set (a design's keyword options)."""
        return {k: getattr(self, k) for k in names if getattr(self, k, None) is not None}


_FIELDS = {f.name: f for f in fields(Knobs) if "spec" in f.metadata}
SPECS: dict[str, Spec] = {name: f.metadata["spec"] for name, f in _FIELDS.items()}


def check_value(name: str, value, *, label: str | None = None, text: bool = False):
    """``value`` as knob ``name`` takes it, or a KnobError naming ``label`` (default the
    knob's name; "": none, for a flag's parser to add) and the allowed values. ``text``:
    the value is a flag's text ('16', 'auto')."""
    spec = SPECS[name]
    label = name if label is None else label
    at = f"{label}: " if label else ""
    if text and isinstance(value, str):
        if value == AUTO and spec.auto:
            return None
        if spec.choices is None:
            try:
                value = int(value)
            except ValueError:
                raise KnobError(f"{at}expected an integer, got {value[:40]!r}") from None
    if value is None and spec.auto:
        return None
    if name == "dtype" and not isinstance(value, str):  # np.float32, torch.bfloat16
        value = _dtype_name(value)
    if spec.choices is not None:
        if value not in spec.choices:
            raise KnobError(f"{at}must be {_one_of(spec)}, got {shown(value)}")
        return value
    if isinstance(value, bool) or not _is_int(value):
        raise KnobError(f"{at}must be {spec.allowed()}, got {shown(value)}")
    value = int(value)
    high = _numba_threads() if name == "threads" else spec.high  # every integer has a top
    if not spec.low <= value <= high:
        raise KnobError(f"{at}must be in [{spec.low}, {high}], got {shown(value)}")
    return value


def shown(value) -> str:
    """``value`` for an error message: its repr (str for an int), cut to 40 characters."""
    text = str(value) if isinstance(value, int) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _one_of(spec: Spec) -> str:
    return "one of " + ", ".join(spec.choices) + (f" or {AUTO}" if spec.auto else "")


def _is_int(value) -> bool:
    try:
        return int(value) == value and not isinstance(value, str | float | complex)
    except (TypeError, ValueError):
        return False


def _dtype_name(value):
    """A numpy or torch dtype's knob name ('float32', 'bfloat16'), else value as it is."""
    try:
        return precision.name(value)
    except TypeError:
        return value


def _numba_threads() -> int:
    import numba

    return numba.config.NUMBA_NUM_THREADS


DEFAULTS = Knobs()


def space(device) -> dict:
    """The tuner's search space on ``device`` (its ``kind``, and ``sms``: a CPU's cores):
    the paper's ranges as powers of two. GPU: ps 1..32, dist 1..16, wpb 1..16; CPU: ps
    1..128, dist 1..16, threads up to the cores. (The CPU's window is chosen apart, by
    measurement, where the job has a choice: Comm.window_choices.)"""
    if device.kind == "cpu":
        return {
            "ps": list(POWERS),
            "dist": list(POWERS[:5]),
            "threads": [t for t in POWERS[:7] if t <= device.sms],
        }
    return {"ps": list(POWERS[:6]), "dist": list(POWERS[:5]), "wpb": list(POWERS[:5])}


def flag(name: str) -> str:
    """A knob's command-line flag."""
    return "--" + name.replace("_", "-")


def flag_help(name: str) -> str:
    """A knob's flag help: what it is, what it may be, its default."""
    spec, default = SPECS[name], getattr(DEFAULTS, name)
    shown = AUTO if default is None else default
    return f"{spec.help}; {spec.allowed()} (default {shown})"


__all__ = [
    "AUTO",
    "DEFAULTS",
    "INT_MAX",
    "JOB_KNOBS",
    "KnobError",
    "Knobs",
    "ORDERS",
    "REMOTES",
    "SPECS",
    "SPLITS",
    "TUNABLE",
    "WINDOWS",
    "check_value",
    "flag",
    "flag_help",
    "shown",
    "space",
]
