"""Reading a torch's Python sources and type stubs without importing it: from a wheel (a
zip) or an installed package's folder, following imports, ``import *``, classes' bases
and return annotations (bench/gpu/torch_api.py records its manifests with it)."""

from __future__ import annotations

import ast
import zipfile
from dataclasses import dataclass
from pathlib import Path

ANY = "any"  # a signature with **kwargs: every keyword passes


class Files:
    """A torch's files: the wheel (a zip) or the installed package's folder."""

    def __init__(self, wheel: Path | None = None, folder: Path | None = None):
        if wheel is not None:
            self.zip = zipfile.ZipFile(wheel)
            self.names = set(self.zip.namelist())
        else:
            self.zip, self.folder = None, folder

    def read(self, rel: str) -> str | None:
        if self.zip is not None:
            return self.zip.read(rel).decode() if rel in self.names else None
        p = self.folder / rel
        return p.read_text() if p.is_file() else None


@dataclass
class Module:
    name: str


@dataclass
class Defs:
    """A function: its def nodes (overloads, .py and .pyi) and the module they sit in."""

    nodes: list
    module: str


@dataclass
class Class:
    nodes: list  # ClassDef nodes (.py and .pyi)
    module: str


@dataclass
class Instance:
    of: Class


@dataclass
class Value:
    """Something that exists but that the reader cannot look into."""

    why: str = ""


UNKNOWN = "unknown"  # the reader cannot tell (a dynamic attribute, an unresolved chain)


def top_level(body):
    """Statements at module or class level, into if/try/with blocks (both branches)."""
    for node in body:
        if isinstance(node, ast.If | ast.With | ast.For):
            yield from top_level(node.body)
            yield from top_level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            yield from top_level(node.body)
            for h in node.handlers:
                yield from top_level(h.body)
            yield from top_level(node.orelse)
            yield from top_level(node.finalbody)
        else:
            yield node


class Reader:
    def __init__(self, files: Files):
        self.files = files
        self._modules: dict[str, list | None] = {}
        self._ns: dict[str, dict] = {}

    # modules ---------------------------------------------------------------------------
    def _trees(self, mod: str) -> list | None:
        """(tree, is_package) of mod's .pyi and .py files; None when mod has none."""
        if mod not in self._modules:
            rel = mod.replace(".", "/")
            found = []
            for cand, pkg in (
                (f"{rel}.pyi", False),
                (f"{rel}/__init__.pyi", True),
                (f"{rel}.py", False),
                (f"{rel}/__init__.py", True),
            ):
                text = self.files.read(cand)
                if text is not None:
                    found.append((ast.parse(text), pkg))
            self._modules[mod] = found or None
        return self._modules[mod]

    def is_module(self, mod: str) -> bool:
        return self._trees(mod) is not None

    def namespace(self, mod: str) -> dict[str, list]:
        """name -> its bindings in mod, in order: ("def", node) ("class", node)
        ("assign", node) ("from", module, name) ("module", module); "*" -> the modules it
        star-imports; "__getattr__" -> a module-level __getattr__'s def node."""
        if mod in self._ns:
            return self._ns[mod]
        ns: dict[str, list] = {}
        self._ns[mod] = ns
        for tree, pkg in self._trees(mod) or []:
            package = mod if pkg else mod.rpartition(".")[0]
            for node in top_level(tree.body):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    ns.setdefault(node.name, []).append(("def", node))
                elif isinstance(node, ast.ClassDef):
                    ns.setdefault(node.name, []).append(("class", node))
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name):
                                ns.setdefault(n.id, []).append(("assign", node))
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.asname:
                            ns.setdefault(a.asname, []).append(("module", a.name))
                        else:
                            top = a.name.split(".")[0]
                            ns.setdefault(top, []).append(("module", top))
                elif isinstance(node, ast.ImportFrom):
                    src = node.module or ""
                    if node.level:
                        up = package.split(".")
                        up = up[: len(up) - node.level + 1]
                        src = ".".join(up + ([node.module] if node.module else []))
                    for a in node.names:
                        if a.name == "*":
                            ns.setdefault("*", []).append(src)
                        else:
                            ns.setdefault(a.asname or a.name, []).append(("from", src, a.name))
        return ns

    def _all(self, mod: str) -> set[str] | None:
        for kind, *rest in self.namespace(mod).get("__all__", []):
            node = rest[0]
            if kind == "assign" and isinstance(node.value, ast.List | ast.Tuple):
                return {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        return None

    def _dynamic(self, mod: str, name: str):
        """A module's __getattr__: the name among the strings it (and the module-level
        literals it reads) names: it exists; else absent where it raises AttributeError."""
        ns = self.namespace(mod)
        defs = [b[1] for b in ns.get("__getattr__", []) if b[0] == "def"]
        if not defs:
            return None
        strings, raises = set(), False
        for d in defs:
            for n in ast.walk(d):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    strings.add(n.value)
                elif isinstance(n, ast.Name):
                    for kind, *rest in ns.get(n.id, []):
                        if kind == "assign":
                            for m in ast.walk(rest[0]):
                                if isinstance(m, ast.Constant) and isinstance(m.value, str):
                                    strings.add(m.value)
                elif isinstance(n, ast.Raise) and "AttributeError" in ast.unparse(n):
                    raises = True
        if name in strings:
            return Value("module __getattr__")
        return None if raises else UNKNOWN

    # lookups -------------------------------------------------------------------------
    def lookup(self, mod: str, name: str, seen=None):
        """What ``mod.name`` is: Module, Defs, Class, Instance, Value, UNKNOWN or None."""
        seen = set() if seen is None else seen
        if (mod, name) in seen:
            return None
        seen.add((mod, name))
        if self.is_module(f"{mod}.{name}"):
            return Module(f"{mod}.{name}")
        bindings = self.namespace(mod).get(name, [])
        defs = [b[1] for b in bindings if b[0] == "def"]
        classes = [b[1] for b in bindings if b[0] == "class"]
        if classes:
            return Class(classes, mod)
        if defs:
            return Defs(defs, mod)
        for kind, *rest in bindings:
            if kind == "module":
                return Module(rest[0]) if self.is_module(rest[0]) else Value("module")
            if kind == "from":
                src, orig = rest
                if self.is_module(f"{src}.{orig}"):
                    return Module(f"{src}.{orig}")
                if self.is_module(src):
                    found = self.lookup(src, orig, seen)
                    if found is not None:
                        return found
                else:
                    return UNKNOWN  # from an extension or another package
        for kind, *rest in bindings:
            if kind == "assign":
                return self._assigned(rest[0], mod)
        for src in self.namespace(mod).get("*", []):
            public = self._all(src)
            if (name in public) if public is not None else not name.startswith("_"):
                found = self.lookup(src, name, seen) if self.is_module(src) else UNKNOWN
                if found is not None:
                    return found
        return self._dynamic(mod, name)

    def _assigned(self, node, mod: str):
        value = node.value
        if isinstance(node, ast.AnnAssign):
            t = self.resolve_expr(node.annotation, mod)
            if isinstance(t, Class):
                return Instance(t)
        if isinstance(value, ast.Name | ast.Attribute):
            found = self.resolve_expr(value, mod)
            if found is not None and found != UNKNOWN:
                return found
        if isinstance(value, ast.Call):
            f = self.resolve_expr(value.func, mod)
            if isinstance(f, Class):
                return Instance(f)
        return Value("assigned")

    def resolve_expr(self, expr, mod: str):
        """A name or attribute chain as written in module mod."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):  # X | None
            return self.resolve_expr(expr.left, mod) or self.resolve_expr(expr.right, mod)
        if isinstance(expr, ast.Name):
            if expr.id in ("None", "object"):
                return None
            return self.lookup(mod, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve_expr(expr.value, mod)
            return self.attribute(base, expr.attr) if base is not None else None
        return None

    def class_attr(self, cls: Class, name: str, seen=None):
        seen = set() if seen is None else seen
        key = (cls.module, cls.nodes[0].name)
        if key in seen:
            return None
        seen.add(key)
        for node in cls.nodes:
            for st in top_level(node.body):
                if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef) and st.name == name:
                    return Defs(_members(cls, name), cls.module)
                if isinstance(st, ast.ClassDef) and st.name == name:
                    return Class([st], cls.module)
                if isinstance(st, ast.Assign | ast.AnnAssign):
                    targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                    if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                        return self._assigned(st, cls.module)
        for base in self.bases(cls):
            found = self.class_attr(base, name, seen)
            if found is not None:
                return found
        return None

    def bases(self, cls: Class) -> list[Class]:
        out = []
        for node in cls.nodes:
            for b in node.bases:
                if isinstance(b, ast.Subscript):
                    b = b.value
                found = self.resolve_expr(b, cls.module)
                if isinstance(found, Class):
                    out.append(found)
        return out

    def attribute(self, base, name: str):
        if isinstance(base, Module):
            return self.lookup(base.name, name)
        if isinstance(base, Class):
            return self.class_attr(base, name)
        if isinstance(base, Instance):
            return self.class_attr(base.of, name)
        return UNKNOWN

    def returns(self, defs: Defs):
        for node in defs.nodes:
            if node.returns is not None:
                t = self.resolve_expr(node.returns, defs.module)
                if isinstance(t, Class):
                    return Instance(t)
        return UNKNOWN

    def resolve(self, path: str):
        """A used path (``torch.cuda.current_stream().wait_stream``) in this torch."""
        parts = path.replace("()", ".()").split(".")
        if parts[0] != "torch":
            return None
        obj = Module("torch")
        for part in parts[1:]:
            if part == "()":
                if isinstance(obj, Class):
                    obj = Instance(obj)
                elif isinstance(obj, Defs):
                    obj = self.returns(obj)
                else:
                    obj = UNKNOWN
            else:
                obj = self.attribute(obj, part)
            if obj is None or obj == UNKNOWN:
                return obj
        return obj

    def keywords(self, obj) -> list[str] | str | None:
        """The keywords a call of obj accepts: a sorted list, ANY, or None (unknown)."""
        if isinstance(obj, Defs):
            return _accepted(obj.nodes, method=_is_method(obj))
        if isinstance(obj, Class):
            for name in ("__init__", "__new__"):
                init = self.class_attr(obj, name)
                if isinstance(init, Defs):
                    return _accepted(init.nodes, method=True)
            return None
        return None


def _members(cls: Class, name: str) -> list:
    return [
        st
        for node in cls.nodes
        for st in top_level(node.body)
        if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef) and st.name == name
    ]


def _is_method(defs: Defs) -> bool:
    a = defs.nodes[0].args
    first = (a.posonlyargs + a.args)[:1]
    return bool(first) and first[0].arg in ("self", "cls")


def _accepted(nodes, method: bool) -> list[str] | str:
    names = set()
    for node in nodes:
        a = node.args
        if a.kwarg is not None:
            return ANY
        args = a.args[1:] if method and not a.posonlyargs else a.args
        for arg in args + a.kwonlyargs:
            if not (arg.arg.startswith("__") and not arg.arg.endswith("__")):
                names.add(arg.arg)
    return sorted(names)
