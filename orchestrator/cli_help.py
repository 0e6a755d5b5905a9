"""`ftorch --help` without typer: the command list, kept equal to typer's own by
tests/orchestrator_tests/test_entry.py (which prints the tuples to paste when a command changes), rendered
as plain text. typer and rich take ~0.3 s to import; this module takes nothing."""

from __future__ import annotations

import os
import textwrap

SUMMARY = "Fine-tune language models on the cheapest adequate (spot) GPUs, without losing work."
#: (name, first paragraph of its help), in typer's order
COMMANDS = (
    ('launch', 'Validate, plan and launch a job; print its id.'),
    ('status', 'All jobs, or one job in detail.'),
    ('logs', "The trainer's log across all attempts."),
    ('cancel', 'Stop a job; its checkpoints are kept.'),
    ('resume', 'Continue a stopped, failed or cancelled run from its newest checkpoint.'),
    ('controller', "Run a SkyPilot job's controller in the foreground (on an always-on machine; docs/clouds.md)."),
    ('attach', "Register a run found in its store (another machine's, or after the registry was lost)."),
    ('history', 'What runs measured (peak memory, tokens/s) and whether the planner uses it.'),
    ('estimate', 'Peak GPU memory per GPU for a job, with its breakdown (analytic; traced with --trace).'),
    ('plan', 'Rank the offers by expected cost: fits or why not, hours, cost on spot and on demand, the choice.'),
    ('gpus', 'The GPU catalog in use and where it came from, grouped by tier (consumer cards, then datacenter).'),
    ('simulate', 'Replay spot availability traces: cost, finish time and deadline of each policy.'),
    ('init', 'Write a commented starter job for a model and method.'),
    ('validate', 'Check a job file (schema, local files, and the plan on the skypilot backend); launch nothing.'),
    ('export', 'Write a PEFT adapter (or, with --merge, a merged model) from a checkpoint of JOB.'),
    ('metrics', 'The metric history of JOB across all attempts: step, attempt, loss, lr, grad norm, held-out loss (train.eval_every), tokens/s.'),
)  # fmt: skip
OPTIONS = (
    ('--version', 'print the version and exit'),
    ('--install-completion', 'Install completion for the current shell.'),
    ('--show-completion', 'Show completion for the current shell, to copy it or customize the installation.'),
    ('--help', 'Show this message and exit.'),
)  # fmt: skip


def render(prog: str = "ftorch", width: int | None = None) -> str:
    """The root help: usage, summary, options and commands, each help wrapped to the terminal width."""
    width = width or _width()
    lines = [f"Usage: {prog} [OPTIONS] COMMAND [ARGS]...", "", SUMMARY, ""]
    for title, rows in (("Options", OPTIONS), ("Commands", COMMANDS)):
        pad = max(len(name) for name, _ in rows) + 4
        lines.append(f"{title}:")
        for name, text in rows:
            wrapped = textwrap.wrap(text, max(20, width - pad)) or [""]
            lines.append(f"  {name.ljust(pad - 2)}{wrapped[0]}")
            lines += [" " * pad + more for more in wrapped[1:]]
        lines.append("")
    return "\n".join(lines)


def _width() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        try:
            return os.get_terminal_size().columns
        except OSError:
            return 80
