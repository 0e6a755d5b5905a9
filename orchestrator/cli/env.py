"""`ftorch env JOB`: the run's environment lock (env/lock.txt in its run store; docs/environment.md)."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def env_cmd(
    job: Annotated[str, typer.Argument(help="a job id")],
    as_json: Annotated[bool, typer.Option("--json", help="the lock's info and pins as JSON")] = False,
) -> None:
    """Show the exact library versions JOB's attempts install (and where that lock came from)."""
    from orchestrator.jobfile import envlock as runenv
    from orchestrator.registry import Registry
    from trainer.envlock import parse

    record = Registry().lookup(job)  # the lock is in the store: no backend is asked how the job runs
    text, info = runenv.read_lock(record.run_store())
    if as_json:
        pins = {p.name: p.version for p in parse(text).values()} if text is not None else None
        typer.echo(json.dumps({"job_id": record.job_id, **info, "pins": pins}, indent=1, sort_keys=True))
        return
    typer.echo(f"{record.job_id}: {record.run_uri}/{runenv.LOCK}")
    typer.echo(runenv.describe(text, info))


def register(app: typer.Typer) -> None:
    app.command("env")(env_cmd)
