"""Errors the CLI turns into exit codes."""

from __future__ import annotations

from orchestrator.spec import SpecError

__all__ = ["SpecError", "UserError"]


class UserError(Exception):
    """Something the user asked for is wrong (unknown job, wrong state): exit code 2, one line."""
