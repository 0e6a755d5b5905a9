"""No import circles in orchestrator/ or trainer/.

A static walk of the source (ast, nothing is imported): every `import` and `from ... import` inside the
two packages counts, at module level and inside functions alike (a function-level import that closes a
circle is still a circle: the two modules cannot be understood, or split, one without the other).
Imports under `if TYPE_CHECKING:` count too. `from pkg import name` is an edge to `pkg.name` when that
is a module, else to `pkg`.

And no arrow in orchestrator/ runs back up a floor: FLOORS gives each module its floor (ground, sizing,
planning and spot, backends, jobs/status/ui, CLI); a module may import its own floor or the ones below,
never one above, at module level or inside a function. A module with no floor in the table fails the test
(give it one when you add it); KNOWN_UPWARD lists the few upward arrows left, each with why.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
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


def imports() -> list[tuple[str, str, int]]:
    """(module, package module it imports, line) for every import in the two packages."""
    modules = _modules()
    found: list[tuple[str, str, int]] = []
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
                    found.append((module, resolved, node.lineno))
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports."""
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for module, target, _line in imports():
        graph[module].add(target)
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


# ---- floors in orchestrator/ --------------------------------------------------------------------------
GROUND, SIZING, PLANNING, BACKENDS, STATUS, CLI = range(6)
FLOOR_NAMES = ("ground", "sizing", "planning/spot", "backends", "jobs/status/ui", "cli")
#: module (or package: it covers everything under it) -> floor. Moving a module into a folder: rename its
#: key here (or give the folder one key).
FLOORS = {
    # ground: errors, $FTORCH_HOME, states, the registry and its records, processes; imported by everything
    "orchestrator": GROUND,
    "orchestrator.errors": GROUND,
    "orchestrator.home": GROUND,
    "orchestrator.states": GROUND,
    "orchestrator.records": GROUND,
    "orchestrator.run_records": GROUND,
    "orchestrator.registry": GROUND,
    "orchestrator.procs": GROUND,
    "orchestrator.logtail": GROUND,
    # the job file and what it names (spec, aliases, axolotl conversion, the model's config, the env lock)
    "orchestrator.jobfile": GROUND,
    # sizing: model shapes, memory, time, offers, measured history; the planner and the re-plan above them
    "orchestrator.sizing": SIZING,
    "orchestrator.sizing.sky_names": GROUND,  # accelerator names, read by the backends' task rendering too
    "orchestrator.sizing.planner": PLANNING,
    "orchestrator.sizing.replan": PLANNING,  # a re-plan after "does not fit": what the planner refuses
    # planning and spot decisions: hazards, egress, policies, their simulator, the controller, the ledger
    "orchestrator.spot": PLANNING,
    # backends: where jobs run, what they ship, who they notify
    "orchestrator.backends": BACKENDS,
    "orchestrator.backends.ship": GROUND,  # the code a cloud task installs (read by the job file's checks)
    # jobs as a user drives them, and what the CLI shows
    "orchestrator.jobs": STATUS,
    "orchestrator.views": STATUS,
    # a job's facts from the registry and its run store, free of the backends: a backend's notification
    # carries the same status row (orchestrator/backends/notify.py adds the backend's fields itself)
    "orchestrator.views.job_facts": GROUND,
    # the CLI: command modules, follow/watch, the light entry point
    "orchestrator.cli": CLI,
    "orchestrator.cli.status_command": STATUS,  # the body of `ftorch status`, free of typer
    "orchestrator.cli.follow": STATUS,  # `--follow` and `status --watch`, driven by jobs and the CLI
    "orchestrator.entry": CLI,  # the console script: defers to orchestrator.cli.app
}
#: upward arrows still there, (module, target) -> why; remove an entry when its arrow is gone
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def floor_of(module: str, floors: dict[str, int] = FLOORS) -> int | None:
    """The floor of `module`: its own entry, else its nearest package's (None: not in the table)."""
    name = module
    while name:
        if name in floors:
            return floors[name]
        name = name.rpartition(".")[0]
    return None


def upward_arrows(
    edges: list[tuple[str, str, int]],
    floors: dict[str, int] = FLOORS,
    known: Mapping[tuple[str, str], str] = {},
) -> list[str]:
    """Each orchestrator import that runs up a floor (not in `known`), as `a (floor) -> b (floor) line N`."""
    bad = []
    for module, target, line in edges:
        if not (module.startswith("orchestrator") and target.startswith("orchestrator")):
            continue
        low, high = floor_of(module, floors), floor_of(target, floors)
        if low is not None and high is not None and high > low and (module, target) not in known:
            bad.append(f"{module} ({FLOOR_NAMES[low]}) -> {target} ({FLOOR_NAMES[high]}) line {line}")
    return sorted(set(bad))


def test_every_orchestrator_module_has_a_floor() -> None:
    missing = sorted(m for m in _modules() if m.startswith("orchestrator") and floor_of(m) is None)
    assert not missing, f"give these a floor in FLOORS: {missing}"


def test_no_orchestrator_arrow_runs_up_a_floor() -> None:
    bad = upward_arrows(imports(), known=KNOWN_UPWARD)
    assert not bad, "imports up a floor: " + "; ".join(bad)


def test_the_known_upward_arrows_are_still_there() -> None:
    graph = import_graph()
    gone = [f"{a} -> {b}" for a, b in KNOWN_UPWARD if b not in graph.get(a, set())]
    assert not gone, f"remove from KNOWN_UPWARD: {gone}"


def test_the_floor_check_finds_a_planted_upward_arrow() -> None:
    floors = {"orchestrator.errors": GROUND, "orchestrator.backends": BACKENDS, "orchestrator.cli.app": CLI}
    edges = [
        ("orchestrator.backends.local", "orchestrator.errors", 3),  # down: fine
        ("orchestrator.backends.local", "orchestrator.backends.base", 4),  # sideways: fine
        ("orchestrator.errors", "orchestrator.backends.local", 9),  # up, in a function or not: caught
        ("orchestrator.cli.app", "trainer.config", 5),  # trainer/ has its own rule
    ]
    assert upward_arrows(edges, floors) == [
        "orchestrator.errors (ground) -> orchestrator.backends.local (backends) line 9"
    ]
    assert upward_arrows(edges, floors, {("orchestrator.errors", "orchestrator.backends.local"): "x"}) == []


def test_the_walk_sees_real_imports() -> None:
    graph = import_graph()
    assert "orchestrator.registry" in graph["orchestrator.jobs.lifecycle"]
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


# ---- rooms in trainer/: each folder (checkpoints/, stops/, data/, ...) and each top-level module ----------
def room_of(module: str) -> str:
    """`trainer.stops.budget` -> `trainer.stops`; `trainer.train_step.loss` -> `trainer.train_step.loss`; `trainer` itself."""
    return ".".join(module.split(".")[:2])


def room_circles(edges: list[tuple[str, str, int]], package: str = "trainer") -> list[str]:
    """Each circle between the rooms of `package`, with the module imports that close it, as
    `a -> b -> a (a.x -> b.y line N; b.z -> a.w line M)`. The package's own `__init__` is no room."""
    graph: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for module, target, line in edges:
        if not (module.startswith(package + ".") and target.startswith(package + ".")):
            continue
        a, b = room_of(module), room_of(target)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
            why.setdefault((a, b), []).append(f"{module} -> {target} line {line}")
    found = []
    for cycle in find_cycles(graph):
        arrows = [arrow for a, b in zip(cycle, cycle[1:], strict=False) for arrow in sorted(why[(a, b)])]
        found.append(" -> ".join(cycle) + " (" + "; ".join(arrows) + ")")
    return found


def test_no_circle_between_trainer_folders() -> None:
    circles = room_circles(imports())
    assert not circles, f"{len(circles)} circles between trainer's rooms: " + "; ".join(circles)


def test_the_room_check_finds_a_planted_circle() -> None:
    edges = [
        ("trainer.loss", "trainer.labels", 3),  # down to a shared lower module: fine
        ("trainer.data.dataset", "trainer.labels", 4),
        ("trainer.data.packing_check", "trainer.loss", 12),
        ("trainer.stops.budget", "trainer.stops.interruptions", 5),  # inside one room: fine
        ("trainer.memory.memtrace", "trainer", 1),  # the package itself: no room
    ]
    assert room_circles(edges) == []
    planted = [*edges, ("trainer.loss", "trainer.data.dataset", 28)]
    assert room_circles(planted) == [
        "trainer.data -> trainer.loss -> trainer.data (trainer.data.packing_check -> trainer.loss line 12; "
        "trainer.loss -> trainer.data.dataset line 28)"
    ]


def test_no_test_folder_shadows_a_package_for_scripts_run_from_tests() -> None:
    """A script run from tests/ (tests/sky_server_checks.py) has tests/ first on its path: a test folder
    named like a package (tests/trainer/) would be imported as that package, a namespace without its code."""
    import os
    import subprocess
    import sys

    probe = (
        f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r}); import orchestrator, trainer; "
        "print(orchestrator.__file__, trainer.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as CI runs it: the installed ftorch
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    files = out.stdout.split()
    assert len(files) == 2 and all(f.endswith("__init__.py") and "/tests/" not in f for f in files), (
        out.stdout
    )
