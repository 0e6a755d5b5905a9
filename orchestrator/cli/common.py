"""What every `ftorch` command module shares: the argument types and JSON output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from orchestrator.cli import status_command

JobFile = Annotated[str, typer.Argument(help="the job YAML file")]
Sets = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a field: key.path=value (YAML-typed); repeatable"),
]
JsonOut = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def complete_job_id(incomplete: str) -> list[str]:
    """Shell completion of a JOB argument: the registry's job ids (newest first) that start so."""
    try:
        from orchestrator.registry import Registry

        jobs = sorted(Registry().jobs(), key=lambda j: -j.created_at)
    except Exception:  # noqa: BLE001 - completion must never fail loudly
        return []
    return [j.job_id for j in jobs if j.job_id.startswith(incomplete)]


def choices(*values: str) -> Callable[[str], list[str]]:
    """Shell completion of an option's valid values (the command still checks them, naming the field)."""
    return lambda incomplete: [v for v in values if v.startswith(incomplete)]


JobId = Annotated[str, typer.Argument(help="a job id", autocompletion=complete_job_id)]
BACKEND_NAMES = ("local", "skypilot")  # resources.backend's values (a test keeps them the schema's)


print_json = status_command.print_json


#: `ftorch --help` lists the commands in the order a job goes through them (others after, by name)
WORKFLOW = (
    "init", "convert", "validate", "estimate", "plan", "gpus", "hazards", "launch", "sweep", "status", "logs",
    "metrics", "report", "env", "export", "generate", "chat", "cancel", "resume", "attach", "simulate", "history", "controller",
)  # fmt: skip


class WorkflowGroup(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (WORKFLOW.index(n) if n in WORKFLOW else len(WORKFLOW), n))
