"""No import circles in orchestrator/ or trainer/.

A static walk of the source (ast, nothing is imported): every `import` and `from ... import` inside the
two packages counts, at module level and inside functions alike (a function-level import that closes a
circle is still a circle: the two modules cannot be understood, or split, one without the other).
Imports under `if TYPE_CHECKING:` count too. `from pkg import name` is an edge to `pkg.name` when that
is a module, else to `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

PACKAGES = ("orchestrator", "trainer")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved is not None and resolved != module:
                    graph[module].add(resolved)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module, as one cycle through it (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: dict[str, set[str]], members: set[str]) -> list[str]:
    """A readable cycle a -> b -> ... -> a within one component (a shortest one through its first
    module)."""
    start = min(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    return sorted(members)  # pragma: no cover - a component always has a cycle


def test_the_walk_sees_real_imports() -> None:
    graph = import_graph()
    assert "orchestrator.registry" in graph["orchestrator.jobs"]
    assert "orchestrator.backends.skypilot_render" in graph["orchestrator.backends.skypilot"]
    assert "trainer.runstore.store" in graph["trainer.loop"]
    # and the cycle finder finds a planted circle, with its path
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_trainer_never_imports_orchestrator() -> None:
    graph = import_graph()
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if m.startswith("trainer")
        for t in targets
        if t.startswith("orchestrator")
    )
    assert not bad, bad
