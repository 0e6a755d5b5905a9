"""The body of `ftorch status`, free of typer: the typer command (orchestrator/cli/app.py) and the light entry
point (orchestrator/entry.py) both run it (and parse its plain forms with fast_status), so the plain status
forms never import the CLI framework."""

from __future__ import annotations

import json
import sys


def fast_status(argv: list[str]) -> dict[str, object] | None:
    """`ftorch status [JOB] [--json] [--all] [--watch] [--plot F]` parsed as typer would, or None for
    anything else (help, usage errors, other commands: typer handles and reports those)."""
    if not argv or argv[0] != "status":
        return None
    options: dict[str, object] = {
        "job": None,
        "as_json": False,
        "show_all": False,
        "watch": False,
        "plot": None,
    }
    flags = {"--json": "as_json", "--all": "show_all", "--watch": "watch"}
    rest = iter(argv[1:])
    for token in rest:
        if token in flags:
            options[flags[token]] = True
        elif token == "--plot":
            options["plot"] = next(rest, None)
            if options["plot"] is None:
                return None
        elif token.startswith("--plot="):
            options["plot"] = token.split("=", 1)[1]
        elif not token.startswith("-") and options["job"] is None:
            options["job"] = token
        else:
            return None
    return options


def _shows_savings() -> bool:
    """Whether the jobs table has room for the savings column (the ledger per job costs a third of the
    command's time with 1,000 jobs: computed only when shown)."""
    from orchestrator.views.cells import WIDEST, console

    return console().width >= WIDEST


def run(job: str | None, as_json: bool, show_all: bool, watch: bool, plot: str | None) -> int:
    """Print all jobs, or one job in detail; the exit code (non-zero only from `--watch`)."""
    from orchestrator.errors import UserError
    from orchestrator.views import status as job_status

    if plot is not None and job is None:
        raise UserError("--plot: give a JOB: `ftorch status JOB --plot loss.png`")
    if plot is not None:
        from orchestrator.views.charts import check_plot_target

        check_plot_target(plot)
    if watch:
        from orchestrator.cli import follow as follow_mod

        return follow_mod.watch(job, show_all=show_all)
    if job is None:
        # the table counts the finished jobs it collapses, nothing more (--json and --all show every row)
        brief = not as_json and not show_all
        rows = job_status.status_all(savings=as_json or _shows_savings(), brief_hidden=brief)
        if as_json:
            print_json(rows)
        else:
            from orchestrator.jobs import sweep

            sweep.print_status(rows, show_all=show_all)  # a sweep's jobs as their group, ranked
        return 0
    detail = job_status.status_one(job)
    if plot is not None:
        from orchestrator.views.charts import plot_png

        plot_png(detail, plot)
    if as_json:
        print_json(detail)
    else:
        from orchestrator.views.job_detail import print_job_detail

        print_job_detail(detail)
        if plot is not None:
            sys.stdout.write(f"loss plot: {plot}\n")
    return 0


def print_json(payload: object) -> None:
    """JSON on stdout (every command's --json; orchestrator/cli/common.py re-exports it)."""
    sys.stdout.write(json.dumps(payload, indent=2, default=str) + "\n")
