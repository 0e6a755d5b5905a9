"""`ftorch generate JOB --prompt TEXT` and `ftorch chat JOB`: try a job's adapter (trainer/outputs/generate.py)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from orchestrator.cli.common import JobId
from orchestrator.errors import UserError

Step = Annotated[int | None, typer.Option(help="the checkpoint's step (default: the newest complete one)")]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", min=1, max=4096, help="tokens to generate at most")]
Temperature = Annotated[
    float, typer.Option(min=0.0, max=5.0, help="0: greedy, the same answer every time; above 0: sampled")
]


def _session(job: str, step: int | None) -> Any:
    from orchestrator.jobs import lifecycle as jobs

    record = jobs.get_job(job)
    options = record.spec.get("checkpoint", {}).get("storage_options") or {}
    from orchestrator.views.progress import quiet_libraries, spinner

    # the spinner (a terminal's stderr only) from the torch import on: a few seconds of silence otherwise
    with spinner(f"loading {record.job_id}'s model and checkpoint"), quiet_libraries():
        from trainer.outputs.export import ExportError  # torch: only for these commands
        from trainer.outputs.generate import open_session

        try:
            return open_session(record.run_uri, step, options, job=record.spec)  # the registry's job
        except ExportError as exc:
            raise UserError(str(exc)) from None


def generate_cmd(
    job: JobId,
    prompt: Annotated[
        str, typer.Option("--prompt", "-p", help="the prompt, framed as the training data was")
    ],
    step: Step = None,
    max_new_tokens: MaxNew = 64,
    temperature: Temperature = 0.0,
) -> None:
    """Answer one prompt with JOB's trained model (a checkpoint: the adapter merged into its base)."""
    from orchestrator.views.progress import quiet_libraries

    session = _session(job, step)
    with quiet_libraries():
        answer = session.reply(prompt, max_new_tokens, temperature)
    typer.echo(answer)


def chat_cmd(
    job: JobId,
    step: Step = None,
    max_new_tokens: MaxNew = 128,
    temperature: Temperature = 0.0,
) -> None:
    """Talk to JOB's trained model: one line per turn; an empty line or Ctrl-D ends. Chat data keeps the
    conversation; instruction and text data answer each line on its own."""
    from orchestrator.views.progress import quiet_libraries

    session = _session(job, step)
    interactive = sys.stdin.isatty()
    if interactive:
        typer.echo(f"{job} at step {session.step} ({session.spec.data.format} prompts); an empty line ends")
    while True:
        if interactive:
            sys.stdout.write("> ")
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or not line.strip():
            return
        with quiet_libraries():
            answer = session.reply(line.rstrip("\n"), max_new_tokens, temperature)
        typer.echo(answer)


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_cmd)
    app.command("chat")(chat_cmd)
