"""What every `ftorch` command module shares: the argument types and JSON output."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator import status_command

JobFile = Annotated[str, typer.Argument(help="the job YAML file")]
Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a field: key.path=value (YAML-typed); repeatable"),
]
JsonOut = Annotated[bool, typer.Option("--json", help="machine-readable output")]

print_json = status_command.print_json
