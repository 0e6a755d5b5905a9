"""`ftorch sweep`: one job per point of a grid, launched as a group with one shared budget."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.common import JobFile, JsonOut, Sets, print_json


def sweep_cmd(
    job_file: JobFile,
    grid: Annotated[
        list[str] | None,
        typer.Option(
            "--grid",
            metavar="KEY=V1,V2",
            help="a field and the values it takes (YAML-typed); repeatable: every combination is a job",
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option(
            metavar="USD", help="one budget for the whole group (default: the job file's budget_usd)"
        ),
    ] = None,
    set_: Sets = None,
    as_json: JsonOut = False,
) -> None:
    """Launch one job per point of a grid as a group; `ftorch status` ranks them by held-out loss."""
    from orchestrator.jobs import sweep

    result = sweep.launch_sweep(job_file, list(grid or []), list(set_ or []), budget)
    if as_json:
        print_json(result)
        return
    from orchestrator.backends.base import backend_for

    takes_turns = backend_for(result["backend"]).jobs_take_turns
    queued = " (they take turns on this machine's device)" if takes_turns else ""
    typer.echo(f"{result['group_id']}: {len(result['jobs'])} jobs{queued}")
    for entry in result["jobs"]:
        point = " ".join(f"{k}={v}" for k, v in entry["point"].items())
        typer.echo(f"  {entry['job_id']}  {point}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_cmd)
