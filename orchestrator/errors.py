"""Errors the CLI turns into exit codes, and `one_line` for any error shown on one line."""

from __future__ import annotations

import re

__all__ = ["SpecError", "SpecErrors", "UserError", "one_line", "quoted", "QUOTE_LIMIT"]

#: the most characters of a value an error line quotes (a 120 KB value must not fill the terminal)
QUOTE_LIMIT = 200


class SpecError(Exception):
    """Bad input: the CLI prints `field: message` on one line and exits 2.

    Defined here (not in `spec`) so that importing the CLI's errors does not load pydantic.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class SpecErrors(SpecError):
    """Several problems with one job file, all reported at once (`field` and `message` are the first's,
    so a reader of one error still gets one). One problem prints as one line, as a SpecError does."""

    def __new__(cls, errors: list[SpecError]) -> SpecError:  # type: ignore[misc]
        if len(errors) == 1:
            return errors[0]
        return super().__new__(cls)

    def __init__(self, errors: list[SpecError]) -> None:
        super().__init__(errors[0].field, errors[0].message)
        self.errors = errors

    def __str__(self) -> str:
        lines = [f"{len(self.errors)} problems in the job file (fix them all, then run again):"]
        return "\n".join(lines + [f"  {e}" for e in self.errors])


class UserError(Exception):
    """Something the user asked for is wrong (unknown job, wrong state): exit code 2, one line."""


def one_line(exc: BaseException, limit: int = 600) -> str:
    """An error on one line that keeps its cause: SkyPilot's launch errors are long and the cause is
    often at the end (or in the chained exception), so a long text keeps its head and its tail."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(current)).split())
        part = f"{current.__class__.__name__}: {text}" if text else current.__class__.__name__
        if not any(part in p for p in parts):
            parts.append(part)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    line = " <- caused by ".join(parts)
    if len(line) <= limit:
        return line
    head = limit // 4
    return f"{line[:head]} ... {line[-(limit - head - 5) :]}"


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, at most about `limit` characters: a long one keeps its head and says how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters)"
