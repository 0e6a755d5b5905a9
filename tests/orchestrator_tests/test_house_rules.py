"""The house rules a reader relies on, checked on the source (ast, nothing imported):

- no function in orchestrator/ or trainer/ is over 80 lines (issue 27; docs/architecture.md said 100);
- no backend-name comparison outside orchestrator/backends/: what differs between backends is a property
  or method of the `Backend` classes (orchestrator/backends/base.py), never `backend == "skypilot"`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import REPO

MAX_FUNCTION_LINES = 80


def long_functions(paths: list[Path], limit: int = MAX_FUNCTION_LINES, root: Path = REPO) -> list[str]:
    """`path:line name (N lines)` for each function or method longer than `limit` lines (decorators not
    counted, its docstring and comments are)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return sorted(found)


def _sources(*packages: str) -> list[Path]:
    return [p for package in packages for p in sorted((REPO / package).rglob("*.py"))]


def test_no_function_is_over_80_lines() -> None:
    long = long_functions(_sources("orchestrator", "trainer"))
    assert not long, f"{len(long)} functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)


def test_the_length_check_measures_a_planted_function(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    planted.write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n", encoding="utf-8")
    assert long_functions([planted], root=tmp_path) == ["planted.py:5 long (81 lines)"]
    assert long_functions([planted], limit=81, root=tmp_path) == []


# ---- backend names --------------------------------------------------------------------------------------
def backend_name_comparisons(paths: list[Path], names: set[str], root: Path = REPO) -> list[str]:
    """`path:line` for each `==`, `!=`, `in` or `not in` with a backend name as a string constant."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            if not all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
                continue
            constants = [node.left, *node.comparators]
            for operand in list(constants):
                if isinstance(operand, ast.Tuple | ast.List | ast.Set):
                    constants.extend(operand.elts)
            if any(isinstance(c, ast.Constant) and c.value in names for c in constants):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_backend_name_comparison_outside_the_backends() -> None:
    from orchestrator.backends.base import BACKENDS

    backends = REPO / "orchestrator" / "backends"
    outside = [p for p in _sources("orchestrator") if backends not in p.parents]
    bad = backend_name_comparisons(outside, set(BACKENDS))
    assert not bad, "compare backends through the Backend interface, not by name: " + ", ".join(bad)


def test_the_name_check_finds_a_planted_comparison(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        'def f(job, spec):\n    if job.backend != "skypilot":\n        return 1\n'
        '    return spec.get("backend") in ("local", "x") or job.backend == "kind"\n',
        encoding="utf-8",
    )
    found = backend_name_comparisons([planted], {"local", "skypilot"}, root=tmp_path)
    assert found == ["planted.py:2", "planted.py:4"]


def test_backend_differences_are_backend_properties() -> None:
    """What cli.py (`ftorch controller`) and notify.py (who sends a webhook) used to ask by name."""
    from orchestrator.backends.base import backend_for

    local, cloud = backend_for("local"), backend_for("skypilot")
    assert (local.has_controller, cloud.has_controller) == (False, True)
    assert (local.job_sends_events, cloud.job_sends_events) == (False, True)


def test_a_local_job_has_no_controller(ftorch_home: Path, tmp_path: Path) -> None:
    """`ftorch controller` asks the job's backend (`has_controller`): a local job is refused in one line."""
    from fakejobs import add_job
    from helpers import ftorch

    from orchestrator.registry import Registry

    add_job(Registry(), tmp_path / "runs", "demo-abc123", "RUNNING", 10)
    done = ftorch("controller", "demo-abc123", env={"FTORCH_HOME": str(ftorch_home)})
    assert done.returncode == 2, done.stderr
    assert "runs on the local backend; only SkyPilot jobs have a controller" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# ---- rooms: what a reader meets at the top of each package ----------------------------------------------
MAX_ROOMS = {"orchestrator": 20, "trainer": 26}


def rooms(package: Path) -> list[str]:
    """The top-level modules and folders of a package (its __init__ counted; caches and data not)."""
    return sorted(
        p.name
        for p in package.iterdir()
        if (p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())
    )


@pytest.mark.parametrize("package", sorted(MAX_ROOMS))
def test_each_package_has_few_top_level_rooms(package: str) -> None:
    found = rooms(REPO / package)
    assert len(found) <= MAX_ROOMS[package], f"{len(found)} rooms in {package}/: {found}"


def test_the_room_count_sees_modules_and_folders(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "data").mkdir()  # no package: data files
    assert rooms(tmp_path) == ["a.py", "pkg"]
