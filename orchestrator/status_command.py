"""The body of `ftorch status`, free of typer: the typer command (orchestrator/cli.py) and the light entry
point (orchestrator/entry.py) both run it, so the plain status forms never import the CLI framework."""

from __future__ import annotations

import json
import sys


def run(job: str | None, as_json: bool, show_all: bool, watch: bool, plot: str | None) -> int:
    """Print all jobs, or one job in detail; the exit code (non-zero only from `--watch`)."""
    from orchestrator import status as job_status
    from orchestrator.errors import UserError

    if plot is not None and job is None:
        raise UserError("--plot: give a JOB: `ftorch status JOB --plot loss.png`")
    if plot is not None:
        from orchestrator.charts import check_plot_target

        check_plot_target(plot)
    if watch:
        from orchestrator import follow as follow_mod

        return follow_mod.watch(job, show_all=show_all)
    if job is None:
        rows = job_status.status_all()
        if as_json:
            print_json(rows)
        else:
            from orchestrator import sweep

            sweep.print_status(rows, show_all=show_all)  # a sweep's jobs as their group, ranked
        return 0
    detail = job_status.status_one(job)
    if plot is not None:
        from orchestrator.charts import plot_png

        plot_png(detail, plot)
    if as_json:
        print_json(detail)
    else:
        from orchestrator import ui

        ui.print_job_detail(detail)
        if plot is not None:
            sys.stdout.write(f"loss plot: {plot}\n")
    return 0


def print_json(payload: object) -> None:
    """JSON on stdout (every command's --json; orchestrator/cli_common.py re-exports it)."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
