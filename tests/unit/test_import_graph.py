"""No import circles between prfaas modules, counting every import: top-level, function-level and
``if TYPE_CHECKING:`` ones (a circle hidden in a function or behind TYPE_CHECKING is still two
modules that each need the other).

The graph is read from the source with ``ast`` (nothing is imported): an edge goes from a module
to the most specific prfaas module an import names (``from prfaas.a import b`` is an edge to
``prfaas.a.b`` when that is a module, else to the package ``prfaas.a``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "prfaas"


def _module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: Path, root: str) -> dict[str, Path]:
    """Every module of package ``root`` under the source folder ``src``, by dotted name."""
    return {_module_name(src, p): p for p in sorted((src / root).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a prfaas module (None: not ours)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def _imported_names(module: str, path: Path, tree: ast.Module) -> list[str]:
    """Every dotted name an import statement in ``tree`` brings in, anywhere in the file."""
    is_package = path.name == "__init__.py"
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative: a package counts itself as level 1, a module its parent package.
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # ``from a import b``: b may be a submodule (edge to a.b) or a name in a (edge to a).
            names.extend(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def import_graph(src: Path = SRC, root: str = ROOT) -> dict[str, set[str]]:
    """module -> the modules of ``root`` it imports (itself left out)."""
    known = modules(src, root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for imported in _imported_names(name, path, tree):
            target = _resolve(imported, known)
            if target is not None and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative), each
    as one circle through its members, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop(0)
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    components.append(_circle(graph, set(members)))
    return sorted(components)


def _circle(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """One shortest circle through the component's first member (breadth-first), closed."""
    start = min(members)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # a component always has one


@pytest.mark.timeout(60)
def test_no_import_circles() -> None:
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.timeout(60)
def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The reader counts function-level, TYPE_CHECKING and relative imports, and names a circle."""
    package = tmp_path / "pkg"
    package.mkdir()
    sources = {
        "__init__.py": "",
        "a.py": "def f():\n    from pkg import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n",
        "c.py": "import pkg.a\nX = 1\n",
        "d.py": "from . import a\n",
    }
    for name, text in sources.items():
        (package / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
