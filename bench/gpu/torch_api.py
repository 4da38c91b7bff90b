"""The torch API that mgg's code uses, checked against the torch of the GPU machine.

    python bench/gpu/torch_api.py scan  [--json]
    python bench/gpu/torch_api.py record --wheel torch-2.11.0-cp312-...whl [-o MANIFEST]
    python bench/gpu/torch_api.py record --installed [-o MANIFEST]
    python bench/gpu/torch_api.py check [--manifest MANIFEST]

The GPU machine runs an older torch (2.11) than the dev pin, and code that runs only on
CUDA never runs here, so a call that 2.11 lacks would only fail in a rare device window.

scan    reads mgg/ and bench/gpu/ (their ASTs: nothing is imported) for every attribute
        path rooted at torch (``torch.mm``, ``F.linear`` as ``torch.nn.functional.linear``,
        ``from torch.profiler import profile``; ``torch.cuda.current_stream().wait_stream``:
        a method of what a call returns), the keywords each call passes, and the names
        looked up on other objects (``x.pin_memory()``, ``self.side.wait_event(e)``).
record  writes the manifest: for each path used, whether that torch has it and the
        keywords it accepts; the same for the methods among the names, of Tensor and of
        the classes used from torch.cuda, torch.autograd and torch.profiler. From a wheel
        it reads the sources and type stubs inside the zip without installing it
        (torch/_C/_VariableFunctions.pyi, torch/_C/__init__.pyi, the .py modules, following
        imports, ``import *``, classes' bases and return annotations); ``--installed``
        reads the installed torch's files the same way, and where they leave a path open,
        asks the imported module (the GPU machine: ``record --installed -o OTHER.json``,
        then ``check --manifest OTHER.json``).
check   compares the current scan with the manifest: prints each use that the recorded
        torch lacks (a path it has not, a keyword its signature refuses) and exits 1;
        prints the uses the manifest does not cover (written after it was recorded) with
        the command that re-records it, and exits 2 if that is all.

Methods are found by name only (the scan cannot tell a tensor from a numpy array): a name
counts where the torch running ``check`` (the dev pin) has it on the class, and it is
missing where the wheel's torch has it not (recorded against the recording interpreter's
torch); a keyword is refused only where the dev torch's method takes it and the recorded
one not. Not caught: uses spelled through ``getattr``, and methods of classes outside
those namespaces (``torch.nn.Module``'s) other than Tensor's.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torch_reader import (
    ANY,
    UNKNOWN,
    Class,
    Defs,
    Files,
    Instance,
    Module,
    Reader,
    Value,
    top_level,
)

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("mgg", "bench/gpu")
MANIFEST = Path(__file__).with_name("torch_2_11_api.json")
WHEEL = "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"
RERECORD = (
    f"pip download torch==2.11.0 --no-deps --only-binary=:all: --python-version 3.12 "
    f"--platform manylinux_2_28_x86_64 -d /tmp/torch211 && .venv/bin/python "
    f"bench/gpu/torch_api.py record --wheel /tmp/torch211/{WHEEL}"
)


# ---- scan ---------------------------------------------------------------------------------


@dataclass
class Use:
    keywords: set[str] = field(default_factory=set)
    sites: list[str] = field(default_factory=list)
    keyword_sites: dict[str, list[str]] = field(default_factory=dict)  # the calls passing each

    def site(self, keywords=()) -> str:
        """The first site, or the first call passing the first of ``keywords``."""
        return self.keyword_sites[keywords[0]][0] if keywords else self.sites[0]


def _aliases(imports) -> dict[str, str]:
    """Local name -> the torch path it stands for, from every import in the file (lazy
    imports inside functions too; a module is small enough that names do not clash)."""
    names = {}
    for node in imports:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch."):
                    if a.asname:
                        names[a.asname] = a.name
                    else:
                        names["torch"] = "torch"
        elif not node.level and node.module:
            if node.module == "torch" or node.module.startswith("torch."):
                for a in node.names:
                    if a.name != "*":
                        names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _path(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _path(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Call):  # one call deep: torch.cuda.current_stream().wait_event
        base = _path(node.func, aliases)
        return f"{base}()" if base and "()" not in base else None
    return None


def scan_source(text: str, where: str, paths: dict, names: dict) -> None:
    """Add one file's uses: ``paths`` (torch paths) and ``names`` (attribute names looked up
    on anything else), each a Use."""
    nodes, parent, todo = [], {}, [ast.parse(text, filename=where)]
    while todo:  # one walk, each node with its parent
        node = todo.pop()
        nodes.append(node)
        for child in ast.iter_child_nodes(node):
            parent[child] = node
            todo.append(child)
    imports = [n for n in nodes if isinstance(n, ast.Import | ast.ImportFrom)]
    aliases = _aliases(imports)

    def add(table, key, node):
        use = table.setdefault(key, Use())
        site = f"{where}:{node.lineno}"
        use.sites.append(site)
        up = parent.get(node)
        if isinstance(up, ast.Call) and up.func is node:
            for k in up.keywords:
                if k.arg:
                    use.keywords.add(k.arg)
                    use.keyword_sites.setdefault(k.arg, []).append(site)

    for node in imports:
        for a in node.names:
            full = a.name if isinstance(node, ast.Import) else f"{node.module}.{a.name}"
            if not getattr(node, "level", 0) and full.startswith("torch.") and a.name != "*":
                add(paths, full, node)
    for node in nodes:
        if not isinstance(node, ast.Name | ast.Attribute):
            continue
        up = parent.get(node)
        if isinstance(up, ast.Attribute) and up.value is node:
            continue  # the longer path is recorded
        p = _path(node, aliases)
        if p is not None:
            if p != "torch":
                add(paths, p, node)
        elif isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
            add(names, node.attr, node)


def scan(roots=ROOTS, base: Path = ROOT) -> tuple[dict, dict]:
    paths: dict[str, Use] = {}
    names: dict[str, Use] = {}
    for root in roots:
        top = base / root
        files = [top] if top.is_file() else sorted(top.rglob("*.py"))
        for f in files:
            where = f.relative_to(base).as_posix() if f.is_relative_to(base) else str(f)
            scan_source(f.read_text(), where, paths, names)
    for use in (*paths.values(), *names.values()):
        for sites in (use.sites, *use.keyword_sites.values()):
            sites.sort(key=lambda site: (site.rsplit(":", 1)[0], int(site.rsplit(":", 1)[1])))
    return paths, names


# ---- record ------------------------------------------------------------------------------


def _kind(obj) -> str:
    return {
        Module: "module",
        Defs: "function",
        Class: "class",
        Instance: "value",
        Value: "value",
    }.get(type(obj), "unknown")


# the classes whose methods are checked by name: Tensor, and those of the namespaces that
# run on CUDA only (Stream, Event, CUDAGraph, autograd's Function and its ctx, the profiler)
METHOD_CLASSES = ("torch.Tensor", "torch.cuda.", "torch.autograd.", "torch.profiler.")


def class_keys(reader: Reader, paths) -> dict[str, Class]:
    """The classes of METHOD_CLASSES that the used paths name or whose instances a used
    call returns (``torch.cuda.current_stream()``), each under the first such path."""
    cands = {p[: p.index("()") + 2] if "()" in p else p for p in paths} | {"torch.Tensor"}
    out, seen = {}, set()
    for key in sorted(cands):
        if key != "torch.Tensor" and not key.startswith(METHOD_CLASSES[1:]):
            continue
        obj = reader.resolve(key)
        cls = obj.of if isinstance(obj, Instance) and key.endswith("()") else obj
        if not isinstance(cls, Class) or (cls.module, cls.nodes[0].name) in seen:
            continue
        seen.add((cls.module, cls.nodes[0].name))
        out[key] = cls
    return out


def class_names(reader: Reader, cls: Class) -> set[str]:
    """Every attribute a class and its bases define (as the reader sees them)."""
    names, todo, seen = set(), [cls], set()
    while todo:
        c = todo.pop()
        if (c.module, c.nodes[0].name) in seen:
            continue
        seen.add((c.module, c.nodes[0].name))
        for node in c.nodes:
            for st in top_level(node.body):
                if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(st.name)
                elif isinstance(st, ast.Assign | ast.AnnAssign):
                    targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
        todo.extend(reader.bases(c))
    return names


def _installed_folder() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


@functools.cache
def installed_reader() -> Reader | None:
    """The installed torch, read from its files as a wheel is (once a process)."""
    folder = _installed_folder()
    return Reader(Files(folder=folder)) if folder is not None else None


def _installed_version(folder: Path) -> str | None:
    text = (folder / "torch" / "version.py").read_text()
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    return m.group(1) if m else None


def _runtime(path: str):
    """(exists, keywords) from the imported torch (``--installed``)."""
    obj = importlib.import_module("torch")
    parts = path.replace("()", ".()").split(".")
    for i, part in enumerate(parts[1:], 1):
        if part == "()":
            return None, None  # a call's result: the static reader's answer stands
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ModuleNotFoundError:
                return False, None
            except ImportError:  # a module whose own imports fail here
                return None, None
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return True, None
    ps = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in ps):
        return True, ANY
    return True, sorted(p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def record(files: Files, source: dict, paths: dict, names: dict, installed: bool = False) -> dict:
    reader = Reader(files)
    text = files.read("torch/version.py") or ""
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    out_paths = {}
    for p in sorted(paths):
        obj = reader.resolve(p)
        exists = None if obj == UNKNOWN else obj is not None
        kws = reader.keywords(obj) if exists else None
        if installed:  # the imported module answers what the files leave open
            rt_exists, rt_kws = _runtime(p)
            if exists is not None and rt_exists is not None and rt_exists != exists:
                print(f"warning: {p}: the files say {exists}, the import {rt_exists}")
            exists = rt_exists if exists is None else exists
            kws = rt_kws if kws is None and exists else kws
        entry = {"exists": exists, "kind": _kind(obj) if exists else None}
        if paths[p].keywords:
            entry["keywords"] = kws
        out_paths[p] = entry
    # methods by name: those the recorded class has, and those it lacks where a newer
    # torch's has them (the recording interpreter's own, read the same way)
    folder = _installed_folder()
    ref = installed_reader() if not installed else None
    ref_keys = class_keys(ref, paths) if ref else {}
    methods, absent = {}, {}
    for key, cls in class_keys(reader, paths).items():
        has = class_names(reader, cls)
        for n in sorted(set(names) & has):
            entry = {}
            if names[n].keywords:
                entry["keywords"] = reader.keywords(reader.class_attr(cls, n))
            methods[f"{key}.{n}"] = entry
        newer = class_names(ref, ref_keys[key]) if key in ref_keys else set()
        absent[key] = sorted((set(names) & newer) - has)  # also: the classes covered
    return {
        "about": "the torch API mgg uses, as this torch has it: bench/gpu/torch_api.py",
        "torch": m.group(1) if m else None,
        "source": source,
        "roots": list(ROOTS),
        "rerecord": RERECORD,
        "reference": _installed_version(folder) if ref else None,
        "paths": out_paths,
        "methods": methods,
        "methods_absent": absent,
    }


def dumps(manifest: dict) -> str:
    """Sorted and one entry a line: a small, stable diff when re-recorded."""
    lines = ["{"]
    keys = list(manifest)
    for i, k in enumerate(keys):
        v = manifest[k]
        comma = "," if i < len(keys) - 1 else ""
        if isinstance(v, dict) and k in ("paths", "methods", "methods_absent"):
            lines.append(f"  {json.dumps(k)}: {{")
            items = sorted(v.items())
            for j, (name, entry) in enumerate(items):
                c = "," if j < len(items) - 1 else ""
                lines.append(f"    {json.dumps(name)}: {json.dumps(entry, sort_keys=True)}{c}")
            lines.append(f"  }}{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- check -------------------------------------------------------------------------------


@dataclass
class Report:
    missing: list[str] = field(default_factory=list)  # uses the recorded torch lacks
    uncovered: list[str] = field(default_factory=list)  # uses the manifest has no word on
    unverified: list[str] = field(default_factory=list)  # the reader could not tell


def check(manifest: dict, paths: dict, names: dict, dev=None) -> Report:
    r = Report()
    version = manifest.get("torch")
    known = manifest["paths"]
    for p in sorted(paths):
        use = paths[p]
        site = use.sites[0]
        entry = known.get(p)
        if entry is None or (use.keywords and "keywords" not in entry):
            r.uncovered.append(f"{p}  ({site})")
            continue
        if entry["exists"] is False:
            r.missing.append(f"{p}: torch {version} has no such attribute  ({site})")
            continue
        if entry["exists"] is None:
            r.unverified.append(p)
            continue
        accepted = entry.get("keywords")
        if use.keywords and accepted is not None and accepted != ANY:
            bad = sorted(use.keywords - set(accepted))
            if bad:
                r.missing.append(
                    f"{p}({', '.join(k + '=' for k in bad)}): torch {version}'s signature "
                    f"takes no such keyword  ({use.site(bad)})"
                )
    dev = dev or installed_reader()
    if dev is None:
        r.unverified.append("(methods: no torch installed to tell which names are methods)")
        return r
    for key, cls in class_keys(dev, paths).items():
        absent = manifest["methods_absent"].get(key)
        if absent is None:
            r.uncovered.append(f"the methods of {key}")
            continue
        for n in sorted(set(names) & class_names(dev, cls)):
            use = names[n]
            site = use.sites[0]
            if n in absent:
                r.missing.append(f"{key}.{n}: torch {version} has no such method  ({site})")
                continue
            entry = manifest["methods"].get(f"{key}.{n}")
            if entry is None or (use.keywords and "keywords" not in entry):
                r.uncovered.append(f"{key}.{n}  ({site})")
                continue
            accepted = entry.get("keywords")
            if use.keywords and accepted is not None and accepted != ANY:
                # only the keywords the dev torch's method takes: ``a.sum(axis=0)`` on a
                # numpy array is no use of Tensor.sum
                dev_kws = dev.keywords(dev.class_attr(cls, n))
                wanted = use.keywords if dev_kws == ANY else use.keywords & set(dev_kws or ())
                bad = sorted(wanted - set(accepted))
                if bad:
                    r.missing.append(
                        f"{key}.{n}({', '.join(k + '=' for k in bad)}): torch {version}'s "
                        f"signature takes no such keyword  ({use.site(bad)})"
                    )
    return r


def print_report(r: Report, manifest: dict, out=None) -> int:
    out = out or sys.stdout
    v = manifest.get("torch")
    for line in r.missing:
        print(f"MISSING in torch {v}: {line}", file=out)
    if r.unverified:
        print(
            f"({len(r.unverified)} used paths the reader could not follow in torch {v}, "
            f"not checked: {', '.join(r.unverified)})",
            file=out,
        )
    if r.uncovered:
        print(
            f"NOT COVERED by the manifest (used since it was recorded): {len(r.uncovered)}",
            file=out,
        )
        for line in r.uncovered:
            print(f"  {line}", file=out)
        print(f"re-record it:\n  {manifest.get('rerecord', RERECORD)}", file=out)
    if not r.missing and not r.uncovered:
        print(f"ok: every torch use in {', '.join(manifest['roots'])} is in torch {v}", file=out)
    return 1 if r.missing else 2 if r.uncovered else 0


# ---- command line ------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("scan", help="the torch API used, with its sites")
    s.add_argument("--json", action="store_true")
    rec = sub.add_parser("record", help="write the manifest from a wheel or installed torch")
    how = rec.add_mutually_exclusive_group(required=True)
    how.add_argument("--wheel", type=Path)
    how.add_argument("--installed", action="store_true")
    rec.add_argument("-o", "--out", type=Path, default=MANIFEST)
    c = sub.add_parser("check", help="the current uses against the manifest")
    c.add_argument("--manifest", type=Path, default=MANIFEST)
    args = ap.parse_args(argv)

    paths, names = scan()
    if args.cmd == "scan":
        if args.json:
            table = {p: sorted(u.keywords) for p, u in sorted(paths.items())}
            print(json.dumps(table, indent=1))
        else:
            for p, u in sorted(paths.items()):
                kw = f"  keywords: {', '.join(sorted(u.keywords))}" if u.keywords else ""
                print(f"{p}  [{len(u.sites)}x, {u.sites[0]}]{kw}")
        return 0
    if args.cmd == "record":
        if args.wheel:
            files = Files(wheel=args.wheel)
            source = {
                "wheel": args.wheel.name,
                "sha256": _sha256(args.wheel),
                "bytes": args.wheel.stat().st_size,
            }
        else:
            folder = _installed_folder()
            if folder is None:
                raise SystemExit("record --installed: no torch installed")
            files = Files(folder=folder)
            source = {"installed": sys.executable, "python": sys.version.split()[0]}
        manifest = record(files, source, paths, names, installed=args.installed)
        args.out.write_text(dumps(manifest))
        n_missing = sum(e["exists"] is False for e in manifest["paths"].values())
        print(
            f"{args.out}: torch {manifest['torch']}, {len(manifest['paths'])} paths "
            f"({n_missing} absent), {len(manifest['methods'])} methods of "
            f"{len(manifest['methods_absent'])} classes"
        )
        return 0
    manifest = json.loads(args.manifest.read_text())
    return print_report(check(manifest, paths, names), manifest)


if __name__ == "__main__":
    sys.exit(main())
