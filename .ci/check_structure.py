"""Check qstream's structure (and the command line's). Run from the repository root:
``python .ci/check_structure.py``; exit status 1 lists every finding. The rules:

* **private names**: a module may not import another module's ``_name`` nor reach into an
  ``obj._name`` that it does not define itself (``self``/``cls`` aside).
* **import circles**: every import of a qstream module, at the top of a file or inside a
  function, is an edge; neither the graph of modules nor that of folders (top folders, and
  every folder) may have a cycle.
* **layers**: a folder imports only from the folders after it in :data:`LAYERS` (README,
  "Where the code lives"); inside ``io`` and ``engine`` likewise.
* **faces**: another folder's code is imported from that folder's package, and only the names
  its ``__init__.py`` lists in ``__all__`` (a heavy submodule listed there loads on demand);
  a face never binds the name of one of its own submodules.
* **shape**: at most :data:`MAX_WIDTH` modules a folder, :data:`MAX_DEPTH` levels, and
  :data:`MAX_LINES` lines a file, with no exemption.
* **names**: two modules of one name must be one concept at two layers (:data:`SHARED`).
* **front end**: ``cli/`` imports only ``qstream``'s public names; the library imports neither
  ``cli`` nor typer nor rich.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qstream"
MAX_LINES = 500
MAX_WIDTH = 20  # modules in one folder, its __init__.py counted
MAX_DEPTH = 4  # path parts: qstream/io/outputs/qarray.py
# The documented layers (README, "Where the code lives"), highest first: a folder imports only
# from folders after it. "" is the package itself; "base" its top-level modules (errors,
# qtypes, rounding, paths, budget): the vocabulary every layer uses.
LAYERS = {
    "": [
        "api",
        "workflows",
        "viz",
        "exports",
        "engine",
        "io",
        "compat",
        "calibration",
        "spec",
        "core",
        "kernels",
        "base",
    ],
    "io": ["outputs", "checkpoints", "storage", "zarr_types"],
    "engine": ["base", "convert", "jobs", "blocks", "run"],
}
# Module names used twice: one concept at two layers (the kernel and the code that calls it,
# the API function and its command).
SHARED = {
    "affine": "the affine map: its NumPy-level entry (core) and its kernels",
    "packing": "sub-byte packing: byte sizes (io.storage) and the kernels",
    "rounding": "round modes: their names (qstream.rounding) and the kernels",
    "stats": "statistics: the mergeable records (spec) and the kernels that gather them",
    "views": "calibration views: the data (spec.views) and the API that makes them",
    "convert": "checkpoint conversion: the API function and the command",
    "warmup": "kernel compilation ahead of need: the engine's and the command",
}
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(current: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module name of a (possibly relative) import."""
    if level == 0:
        return target or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORE


class Module:
    def __init__(self, path: Path, modules: set[str], root: Path = ROOT) -> None:
        self.path = path
        self.root = root
        self.name = module_name(path, root)
        self.is_package = path.name == "__init__.py"
        self.tree = ast.parse(path.read_text(), str(path))
        self.modules = modules

    def rel(self) -> str:
        return str(self.path.relative_to(self.root))

    def own_names(self) -> set[str]:
        """Every name this module defines: functions, classes, attributes, assignments."""
        names: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # __slots__ entries and getattr/setattr by name
                names.add(node.value)
        return names

    def imports(self, package: str = "qstream") -> list[tuple[str, int]]:
        """(module, line) for every import of one of ``package``'s modules."""
        found = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package:
                        found.append((alias.name, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = resolve(self.name, self.is_package, node.level, node.module)
                if base.split(".")[0] != package:
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.append((sub if sub in self.modules else base, node.lineno))
        return found

    def private_uses(self, elsewhere: set[str], package: str = "qstream") -> list[str]:
        """Private names this module takes from another qstream module.

        ``elsewhere`` holds the private names qstream's other modules define; an ``x._name``
        that no qstream module defines belongs to a third-party library and is not checked.
        """
        problems = []
        own = self.own_names()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom):
                base = resolve(self.name, self.is_package, node.level, node.module)
                if base.split(".")[0] != package:
                    continue
                for alias in node.names:
                    if private(alias.name) and f"{base}.{alias.name}" not in self.modules:
                        problems.append(
                            f"{self.rel()}:{node.lineno}: imports private {base}.{alias.name}"
                        )
            elif isinstance(node, ast.Attribute) and private(node.attr):
                value = node.value
                if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                    continue
                if node.attr in own or node.attr not in elsewhere:
                    continue
                problems.append(
                    f"{self.rel()}:{node.lineno}: uses private {ast.unparse(node)} "
                    "defined elsewhere"
                )
        return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def parents(name: str) -> set[str]:
    """A package's __init__ runs before its submodules: importing a.b.c imports a and a.b."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def folder_of(name: str, packages: set[str]) -> str:
    """The folder (package) a module lives in; a package is its own folder."""
    return name if name in packages else name.rsplit(".", 1)[0]


def inside(folder: str, outer: str) -> bool:
    """Whether ``folder`` is ``outer`` or one of its sub-folders."""
    return folder == outer or folder.startswith(outer + ".")


def face_names(mod: Module) -> set[str]:
    """A package's ``__all__`` (the string literals of its value)."""
    for node in mod.tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return {
                n.value
                for n in ast.walk(node.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            }
    return set()


def layer(name: str, layers: list[str], base: str) -> str | None:
    """The layer of a module below the package ``base``: its first folder, or "base" for the
    modules at the top of ``base`` (None: ``base``'s own face)."""
    rest = name[len(base) + 1 :].split(".") if name != base else []
    if not rest:
        return None
    return rest[0] if rest[0] in layers else "base"


def layer_findings(
    modules: list[Module], graph: dict[str, set[str]], package: str, rules: dict[str, list[str]]
) -> list[str]:
    """Imports against a documented layer list: ``rules[prefix]`` lists the folders directly
    below ``prefix``, highest first; a module imports only from its own layer or a later one."""
    problems = []
    by_name = {m.name: m for m in modules}
    for prefix, order in rules.items():
        full = package if prefix == "" else f"{package}.{prefix}"
        for a, targets in sorted(graph.items()):
            if not inside(a, full) or a == full:
                continue
            la = layer(a, order, full)
            for b in sorted(targets):
                if not inside(b, full) or b == full:
                    continue
                lb = layer(b, order, full)
                if la is None or lb is None or la == lb:
                    continue
                if order.index(la) > order.index(lb):
                    problems.append(
                        f"{by_name[a].rel()}: imports {b} upward ({la} may not import {lb};"
                        f" the layers of {full}: {' > '.join(order)})"
                    )
    return problems


def face_findings(modules: list[Module], packages: set[str], package: str) -> list[str]:
    """Imports that reach into a folder the importer is outside of past its face: another
    folder's code is imported from that folder's package, and only the names its ``__all__``
    lists (a submodule listed there is loaded on demand and may be imported from)."""
    faces = {m.name: face_names(m) for m in modules if m.is_package}
    problems = []
    for mod in modules:
        if mod.is_package:
            for node in mod.tree.body:
                if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                    for alias in node.names:
                        name = alias.asname or alias.name
                        if f"{mod.name}.{name}" in mod.modules:
                            problems.append(
                                f"{mod.rel()}:{node.lineno}: the face binds {name!r}, the name of"
                                f" its submodule {mod.name}.{name}: rename one"
                            )
        if mod.name == package:
            continue  # the package's own face loads each public name from where it is defined
        mine = folder_of(mod.name, packages)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.ImportFrom):
                target = resolve(mod.name, mod.is_package, node.level, node.module)
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names if a.name.split(".")[0] == package]
                if not found or found[0] == package:
                    continue
                target, names = found[0], []
            else:
                continue
            if target.split(".")[0] != package or target not in mod.modules:
                continue
            folder = folder_of(target, packages)
            if inside(mine, folder):
                continue
            if target in packages:
                for name in names:
                    if name not in faces.get(target, set()):
                        problems.append(
                            f"{mod.rel()}:{node.lineno}: imports {target}.{name}, which the"
                            f" face of {target} (its __all__) does not list"
                        )
            elif target.rsplit(".", 1)[1] not in faces.get(folder, set()):
                problems.append(
                    f"{mod.rel()}:{node.lineno}: imports from {target}, past the face of"
                    f" {folder} (import from {folder}, or list the module in its __all__)"
                )
    return problems


def folder_circles(graph: dict[str, set[str]], packages: set[str], depth: int) -> list[str]:
    """Circles between folders, cut at ``depth`` levels (2: qstream.io <-> qstream.spec; 0:
    every folder, sub-folders included). A folder and the folders inside it are one."""
    folders: dict[str, set[str]] = {}
    for a, targets in graph.items():
        fa = folder_of(a, packages)
        fa = ".".join(fa.split(".")[:depth]) if depth else fa
        for b in targets:
            fb = folder_of(b, packages)
            fb = ".".join(fb.split(".")[:depth]) if depth else fb
            if not inside(fa, fb) and not inside(fb, fa):
                folders.setdefault(fa, set()).add(fb)
    return ["circle between folders: " + " -> ".join(c) for c in cycles(folders)]


def unique_names(modules: list[Module], shared: dict[str, str]) -> list[str]:
    """Two modules of one name must be one concept at two layers (named in ``shared``)."""
    seen: dict[str, list[str]] = {}
    for mod in modules:
        if not mod.is_package:
            seen.setdefault(mod.name.rsplit(".", 1)[1], []).append(mod.rel())
    return [
        f"module name {leaf!r} is used by {', '.join(paths)}: rename one, or say in SHARED"
        " which concept they share"
        for leaf, paths in sorted(seen.items())
        if len(paths) > 1 and leaf not in shared
    ]


def shape_findings(root: Path, package: str) -> list[str]:
    """Folders wider than MAX_WIDTH modules, paths deeper than MAX_DEPTH, files over MAX_LINES."""
    problems = []
    for folder in sorted(p for p in (root / package).rglob("*") if p.is_dir()):
        n = len(list(folder.glob("*.py")))
        if n > MAX_WIDTH:
            problems.append(f"{folder.relative_to(root)}/: {n} modules (limit {MAX_WIDTH})")
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root)
        if len(rel.parts) > MAX_DEPTH:
            problems.append(f"{rel}: {len(rel.parts)} levels deep (limit {MAX_DEPTH})")
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"{rel}: {lines} lines (limit {MAX_LINES})")
    return problems


def load(root: Path, package: str) -> tuple[list[Module], set[str]]:
    """The package's modules, and the names of its packages (folders)."""
    paths = sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    names = {module_name(p, root) for p in paths}
    modules = [Module(p, names, root) for p in paths]
    return modules, {m.name for m in modules if m.is_package}


def import_graph(modules: list[Module], package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top or inside a function)."""
    names = {m.name for m in modules}
    graph: dict[str, set[str]] = {m.name: set() for m in modules}
    for mod in modules:
        for target, _line in mod.imports(package):
            if target in names and target != mod.name:
                graph[mod.name].add(target)
    return graph


def findings(
    root: Path = ROOT,
    package: str = "qstream",
    *,
    rules: dict[str, list[str]] | None = None,
    shared: dict[str, str] | None = None,
) -> list[str]:
    """Every finding for the package ``root/package``, one line each."""
    modules, packages = load(root, package)
    problems: list[str] = []
    defined = {mod.name: {n for n in mod.own_names() if private(n)} for mod in modules}
    for mod in modules:
        elsewhere = set().union(*(v for k, v in defined.items() if k != mod.name))
        problems.extend(mod.private_uses(elsewhere, package))
    graph = import_graph(modules, package)
    problems += shape_findings(root, package)
    for component in cycles(graph):
        problems.append("import circle: " + " -> ".join(component))
    problems += folder_circles(graph, packages, 2)
    problems += [p for p in folder_circles(graph, packages, 0) if p not in problems]
    problems += layer_findings(modules, graph, package, LAYERS if rules is None else rules)
    problems += face_findings(modules, packages, package)
    problems += unique_names(modules, SHARED if shared is None else shared)
    return problems


def front_end_findings(
    root: Path = ROOT, front: str = "cli", package: str = "qstream"
) -> list[str]:
    """The command line imports only the library's public names (``import qstream``, ``from
    qstream import <a name it exports>``), and the library imports neither the command line
    nor its toolkits (typer, rich)."""
    init = Module(root / package / "__init__.py", set(), root)
    public = face_names(init) | {
        n.value
        for node in ast.walk(init.tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
        for n in ast.walk(node.value)
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    problems = []
    for path in sorted((root / front).rglob("*.py")):
        mod = Module(path, set(), root)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package and alias.name != package:
                        problems.append(f"{mod.rel()}:{node.lineno}: imports {alias.name}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] != package:
                    continue
                if node.module != package:
                    problems.append(f"{mod.rel()}:{node.lineno}: imports from {node.module}")
                    continue
                for alias in node.names:
                    if alias.name not in public:
                        problems.append(
                            f"{mod.rel()}:{node.lineno}: imports {alias.name}, not a public"
                            f" name of {package}"
                        )
    for path in sorted((root / package).rglob("*.py")):
        mod = Module(path, set(), root)
        for node in ast.walk(mod.tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = [node.module]
            for m in mods:
                if m.split(".")[0] in (front, "typer", "rich"):
                    problems.append(f"{mod.rel()}:{node.lineno}: the library imports {m}")
    return problems


def main() -> int:
    problems = findings()
    if (ROOT / "cli").is_dir():
        problems += findings(ROOT, "cli", rules={}, shared={}) + front_end_findings()
    for line in problems:
        print(line)
    print(f"{len(problems)} finding(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
