"""`ftorch --help` without typer: the command list, kept equal to typer's own by
tests/orchestrator_tests/cli/test_entry.py (which prints the tuples to paste when a command changes), rendered
as plain text. typer and rich take ~0.3 s to import; this module takes nothing."""

from __future__ import annotations

import os
import textwrap

SUMMARY = "Fine-tune language models on the cheapest adequate (spot) GPUs, without losing work."
#: (name, first paragraph of its help), in typer's order
COMMANDS = (
    ('init', 'Write a commented starter job for a model and method.'),
    ('convert', 'Write a ftorch job from an axolotl config; list what could not be mapped.'),
    ('validate', 'Check a job file (schema, local files, and the plan on the skypilot backend); launch nothing.'),
    ('estimate', 'Peak GPU memory per GPU for a job, with its breakdown (analytic; traced with --trace).'),
    ('plan', 'Rank the offers by expected cost: fits or why not, hours, cost on spot and on demand, the choice.'),
    ('gpus', "The GPU catalog in use and where it came from: one row per accelerator (consumer cards, then datacenter); `gpus NAME` lists that accelerator's instances."),
    ('hazards', 'Spot interruption rates, capacity and their evidence (orchestrator/spot/hazards.py).'),
    ('launch', 'Validate, plan and launch a job; print its id.'),
    ('sweep', 'Launch one job per point of a grid as a group; `ftorch status` ranks them by held-out loss.'),
    ('status', 'All jobs, or one job in detail.'),
    ('logs', "The trainer's log across all attempts."),
    ('metrics', 'The metric history of JOB across all attempts: step, attempt, loss, lr, grad norm, held-out loss (train.eval_every), tokens/s.'),
    ('report', "Write JOB's report (loss and held-out curves, attempts, cost ledger, plan) as one HTML file."),
    ('env', "Show the exact library versions JOB's attempts install (and where that lock came from)."),
    ('export', 'Write a PEFT adapter (or, with --merge, a merged model) from a checkpoint of JOB, with its model card and training_summary.json; optionally push it to the Hugging Face Hub.'),
    ('generate', "Answer one prompt with JOB's trained model (a checkpoint: the adapter merged into its base)."),
    ('chat', "Talk to JOB's trained model: one line per turn; an empty line or Ctrl-D ends. Chat data keeps the conversation; instruction and text data answer each line on its own."),
    ('cancel', 'Stop jobs; their checkpoints are kept.'),
    ('resume', 'Continue a stopped, failed or cancelled run from its newest checkpoint.'),
    ('attach', "Register a run found in its store (another machine's, or after the registry was lost)."),
    ('simulate', 'Replay spot availability traces: cost, finish time and deadline of each policy.'),
    ('history', 'What runs measured (peak memory, tokens/s) and whether the planner uses it.'),
    ('controller', "Run a SkyPilot job's controller in the foreground (on an always-on machine; docs/clouds.md)."),
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
