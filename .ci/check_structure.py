"""Check qstream's structure: no private cross-module names, no import circle, small files.

Run from the repository root: ``python .ci/check_structure.py``. Exit status 1 lists every
finding. The rules:

* **private names**: a module may not import another module's ``_name`` nor reach into an
  ``obj._name`` that it does not define itself (``self``/``cls`` aside). NamedTuple's public
  ``_replace``/``_asdict``/``_fields``/``_make`` are not private.
* **import circles**: every ``import`` of a ``qstream`` module, at the top of a file or inside a
  function, is an edge; the graph of modules must have no cycle.
* **file size**: no file in ``qstream/`` over 500 lines, apart from the kernels named in
  ``WHOLE`` (one algorithm each).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qstream"
MAX_LINES = 500
# Kernels that are one algorithm each and stay whole (issue 28 allows it).
WHOLE = {"qstream/kernels/search.py"}
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


def findings(root: Path = ROOT, package: str = "qstream") -> list[str]:
    """Every finding for the package ``root/package``, one line each."""
    paths = sorted((root / package).rglob("*.py"))
    names = {module_name(p, root) for p in paths}
    modules = [Module(p, names, root) for p in paths]
    problems: list[str] = []
    graph: dict[str, set[str]] = {m.name: set() for m in modules}
    defined = {mod.name: {n for n in mod.own_names() if private(n)} for mod in modules}
    for mod in modules:
        elsewhere = set().union(*(v for k, v in defined.items() if k != mod.name))
        problems.extend(mod.private_uses(elsewhere, package))
        for target, _line in mod.imports(package):
            if target in names and target != mod.name:
                graph[mod.name].add(target)
        lines = len(mod.path.read_text().splitlines())
        if lines > MAX_LINES and mod.rel() not in WHOLE:
            problems.append(f"{mod.rel()}: {lines} lines (limit {MAX_LINES})")
    for component in cycles(graph):
        problems.append("import circle: " + " -> ".join(component))
    return problems


def main() -> int:
    problems = findings()
    for line in problems:
        print(line)
    print(f"{len(problems)} finding(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
