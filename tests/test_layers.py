"""The house's rules, held to the code: imports run only downward through the layers
docs/architecture.md writes down, no modules import each other in a circle, no module
passes MAX_LINES, and each knob's default is written once, in mgg/knobs.py."""

import ast
import re
from pathlib import Path

from mgg.knobs import SPECS

from conftest import ROOT

PACKAGE = ROOT / "mgg"


def layers() -> dict[str, int]:
    """{top-level module of mgg: its layer}, from the block under '## Layers' in
    docs/architecture.md (one line per layer, bottom first: 'N  name name ...')."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("\n## Layers", 1)[1].split("```", 2)[1]
    out = {}
    for line in block.splitlines():
        m = re.match(r"\s*(\d+)\s+([\w ]+)$", line)
        if m:
            out.update({name: int(m.group(1)) for name in m.group(2).split()})
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str | None = None):
    """(line, imported module) of every import of mgg in ``path`` (the module ``name``,
    default its own), lazy ones too."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "mgg" or target.startswith("mgg."):
                # from . import x: the submodule x, or a name of the package's own
                folder = ROOT.joinpath(*target.split("."))
                for alias in node.names:
                    sub = folder / alias.name
                    is_module = sub.is_dir() or sub.with_suffix(".py").exists()
                    yield node.lineno, f"{target}.{alias.name}" if is_module else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mgg."):
                    yield node.lineno, alias.name


def top(module: str) -> str:
    """mgg.partition.plan -> partition; mgg itself (its __init__: process only) -> ''."""
    return module.split(".")[1] if "." in module else ""


def test_every_module_has_a_layer_and_imports_only_downward():
    layer = layers()
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    tops = {t for t in tops if t != "__init__" and t != "__pycache__" and not t.startswith(".")}
    assert tops == set(layer), f"modules without a layer (or gone): {tops ^ set(layer)}"
    layer[""] = 0
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        src = module_name(path)
        if src == "mgg":
            continue
        for line, target in imports(path):
            a, b = top(src), top(target)
            if layer[b] > layer[a]:
                upward.append(f"{path.relative_to(ROOT)}:{line} {a} (layer {layer[a]}) -> {b}")
    assert not upward, "imports running upward:\n" + "\n".join(upward)


def test_the_layer_check_sees_a_lazy_upward_import(tmp_path):
    """A function-level import counts: partition importing train is upward."""
    fake = tmp_path / "plan.py"
    fake.write_text("def f():\n    from ..train import Trainer\n")
    found = list(imports(fake, "mgg.partition.plan"))
    assert found == [(2, "mgg.train")]
    layer = layers()
    assert layer["train"] > layer["partition"]


def import_graph() -> dict[str, set[str]]:
    """{module of mgg: the modules of mgg it imports, lazy imports too}."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        src = module_name(path)
        graph.setdefault(src, set()).update(t for _, t in imports(path) if t != src)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one
    module (Tarjan's, without recursion)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, targets = work[-1]
            w = next((t for t in targets if t in graph), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    found.append(sorted(part))
    return found


def test_no_modules_import_each_other_in_a_circle():
    """Not even through a lazy import: each module of mgg sits below those it imports."""
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_sees_a_lazy_circle():
    graph = {"mgg.a": {"mgg.b"}, "mgg.b": {"mgg.c"}, "mgg.c": {"mgg.a"}, "mgg.d": {"mgg.a"}}
    assert circles(graph) == [["mgg.a", "mgg.b", "mgg.c"]]
    assert circles({"mgg.a": {"mgg.b"}, "mgg.b": set()}) == []


MAX_LINES = 600
# modules over MAX_LINES while they are split, by path (train.py, memory.py and
# comm/mpi.py were, until they landed)
OVER_MAX_LINES: set[str] = set()


def test_no_module_passes_max_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    over = {p: n for p, n in long.items() if p not in OVER_MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concept): {over}"


def test_each_knob_default_is_written_once():
    """Outside mgg/knobs.py, no parameter named after a knob has a literal default, and no
    ``.get('ps', 16)`` or ``getattr(x, 'ps', 16)`` supplies one (None, 'auto', is fine)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "knobs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                pairs = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults, strict=True))
                pairs += [
                    (k, d)
                    for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                    if d is not None
                ]
                for arg, default in pairs:
                    if arg.arg in SPECS and _literal(default):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {arg.arg}=")
            elif isinstance(node, ast.Call) and len(node.args) >= 2:
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                args = node.args[1:] if name == "getattr" else node.args
                if name in ("get", "getattr", "setdefault") and len(args) >= 2:
                    key, default = args[0], args[1]
                    if isinstance(key, ast.Constant) and key.value in SPECS and _literal(default):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {key.value}")
    assert not found, "knob defaults written outside mgg/knobs.py:\n" + "\n".join(found)


def _literal(node) -> bool:
    """A literal default other than None (a kw-only argument without one has None)."""
    return isinstance(node, ast.Constant) and node.value is not None


def test_each_job_default_is_written_once():
    """From the job's layer up (where a job is made, planned and run), no parameter named
    after one of mgg.job.Job's parameters with a value default (model, optimizer,
    output_rows, design, backend) has a literal one, nor does a ``.get``/``getattr`` or a
    flag's ``default=``: they read Job's."""
    from dataclasses import fields

    from mgg.job import Job

    named = {f.name for f in fields(Job) if isinstance(f.default, str)}
    assert named >= {"model", "optimizer", "output_rows", "design", "backend"}
    layer = layers()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "job.py" or layer.get(top(module_name(path)), 0) < layer["job"]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                pairs = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults, strict=True))
                pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
                bad = [arg.arg for arg, d in pairs if arg.arg in named and _text(d)]
                found += [f"{where} {name}=" for name in bad]
            elif isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                args = node.args[1:] if name == "getattr" else node.args
                if name in ("get", "getattr", "setdefault") and len(args) >= 2:
                    key = args[0]
                    if isinstance(key, ast.Constant) and key.value in named and _text(args[1]):
                        found.append(f"{where} {key.value}")
                if name == "add_argument" and node.args and isinstance(node.args[0], ast.Constant):
                    dest = str(node.args[0].value).lstrip("-").replace("-", "_")
                    for kw in node.keywords:
                        if kw.arg == "default" and dest in named and _text(kw.value):
                            found.append(f"{where} {node.args[0].value}")
    assert not found, "job defaults written outside mgg/job.py:\n" + "\n".join(found)


def test_the_machine_facts_import_only_errors():
    """mgg.memory (what a rank has) is asked by every layer: it imports nothing of mgg
    but mgg.errors."""
    path = PACKAGE / "memory.py"
    assert {target for _, target in imports(path)} <= {"mgg.errors"}


def _text(node) -> bool:
    """A non-empty literal string."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(node.value)
