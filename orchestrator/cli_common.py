"""What every `ftorch` command module shares: the argument types and JSON output."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

JobFile = Annotated[str, typer.Argument(help="the job YAML file")]
Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a field: key.path=value (YAML-typed); repeatable"),
]
JsonOut = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def print_json(payload: object) -> None:
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
