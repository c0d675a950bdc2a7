"""minengine's imports go one way: no module imports, even indirectly, a module that imports it.

Every import of a minengine module counts, wherever it is written: at module level, under
``if TYPE_CHECKING:``, or inside a function (a deferred import). The interpreter tolerates a circle hidden
behind the last two, but a reader does not: a type-only or deferred import still says "this module needs
that one", and a circle of them is the tangle the one-way layout (``docs/reading_order.md``) forbids. The
import graph is read from the source with ``ast`` (nothing is imported); ``importlib`` calls by name (the lazy
exports of ``minengine/__init__.py``) are not seen, and importing ``a.b.c`` is not counted as importing the
packages ``a`` and ``a.b`` (Python runs their ``__init__`` first, but they import nothing of their own here).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "minengine"


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package_dir`` (a package is its ``__init__``)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imported_modules(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that ``module`` imports anywhere in its source (itself excluded)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # ``from pkg import name``: the submodule ``pkg.name`` if there is one, else ``pkg`` itself
            candidates = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in modules:  # ``import a.b.c`` of a name inside a module
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(package_dir: Path = PACKAGE_DIR) -> dict[str, set[str]]:
    modules = module_names(package_dir)
    return {m: imported_modules(m, p, modules) for m, p in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle as one path ``[a, b, ..., a]``, one per strongly connected component of more than one
    module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_path_through(component, graph) for component in components]


def _path_through(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest circle inside ``component`` from its first module back to it (breadth-first)."""
    start = min(component)
    parent, frontier = {start: start}, [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if child not in parent:
                    parent[child] = node
                    next_frontier.append(child)
        frontier = next_frontier
    raise AssertionError(f"no circle in {sorted(component)}")  # not strongly connected: a bug above


def test_no_import_cycles():
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles (TYPE_CHECKING and deferred imports count):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The checker itself can fail: a toy package with a type-only circle, a deferred one and a relative one
    (outside imports and acyclic ones are not reported)."""
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    from toy.b import B\n",
        "b.py": "from toy.a import thing\n",
        "c.py": "def f():\n    from toy import d\n",
        "d.py": "import toy.c\n",
        "e.py": "from toy.a import thing\n",  # into a circle, not part of one
        "sub/__init__.py": "",
        "sub/f.py": "from . import g\n",
        "sub/g.py": "from ..sub.f import x\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["toy.a"] == {"toy.b"} and graph["toy.c"] == {"toy.d"} and graph["toy.sub.f"] == {"toy.sub.g"}
    assert sorted(import_cycles(graph)) == [["toy.a", "toy.b", "toy.a"], ["toy.c", "toy.d", "toy.c"],
                                            ["toy.sub.f", "toy.sub.g", "toy.sub.f"]]
