"""What every `mgg` command shares: the graph and knob flags, the argparse types, opening
a dataset, and the output (tables for people, one JSON object on the last line for
``--json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from ..errors import InputError
from ..knobs import INT_MAX, SPECS, KnobError, Knobs, check_value, flag, flag_help, shown

GRAPH = (
    "a file (.npz, .graph, .txt/.gz edge list, *_beg_pos.bin) or a generator spec: "
    "reddit|enwiki|products|proteins|orkut[:scale=S], rmat:scale=K,ef=F, planted:nodes=N,classes=C"
)
SHARDED = "; or a sharded dataset folder written by mgg partition --out"
CONFIG = (
    'knobs as JSON, e.g. \'{"ps": 32, "dist": 4}\', or a file holding them (mgg tune '
    "--out writes one); a flag given too must agree"
)

ORDER_FILE = (
    "number the nodes in this saved order before the split: a .npy permutation (new id -> "
    "original id), as mgg partition --order X --save-order F.npy writes it"
)

INPUTS: list[str] = []  # the graphs this command opened, for its error messages


# ---- flags ---------------------------------------------------------------------------------
def graph_args(s) -> None:
    s.add_argument("graph", help=GRAPH + SHARDED)
    scale_arg(s)
    s.add_argument("--seed", type=integer(0), default=0)


def scale_arg(s) -> None:
    s.add_argument(
        "--scale",
        type=number(0),
        default=None,
        help="scale factor of a stand-in without its own :scale= (refused for anything else)",
    )


def order_file_arg(s) -> None:
    s.add_argument("--order-file", default=None, help=ORDER_FILE)


def device_memory_arg(s, what: str) -> None:
    s.add_argument("--device-memory", type=size, default=None, help=what)


def size(text: str) -> str:
    """argparse type of a memory size: 2G, 512M, 1.5GiB or a byte count (kept as given)."""
    from ..memory import parse_size

    try:
        parse_size(text)
    except InputError:
        raise argparse.ArgumentTypeError(
            f"expected a size like 2G, 512M, 1.5GiB or a byte count, got {text!r}"
        ) from None
    return text


DEVICE_DEFAULT = "80G"  # an H100's memory, when no GPU is visible and none is given


def device_plan(args, ds, ranks: int, command: str, job: dict) -> dict:
    """The memory plan of the job's devices (``--device-memory``, else the GPU's): what each
    rank's device holds, and for training how many rows of streamed features a chunk
    holds where the features do not fit (``job``: the estimate's keywords, its backend
    among them: mgg.footprint.job_kw for training). Refused when even that does not fit with
    --device-memory given; without it (the GPU's own memory, an estimate not yet
    calibrated on a GPU: docs/data.md) a warning."""
    from ..errors import ResourceError
    from ..footprint import plan
    from ..memory import format_bytes, usable_words
    from ..partition.shards import ShardedDataset
    from ..process import local_size

    given = getattr(args, "device_memory", None)
    budget, how = device_budget(given, DEVICE_DEFAULT, local_size())
    bounds = ds.manifest["bounds"] if isinstance(ds, ShardedDataset) else None
    out = plan(ds, ranks, command, budget={"host": 2**62, "device": budget}, device=True,
               bounds=bounds, **job)  # fmt: skip
    out["budget_how"] = how
    if out["fits"]:
        return out
    big = max(r["device"]["total_bytes"] for r in out["per_rank"])
    why = (
        f"mgg {command} on {ranks} rank(s) needs about {format_bytes(big)} per device"
        + (", its features streamed or not" if command == "train" else "")
        + f", but a device has {usable_words(budget, how)}"
    )
    fixes = f"; it would fit with {' or '.join(out['fixes'])}" if out["fixes"] else ""
    if given is not None:
        raise ResourceError(f"--device-memory {given}: {why}{fixes}")
    print(f"mgg {command}: warning: {why}{fixes}", file=sys.stderr)
    return out


def device_budget(text: str | None, default: str, ranks: int = 1) -> tuple[int, str]:
    """(a rank's GPU memory in bytes, how it was found): ``text`` (--device-memory), else
    the GPU's shared by the ``ranks`` of the node (mggrun gives rank r device r % GPUs),
    else ``default``."""
    from ..memory import format_bytes, parse_size

    if text is not None:
        return parse_size(text), f"--device-memory {text}"
    try:
        import cupy

        total, gpus = cupy.cuda.Device().mem_info[1], cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no cupy, no driver, no device
        return parse_size(default), f"assumed (no GPU here; give --device-memory): {default}"
    share = -(-max(1, ranks) // max(1, gpus))
    if share == 1:
        return total, f"the GPU's {format_bytes(total)}"
    return total // share, f"the GPU's {format_bytes(total)} / {share} PEs sharing it"


def job_args(s, command: str) -> None:
    """A flag per job parameter ``command`` takes (mgg.job.Job: help, values, default)."""
    from ..job import params

    types = {"int": integer(1), "fraction": fraction, "positive": number(0)}
    types["nonnegative"] = number(0, open_low=False)
    for name, default, p in params(command):
        option = "--" + name.replace("_", "-")
        if p.kind == "flag":
            s.add_argument(option, action="store_true", help=p.help)
        elif p.kind == "choice":
            s.add_argument(option, choices=p.choices, default=default, help=p.help)
        else:
            s.add_argument(option, type=types.get(p.kind), default=default, help=p.help)


def job_of(args, knobs: Knobs, command: str):
    """The mgg.job.Job of ``command``'s job flags and ``knobs`` (knobs_of)."""
    from ..job import Job, params

    given = {name: getattr(args, name) for name, _, _ in params(command)}
    return Job.parse(given, knobs=knobs)


def knob_args(s, names, extra: dict | None = None) -> None:
    """A flag per knob of ``names`` (mgg.knobs: help, values, default), None when not
    given; ``extra``: {knob: (value, what it means)} a command adds to a knob's values."""
    extra = extra or {}
    for name in names:
        more = dict([extra[name]]) if name in extra else {}
        text = flag_help(name) + "".join(f"; {v}: {what}" for v, what in more.items())
        s.add_argument(flag(name), type=knob_type(name, tuple(more)), default=None, help=text)


def knob_type(name: str, extra=()):
    """argparse type: a knob's value from its flag's text (``extra``: more words)."""

    def parse(text: str):
        if text in extra:
            return text
        try:
            return check_value(name, text, text=True, label="")
        except KnobError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = name
    return parse


class Renamed(argparse.Action):
    """A flag's old spelling: takes its value (checked as the new flag's) with a warning."""

    def __init__(self, option_strings, dest, new: str, **kw):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, value, option_string=None):
        print(
            f"{parser.prog}: warning: {option_string} is deprecated: it is {self.new} now",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, value)


def renamed(s, old: str, knob: str, extra=()) -> None:
    """Keep ``old`` as a deprecated alias of knob ``knob``'s flag."""
    s.add_argument(old, dest=knob, action=Renamed, new=flag(knob), type=knob_type(knob, extra))


def knobs_of(args, takes, job: str) -> Knobs:
    """The command's Knobs from its knob flags and ``--config`` (where it has one), each
    refused where it entered unless ``job`` takes it (``takes``: mgg.backend.takes)."""
    given = {k: getattr(args, k) for k in SPECS if getattr(args, k, None) is not None}
    knobs = Knobs.parse(given, takes=takes, job=job, label=flag)
    config = getattr(args, "config", None)
    if config is None:
        return knobs
    tuned = Knobs.from_json(config, takes=takes, job=job)
    for k in sorted(tuned.given & knobs.given):
        if getattr(tuned, k) != getattr(knobs, k):
            raise KnobError(
                f"{flag(k)} {getattr(knobs, k)} and --config's {k} {getattr(tuned, k)} "
                "disagree: give one of them"
            )
    return Knobs.parse({k: getattr(tuned, k) for k in tuned.given}, base=knobs)


def config(text: str) -> dict:
    """argparse type of --config: a JSON object, inline or in a file (checked as knobs by
    knobs_of, which knows the job)."""
    source = text
    if not text.lstrip().startswith(("{", "[")):
        if not os.path.isfile(text):
            raise argparse.ArgumentTypeError(
                f"{text}: neither a JSON object nor a file holding one"
            )
        try:
            with open(text) as f:
                text = f.read()
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{source}: {e.strerror or e}") from None
    where = "" if source == text else f"{source}: "
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"{where}not JSON ({e.msg}, column {e.colno}): {text[:80]}"
        ) from None
    except ValueError as e:  # a number of more than 4300 digits
        raise argparse.ArgumentTypeError(f"{where}not JSON mgg reads ({e})") from None


def integer(low: int, high: int = INT_MAX):
    """argparse type: an integer in [low, high] (every integer flag has both bounds)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {shown(value)}")
        return value

    return parse


def number(low: float, open_low: bool = True):
    """argparse type: a finite number > low (>= low when not open_low)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
        if not np.isfinite(value) or value < low or (open_low and value == low):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'>' if open_low else '>='} {low:g}, got {text}"
            )
        return value

    return parse


def fraction(text: str) -> float:
    """argparse type: a probability in [0, 1)."""
    value = number(0, open_low=False)(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1), got {text}")
    return value


# ---- inputs --------------------------------------------------------------------------------
def open_dataset(spec: str, scale=None, seed: int = 0):
    """A Dataset from a spec, or a ShardedDataset for a folder written by --out."""
    from ..graph.formats import is_ogb_dir
    from ..graph.specs import folder_error, refuse_scale, resolve
    from ..partition.shards import MANIFEST, ShardedDataset, is_sharded, rank_dir

    INPUTS.append(spec)
    if is_sharded(spec):
        refuse_scale(scale, spec, "a sharded dataset")
        return ShardedDataset(spec)
    if os.path.isdir(spec) and not is_ogb_dir(spec):
        if os.path.isdir(os.path.join(spec, rank_dir(0))):
            raise InputError(
                f"{spec}: holds the shards of a sharded dataset ({rank_dir(0)}/, ...) but no "
                f"{MANIFEST}, which mgg partition --out writes last: the partition did not "
                "finish or the manifest was deleted; partition the source again"
            )
        raise folder_error(spec, f"a sharded dataset (no {MANIFEST})")
    return resolve(spec, scale=scale, seed=seed)


def sizes(ds) -> tuple[int, int]:
    """Nodes and edges of the dataset as read (a sharded one's plans add GCN's self loops)."""
    g = getattr(ds, "graph", ds)
    source = getattr(ds, "manifest", {}).get("source", {})
    return g.num_nodes, source.get("num_edges", g.num_edges)


# ---- output --------------------------------------------------------------------------------
def quiet(args) -> bool:
    """--json to a pipe: only the JSON line."""
    return args.json and not sys.stdout.isatty()


def emit(args, result: dict) -> None:
    """The command's result as one JSON object on the last line, with --json."""
    if args.json:
        print(json.dumps(result))


def format_table(rows, headers) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c) -> str:
    if isinstance(c, float):
        return f"{c:.4g}"
    if isinstance(c, int | np.integer):
        return f"{c:,}"
    return str(c)
