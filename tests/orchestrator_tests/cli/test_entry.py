"""The console script's light entry point (orchestrator/entry.py): `--help` and the plain `status` forms
answer without typer, click, pydantic (and, for `--help` and `status --json`, rich); its command list is
typer's own; everything else reaches the full CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import typer
from fakejobs import bulk_registry, demo_registry
from helpers import REPO

from orchestrator.cli import fast_help as cli_help
from orchestrator.cli.app import app

NEVER = ("typer", "click", "pydantic", "yaml", "torch", "sky", "fsspec", "trainer.config")


def entry(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the entry point as the console script does, and report which modules it loaded."""
    script = (
        "import sys, json\n"
        "from orchestrator.entry import main\n"
        f"sys.argv = ['ftorch', *{list(args)!r}]\n"
        "try:\n    main()\n    code = 0\nexcept SystemExit as exc:\n    code = exc.code or 0\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
        "sys.exit(code)\n"
    )
    import os

    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "100", **(env or {})},
    )  # fmt: skip


def loaded(done: subprocess.CompletedProcess[str]) -> set[str]:
    line = next(x for x in done.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line[len("MODULES ") :]))


def top_level(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules)


def test_the_help_command_list_is_typers_own() -> None:
    """A command added, renamed or re-described in typer must be in orchestrator/cli/fast_help.py too."""
    group = typer.main.get_command(app)
    ctx = click.Context(group)

    def first(text: str | None) -> str:
        return " ".join((text or "").split("\n\n")[0].split())

    commands = tuple(
        (name, first(group.get_command(ctx, name).help))
        for name in group.list_commands(ctx)
        if not group.get_command(ctx, name).hidden
    )
    options = tuple((p.opts[0], first(getattr(p, "help", None))) for p in group.get_params(ctx))
    assert commands == cli_help.COMMANDS, f"orchestrator/cli/fast_help.py COMMANDS should be {commands!r}"
    assert options == cli_help.OPTIONS, f"orchestrator/cli/fast_help.py OPTIONS should be {options!r}"
    assert first(group.help) == cli_help.SUMMARY


def test_help_answers_without_typer_or_rich() -> None:
    done = entry("--help")
    assert done.returncode == 0, done.stderr
    for name, text in cli_help.COMMANDS:
        assert f"  {name} " in done.stdout and text.split()[0] in done.stdout
    assert all(len(line) <= 100 for line in done.stdout.splitlines())
    assert top_level(loaded(done), (*NEVER, "rich")) == []
    bare = entry()  # like typer's no_args_is_help: the help, exit 2
    assert bare.returncode == 2 and "Commands:" in bare.stdout


def test_the_plain_status_forms_load_only_what_they_print(tmp_path: Path, ftorch_home: Path) -> None:
    bulk_registry(ftorch_home, tmp_path / "runs", n=100, active=3)  # as ftorch leaves them (test_ui.py)
    table = entry("status")
    assert table.returncode == 0, table.stderr
    assert "RUNNING" in table.stdout and "job0099-" in table.stdout
    assert top_level(loaded(table), NEVER) == []
    as_json = entry("status", "--json")
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert {r["state"] for r in rows} >= {"RUNNING", "SUCCEEDED"}
    assert top_level(loaded(as_json), (*NEVER, "rich")) == []
    wrong = entry("status", "--plot", "x.png")  # no JOB: one line, exit 2, still without typer
    assert wrong.returncode == 2 and "error: --plot: give a JOB" in wrong.stderr
    assert top_level(loaded(wrong), NEVER) == []


def test_everything_else_reaches_the_full_cli(tmp_path: Path, ftorch_home: Path) -> None:
    demo_registry(ftorch_home, tmp_path / "runs")
    usage = entry("status", "--bogus")
    assert usage.returncode == 2 and "--bogus" in usage.stderr and "typer" in loaded(usage)
    command_help = entry("status", "--help")
    assert command_help.returncode == 0 and "--plot" in command_help.stdout
    version = entry("--version")
    assert version.returncode == 0 and version.stdout.startswith("ftorch ")


def test_the_console_script_is_the_light_entry_point() -> None:
    scripts = (REPO / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert 'ftorch = "orchestrator.entry:main"' in scripts
