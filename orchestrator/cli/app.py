"""The `ftorch` command line. Commands only: the work lives in the modules they call.

Exit codes: 0 success; 2 the input is wrong (one line naming the field, no traceback); 1 anything else;
`--follow` exits with the job's end state (orchestrator.cli.follow.FOLLOW_EXIT_CODES); 130 on Ctrl-C.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchestrator.cli.common import (
    BACKEND_NAMES,
    JobFile,
    JobId,
    JsonOut,
    Sets,
    WorkflowGroup,
    choices,
    complete_job_id,
)
from orchestrator.cli.common import print_json as _print_json
from orchestrator.cli.status_command import fast_status as _fast_status  # plain `status`, without typer
from orchestrator.errors import SpecError, UserError
from orchestrator.home import owner_only_umask

app = typer.Typer(
    name="ftorch",
    cls=WorkflowGroup,  # commands listed in workflow order
    help="Fine-tune language models on the cheapest adequate (spot) GPUs, without losing work.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from orchestrator import __version__

        typer.echo(f"ftorch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Fine-tune language models on the cheapest adequate (spot) GPUs, without losing work."""


@app.command()
def launch(
    job_file: JobFile,
    backend: Annotated[
        str | None,
        typer.Option(
            help="local | skypilot (default: the job file's)", autocompletion=choices(*BACKEND_NAMES)
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="job name (default: the job file's)")] = None,
    set_: Sets = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="stream progress until the job ends")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="validate and plan, launch nothing")] = False,
    as_json: JsonOut = False,
) -> None:
    """Validate, plan and launch a job; print its id."""
    from orchestrator.jobs import lifecycle as jobs

    overrides = list(set_ or [])
    if backend is not None:
        overrides.append(f"resources.backend={backend}")
    if name is not None:
        overrides.append(f"name={name}")
    result = jobs.launch(job_file, overrides, dry_run=dry_run)
    if as_json:
        _print_json(result)
    elif dry_run:
        from orchestrator.backends.base import backend_for

        typer.echo(backend_for(result["backend"]).format_dry_run(result), nl=False)
    else:
        typer.echo(result["job_id"])
    if follow and not dry_run:
        from orchestrator.cli import follow as follow_mod

        raise typer.Exit(follow_mod.follow(result["job_id"]))


@app.command()
def status(
    job: Annotated[
        str | None, typer.Argument(help="a job id (default: all jobs)", autocompletion=complete_job_id)
    ] = None,
    as_json: JsonOut = False,
    show_all: Annotated[bool, typer.Option("--all", help="include older finished jobs")] = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="live view; ends when the job ends; Ctrl-C stops watching only")
    ] = False,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot", metavar="FILE.png", help="write the loss curve, preemptions and cost (needs JOB)"
        ),
    ] = None,
) -> None:
    """All jobs, or one job in detail."""
    from orchestrator.cli import status_command

    code = status_command.run(job, as_json, show_all, watch, plot)
    if code:
        raise typer.Exit(code)


@app.command()
def logs(
    job: JobId,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines")] = False,
) -> None:
    """The trainer's log across all attempts."""
    from orchestrator.jobs import lifecycle as jobs

    jobs.print_logs(job, follow=follow)


@app.command()
def cancel(
    jobs_: Annotated[
        list[str] | None, typer.Argument(metavar="JOB...", help="job ids", autocompletion=complete_job_id)
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="every job that has not ended")] = False,
) -> None:
    """Stop jobs; their checkpoints are kept."""
    from orchestrator.jobs import lifecycle as jobs

    if every == bool(jobs_):
        raise UserError("JOB: give job ids or --all (not both)" if every else "JOB: give job ids, or --all")
    for line in jobs.cancel_many(list(jobs_ or []), everything=every):
        typer.echo(line)


@app.command()
def resume(
    job: Annotated[
        str,
        typer.Argument(
            help="a job id, or a run store (RUN_URI) to attach and resume", autocompletion=complete_job_id
        ),
    ],
    set_: Sets = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="stream new progress until the job ends")
    ] = False,
    allow_change: Annotated[
        bool,
        typer.Option(
            "--allow-change",
            help="resume although --set (or the data) changes the math since the newest checkpoint;"
            " the change is recorded and shown by status",
        ),
    ] = False,
    relock: Annotated[
        bool,
        typer.Option(
            "--relock",
            help="replace the run's environment lock with the one this ftorch ships (new library "
            "versions: needs --allow-change once the run has checkpoints; docs/environment.md)",
        ),
    ] = False,
) -> None:
    """Continue a stopped, failed or cancelled run from its newest checkpoint."""
    from orchestrator.cli import follow as follow_mod
    from orchestrator.jobs import adopt
    from orchestrator.jobs import lifecycle as jobs

    if adopt.looks_like_run_uri(job):  # `resume RUN_URI`: attach (when not yet known), then resume
        said, job = adopt.attach_for_resume(job, list(set_ or []))
        typer.echo(said)
    adopt.check_resume(job, list(set_ or []))  # a path not taken from the store at attach is given again
    seen = follow_mod.mark(job) if follow else None  # --follow prints only what this resume adds
    typer.echo(jobs.resume(job, list(set_ or []), allow_change=allow_change, relock=relock))
    if follow:
        raise typer.Exit(follow_mod.follow(job, since=seen))


@app.command()
def controller(
    job: Annotated[str, typer.Argument(help="a SkyPilot job id", autocompletion=complete_job_id)],
) -> None:
    """Run a SkyPilot job's controller in the foreground (on an always-on machine; docs/clouds.md)."""
    from orchestrator.backends import skypilot_controller
    from orchestrator.backends.base import backend_for
    from orchestrator.errors import UserError
    from orchestrator.jobs.lifecycle import get_job
    from orchestrator.registry import Registry

    found = get_job(job, Registry())
    if not backend_for(found.backend).has_controller:
        raise UserError(
            f"JOB: {job} runs on the {found.backend} backend; only SkyPilot jobs have a controller"
        )
    raise typer.Exit(skypilot_controller.run_foreground(found.job_id))


@app.command()
def attach(
    run_uri: Annotated[str, typer.Argument(help="the run store: a local folder, s3://..., gs://...")],
    name: Annotated[str | None, typer.Option(help="job name (default: the run's own)")] = None,
    storage_option: Annotated[
        list[str] | None,
        typer.Option(
            "--storage-option",
            metavar="KEY=VALUE",
            help="an fsspec option to reach the store (e.g. endpoint_url=http://...); repeatable",
        ),
    ] = None,
    set_: Sets = None,
) -> None:
    """Register a run found in its store (another machine's, or after the registry was lost).

    What would point this machine at its files, servers or secrets is not taken from the store (one line
    each); --set gives it here (docs/storage.md)."""
    from orchestrator.jobs import adopt

    options = adopt.parse_options(storage_option or [])
    typer.echo(adopt.attach(run_uri, name, options, list(set_ or [])))


def _register_optional_commands() -> None:
    """Commands that live in their own modules (sizing and planning; simulation)."""
    from orchestrator.cli import convert as cli_convert
    from orchestrator.cli import env as cli_env
    from orchestrator.cli import hazards as cli_hazards
    from orchestrator.cli import jobfile as cli_jobfile
    from orchestrator.cli import outputs as cli_outputs
    from orchestrator.cli import report as cli_report
    from orchestrator.cli import simulate as cli_simulate
    from orchestrator.cli import sizing as cli_sizing
    from orchestrator.cli import sweep as cli_sweep
    from orchestrator.cli import try_adapter as cli_try

    cli_sizing.register(app)
    cli_simulate.register(app)
    cli_jobfile.register(app)
    cli_outputs.register(app)
    cli_hazards.register(app)
    cli_env.register(app)
    cli_convert.register(app)
    cli_sweep.register(app)
    cli_report.register(app)
    cli_try.register(app)


_register_optional_commands()


def main() -> None:
    owner_only_umask()  # also for `python -m orchestrator.cli.app`, which skips orchestrator/entry.py
    try:
        fast = _fast_status(sys.argv[1:])
        if fast is not None:
            status(**fast)  # type: ignore[arg-type]  # (orchestrator/entry.py also skips typer's import)
        else:
            # with standalone_mode=False click returns a command's `typer.Exit` code instead of exiting
            code = app(standalone_mode=False)
            if isinstance(code, int) and code:
                sys.exit(code)
    except (SpecError, UserError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except Exception as exc:
        # typer bundles its own click: recognise its exceptions by class name, not by import
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        if "UsageError" in kinds:
            exc.show()  # type: ignore[attr-defined]
            sys.exit(2)
        if "Abort" in kinds:
            sys.exit(130)
        if "ClickException" in kinds:
            exc.show()  # type: ignore[attr-defined]
            sys.exit(getattr(exc, "exit_code", 1))
        sys.stderr.write(f"error: {exc.__class__.__name__}: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
