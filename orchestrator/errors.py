"""Errors the CLI turns into exit codes."""

from __future__ import annotations

__all__ = ["SpecError", "UserError"]


class SpecError(Exception):
    """Bad input: the CLI prints `field: message` on one line and exits 2.

    Defined here (not in `spec`) so that importing the CLI's errors does not load pydantic.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class UserError(Exception):
    """Something the user asked for is wrong (unknown job, wrong state): exit code 2, one line."""
