"""`ftorch estimate`, `ftorch plan`, `ftorch gpus` (sizing and choosing). Placeholder until issue 3 lands."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the sizing commands to the CLI."""
