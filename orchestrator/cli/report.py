"""`ftorch report JOB --html FILE`: a self-contained page to share a run (orchestrator/views/report.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.common import JobId


def report_cmd(
    job: JobId,
    html: Annotated[str, typer.Option("--html", metavar="FILE.html", help="where to write the page")],
) -> None:
    """Write JOB's report (loss and held-out curves, attempts, cost ledger, plan) as one HTML file."""
    from orchestrator.views import report

    written, kept = report.write_report(job, html)
    typer.echo(f"report: {written}" + (f" (a copy in {kept})" if kept else ""))


def register(app: typer.Typer) -> None:
    app.command("report")(report_cmd)
