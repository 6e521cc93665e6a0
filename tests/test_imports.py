"""The import graph of dapq: no cycle, function-local imports included; the library core stands alone."""

from __future__ import annotations

import ast
from pathlib import Path

import dapq

SRC = Path(dapq.__file__).parent
#: The library: what a user of ``dapq.generate`` / ``dapq.compress`` imports. It must not reach the
#: benchmarks, the analyses, the integrations, the run machinery or the command line.
CORE = ("dapq.methods", "dapq.cache", "dapq.compress", "dapq.decoding", "dapq.generation", "dapq.context",
        "dapq.prompts", "dapq.state", "dapq.scoring", "dapq.models", "dapq.compat", "dapq.errors", "dapq.timing",
        "dapq.embedded")
OUTSIDE = ("dapq.bench", "dapq.analysis", "dapq.integrations", "dapq.runs", "dapq.cli")


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every dapq module ``path`` imports, anywhere in the file but ``if TYPE_CHECKING:`` blocks."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x` imports a module
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    files = {_module(p): p for p in SRC.rglob("*.py")}
    return {name: _imports(path, set(files)) for name, path in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as a path that returns to its start, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph[node]):
            # A package's __init__ importing its own submodules is how packages work, not a cycle.
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_the_core_imports_nothing_outside_the_library():
    graph = _graph()
    for name in graph:
        if name.startswith(CORE):
            bad = sorted(m for m in _reach(graph, name) if m.startswith(OUTSIDE))
            assert not bad, f"{name} reaches {bad}"


def test_the_checker_sees_cycles_and_function_local_imports(tmp_path):
    """The graph builder on a planted package: a circle kept alive by a function-local import."""
    pkg = tmp_path / "dapq"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    files = {".".join(p.relative_to(tmp_path).with_suffix("").parts): p for p in pkg.glob("*.py")}
    global SRC
    saved, SRC = SRC, pkg
    try:
        graph = {name.removesuffix(".__init__"): _imports(path, {n.removesuffix(".__init__") for n in files})
                 for name, path in files.items()}
    finally:
        SRC = saved
    assert "dapq.a" in graph["dapq.b"] and graph["dapq.c"] == set()  # the local import counts; TYPE_CHECKING not
    assert _cycle(graph) in (["dapq.a", "dapq.b", "dapq.a"], ["dapq.b", "dapq.a", "dapq.b"])
