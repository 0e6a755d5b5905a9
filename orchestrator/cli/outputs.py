"""`ftorch export` (a PEFT adapter or a merged model from any complete checkpoint of a job) and
`ftorch metrics` (the metric history across attempts, as a table or CSV)."""

from __future__ import annotations

import csv
import os
import sys
from typing import Annotated, Any

import typer

from orchestrator.cli.common import JobId
from orchestrator.errors import UserError


def export_cmd(
    job: JobId,
    step: Annotated[
        int | None, typer.Option(help="the checkpoint's step (default: the newest complete one)")
    ] = None,
    merge: Annotated[
        bool, typer.Option("--merge", help="merge the adapter into the base: a plain HF model")
    ] = False,
    to: Annotated[
        str | None,
        typer.Option(
            help="a new or empty folder, or bucket URL, or an earlier export (default: "
            "<run store>/exports/step-N[-merged])"
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="write into a --to folder that holds other files (they stay)")
    ] = False,
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            metavar="NAMESPACE/NAME",
            help="also upload the export to this Hugging Face Hub repo (default: the job's output.hub_model_id)",
        ),
    ] = None,
    no_push: Annotated[
        bool, typer.Option("--no-push", help="do not push, even with output.hub_model_id")
    ] = False,
    public: Annotated[
        bool, typer.Option("--public", help="create the Hub repo public (default: private)")
    ] = False,
) -> None:
    """Write a PEFT adapter (or, with --merge, a merged model) from a checkpoint of JOB, with its model
    card and training_summary.json; optionally push it to the Hugging Face Hub."""
    from orchestrator.jobs import lifecycle as jobs

    record = jobs.get_job(job)
    options = record.spec.get("checkpoint", {}).get("storage_options") or {}
    from trainer.config import check_repo_id

    repo = None if no_push else push_to_hub or (record.spec.get("output") or {}).get("hub_model_id")
    if repo is not None:
        try:
            check_repo_id(repo)
        except ValueError as exc:
            raise UserError(f"--push-to-hub: {exc}") from None
    from orchestrator.views.progress import quiet_libraries, spinner
    from trainer.outputs.hub_push import PushError

    try:
        with (
            spinner(f"exporting {record.job_id}: loading the base model and the checkpoint"),
            quiet_libraries(),
        ):
            result = _export(record, step, merge, to, force, options, repo, public)
    except PushError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise typer.Exit(1) from None
    typer.echo(f"{result['kind']} from step {result['step']} of {record.job_id}: {result['to']}")
    if result.get("pushed"):
        typer.echo(f"pushed to {result['pushed']['url']}")


def _export(
    record: Any, step: int | None, merge: bool, to: str | None, force: bool, options: dict,
    repo: str | None, public: bool,
) -> dict:  # fmt: skip
    from trainer.outputs.export import ExportError, export, pick_checkpoint  # torch: only for this command
    from trainer.runstore.storage import join_uri
    from trainer.runstore.store import RunStore

    try:
        if to is None:
            chosen = pick_checkpoint(RunStore(record.run_uri, options), step).step
            to = join_uri(record.run_uri, "exports", f"step-{chosen:08d}" + ("-merged" if merge else ""))
        elif "://" not in to:
            to = os.path.abspath(to)
        return export(
            record.run_uri, to, step=step, merge=merge, storage_options=options, force=force,
            push_to=repo, private=not public,
            job=record.spec, output_uri=record.output_uri,  # the registry's, never the store's spec.json
        )  # fmt: skip
    except ExportError as exc:
        raise UserError(str(exc)) from None


COLUMNS = ("step", "attempt", "loss", "lr", "grad_norm", "eval_loss", "tokens", "tokens_per_s", "time")


def metric_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The store's rows with tokens/s between consecutive logged steps of the same attempt."""
    out = []
    previous: dict[str, Any] | None = None
    for row in rows:
        rate = None
        if previous is not None and previous.get("attempt") == row.get("attempt"):
            dt = (row.get("time") or 0) - (previous.get("time") or 0)
            if dt > 0 and row.get("tokens") is not None and previous.get("tokens") is not None:
                rate = (row["tokens"] - previous["tokens"]) / dt
        out.append({**{k: row.get(k) for k in COLUMNS}, "tokens_per_s": rate})
        previous = row
    return out


def metrics_cmd(
    job: JobId,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="CSV with a header row, for spreadsheets and pandas")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="a JSON list, one object per logged step")] = False,
) -> None:
    """The metric history of JOB across all attempts: step, attempt, loss, lr, grad norm, held-out loss
    (train.eval_every), tokens/s."""
    from orchestrator.jobs import lifecycle as jobs
    from trainer.runstore.store import RunStore

    record = jobs.get_job(job)
    options = record.spec.get("checkpoint", {}).get("storage_options") or {}
    rows = metric_rows(RunStore(record.run_uri, options).read_metrics())
    if as_csv and as_json:
        raise UserError("--csv, --json: choose one")
    if as_json:
        from orchestrator.cli.common import print_json

        print_json(rows)
        return
    if as_csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    if not rows:
        typer.echo(f"{record.job_id}: no metrics yet")
        return
    typer.echo(
        f"{'step':>7} {'attempt':>7} {'loss':>9} {'lr':>9} {'grad_norm':>9} {'eval_loss':>9} {'tokens/s':>9}"
    )
    for r in rows:
        cells = [
            f"{r['step']:>7}",
            f"{r['attempt'] if r['attempt'] is not None else '-':>7}",
            _num(r["loss"], ".4f"),
            _num(r["lr"], ".2e"),
            _num(r["grad_norm"], ".3f"),
            _num(r["eval_loss"], ".4f"),
            _num(r["tokens_per_s"], ",.0f"),
        ]
        typer.echo(" ".join(cells))


def _num(value: Any, spec: str) -> str:
    return f"{'-' if value is None else format(value, spec):>9}"


def register(app: typer.Typer) -> None:
    app.command("export")(export_cmd)
    app.command("metrics")(metrics_cmd)
