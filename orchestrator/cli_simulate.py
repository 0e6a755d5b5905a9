"""`ftorch simulate` (spot/on-demand policies replayed on traces). Placeholder until issue 8 lands."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the simulation command to the CLI."""
