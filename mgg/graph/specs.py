"""Graph specs of the command line: a file, a stand-in name, ``rmat:...`` or ``planted:...``."""

from __future__ import annotations

import math
import os

from ..errors import InputError
from .dataset import Dataset
from .facts import facts
from .formats import is_ogb_dir, read_dataset
from .formats._common import BEG_SUFFIX
from .formats.ogb import MARKERS as OGB_MARKERS
from .formats.slices import source_checksum
from .generators import STANDINS, planted_partition, rmat, standin, standin_size
from .papers import KEYS as _PAPERS_KEYS
from .papers import NAME as PAPERS
from .papers import Papers, parse_papers

__all__ = [
    "dataset_source",
    "folder_error",
    "ogb_source",
    "papers_spec",
    "refuse_scale",
    "resolve",
    "spec_facts",
]

_STANDIN_KEYS = ("scale", "seed", "features")
_RMAT_KEYS = ("scale", "ef", "seed", "directed", "a", "b", "c")
_PLANTED_KEYS = ("nodes", "classes", "degree", "features", "p_in", "noise", "seed")


def resolve(spec: str, *, scale: float | None = None, seed: int = 0) -> Dataset:
    """A Dataset from a CLI spec.

    ``NAME[:scale=S,seed=K,features=0|1]`` for a stand-in (``scale``, the --scale flag,
    sizes a stand-in whose spec has no scale, and is refused with anything else);
    ``rmat:scale=K[,ef=16,seed=K,directed=0|1,a=..,b=..,c=..]``;
    ``planted:nodes=N,classes=C[,degree=10,features=32,p_in=0.8,noise=1,seed=K]``;
    ``papers100m[:scale=S,seed=K,features=0|1,p_in=0.8,noise=2]`` (mgg.graph.papers); or the
    path of an existing file, the prefix of ``*_beg_pos.bin`` or an OGB dataset directory
    (read by ``mgg.graph.formats.read_dataset``; an existing file wins over a name), the
    directory with options ``DIR:split=NAME,undirected=0|1,edge_feat=mean|skip|auto``.
    Unknown names or keys raise InputError listing the valid ones; another folder, one
    saying what it is not.
    """
    ogb = ogb_source(spec)
    if ogb is not None:
        refuse_scale(scale, spec, "an OGB directory")
        return read_dataset(ogb[0], **ogb[1])
    if os.path.isfile(spec) or os.path.isfile(spec + BEG_SUFFIX):
        refuse_scale(scale, spec, "a file")
        return read_dataset(spec)
    if os.path.isdir(spec):
        raise folder_error(spec)
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    kv = _parse_kv(rest, spec)
    if name in STANDINS:
        _check_keys(kv, _STANDIN_KEYS, name)
        if scale is not None and "scale" in kv:
            raise InputError(f"--scale {scale:g} and {spec!r} both give a scale: give one")
        s = kv.get("scale", 1.0 if scale is None else scale)
        return standin(
            name,
            float(s),
            int(kv.get("seed", seed)),
            with_features=bool(int(kv.get("features", 1))),
        )
    if name == PAPERS:
        return papers_spec(spec, scale, seed).dataset()
    if name == "rmat":
        refuse_scale(scale, spec, "an rmat spec (its scale=K is log2 of the node count)")
        _check_keys(kv, _RMAT_KEYS, name, required=("scale",))
        if not (isinstance(kv["scale"], int) and 0 <= kv["scale"] <= 62):
            raise InputError(
                f"{spec}: the R-MAT scale (log2 of the node count) must be an integer in [0, 62]"
            )
        k, ef, sd = int(kv["scale"]), int(kv.get("ef", 16)), int(kv.get("seed", seed))
        directed = bool(int(kv.get("directed", 0)))
        abc = {x: float(kv[x]) for x in "abc" if x in kv}
        g = rmat(k, ef, seed=sd, symmetric=not directed, **abc)
        params = dict(scale=k, edge_factor=ef, seed=sd, directed=directed, **abc)
        return Dataset(f"rmat-s{k}-ef{ef}", g, meta={"generator": "rmat", "params": params})
    if name == "planted":
        refuse_scale(scale, spec, "a planted spec (nodes=N sizes it)")
        _check_keys(kv, _PLANTED_KEYS, name, required=("nodes", "classes"))
        return planted_partition(
            int(kv["nodes"]),
            int(kv["classes"]),
            avg_degree=float(kv.get("degree", 10)),
            p_in=float(kv.get("p_in", 0.8)),
            num_features=int(kv.get("features", 32)),
            feature_noise=float(kv.get("noise", 1.0)),
            seed=int(kv.get("seed", seed)),
        )
    raise InputError(
        f"unknown graph {spec!r}: not an existing file, and not one of "
        f"{', '.join(STANDINS)}, {PAPERS}, rmat, planted"
    )


def spec_facts(spec: str, scale=None, seed: int = 0) -> dict | None:
    """What a memory plan needs of a generated graph (mgg.memory's facts), from its spec
    alone: papers100m and the stand-ins, at any scale, nothing drawn; None for others."""
    gen = papers_spec(spec, scale, seed)
    if gen is not None:
        return gen.facts()
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in STANDINS or os.path.exists(spec):
        return None
    kv = _parse_kv(rest, spec)
    _check_keys(kv, _STANDIN_KEYS, name)
    st = STANDINS[name]
    n, e, _ = standin_size(st, float(kv.get("scale", 1.0 if scale is None else scale)))
    features = st.features if int(kv.get("features", 1)) else 0
    return facts(n, e, features=features, classes=st.classes, symmetric=not st.directed, name=name)


def papers_spec(spec: str, scale=None, seed: int = 0) -> Papers | None:
    """The Papers of a ``papers100m[:...]`` spec (drawn in slices by the distributed
    partitioner), None for any other spec."""
    name, _, rest = spec.partition(":")
    if name.strip().lower() != PAPERS or os.path.exists(spec):
        return None
    kv = _parse_kv(rest, spec)
    _check_keys(kv, _PAPERS_KEYS, PAPERS)
    return parse_papers(kv, spec, scale, seed)


def refuse_scale(scale, spec: str, what: str) -> None:
    """InputError when ``scale`` (--scale) is given for ``spec``, which is ``what``: the
    flag sizes only a stand-in."""
    if scale is not None:
        raise InputError(
            f"--scale {scale:g} sizes a stand-in ({', '.join(STANDINS)}), not {what}: {spec}"
        )


def folder_error(path, *others: str) -> InputError:
    """The error for a folder that holds no dataset: not ``others`` (what else the caller
    takes, each with why not: 'a sharded dataset (no manifest.json)'), nor an OGB
    directory."""
    kinds = [*others, f"an OGB dataset directory (no raw/{' or raw/'.join(OGB_MARKERS)})"]
    return InputError(f"{path}: is a folder, not a graph file, and not {' nor '.join(kinds)}")


_OGB_OPTIONS = {
    "split": None,
    "undirected": {"0": False, "1": True},
    "edge_feat": {v: v for v in ("mean", "skip", "auto")},
}


def ogb_source(spec: str) -> tuple[str, dict] | None:
    """(the directory, read_ogb's keyword arguments) of a spec naming an OGB directory
    (``DIR`` or ``DIR:split=NAME,...``), else None."""
    if os.path.isfile(spec) or os.path.isfile(spec + BEG_SUFFIX):
        return None
    if is_ogb_dir(spec):
        return spec, {}
    folder, colon, options = spec.rpartition(":")
    if colon and is_ogb_dir(folder):
        return folder, _ogb_options(options, spec)
    return None


def _ogb_options(text: str, spec: str) -> dict:
    """read_ogb's keyword arguments from ``split=NAME,undirected=0|1,edge_feat=...``."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, val = (t.strip() for t in item.partition("="))
        if not eq or key not in _OGB_OPTIONS:
            raise InputError(
                f"{spec}: bad option {item!r} for an OGB directory; options: "
                "split=NAME, undirected=0|1, edge_feat=mean|skip|auto"
            )
        values = _OGB_OPTIONS[key]
        if values is not None and val not in values:
            raise InputError(f"{spec}: {key} takes one of {', '.join(values)}, got {val!r}")
        out[key] = val if values is None else values[val]
    return out


def _parse_kv(text: str, spec: str) -> dict[str, float]:
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, eq, val = item.partition("=")
        try:
            if not eq:
                raise ValueError
            num = float(val)
        except ValueError:
            raise InputError(f"bad item {item!r} in {spec!r}: expected key=number") from None
        if not math.isfinite(num):
            raise InputError(f"{spec}: {item!r}: expected a finite number")
        out[key.strip().lower()] = int(num) if num.is_integer() and "." not in val else num
    return out


def _check_keys(kv, valid, name, required=()):
    bad = sorted(set(kv) - set(valid))
    if bad:
        raise InputError(
            f"unknown key(s) {', '.join(bad)} for {name!r}; valid keys: {', '.join(valid)}"
        )
    missing = [k for k in required if k not in kv]
    if missing:
        raise InputError(f"{name!r} needs {', '.join(missing)}; valid keys: {', '.join(valid)}")


def dataset_source(spec: str, scale=None, seed: int = 0) -> dict:
    """Where the data of a dataset spec comes from, as `mgg partition` records it in a
    sharded dataset's manifest: a file's (or folder's) sizes and the blake2b of its head
    and tail (mgg.graph.formats.slices.source_checksum), else the generator spec with its
    scale and seed."""
    if os.path.exists(spec) or os.path.exists(spec + BEG_SUFFIX):
        return source_checksum(spec)
    return {"spec": spec, "scale": scale, "seed": seed}
