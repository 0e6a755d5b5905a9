"""Checks for the small JSON files of a run store (progress.json), made when they are read.

Anyone can edit a run store, and a half-written or hand-edited file must not crash a supervisor or
`ftorch status`: a file that does not check out is reported in one line and treated as absent.
Hand-written rather than pydantic: `ftorch status` reads these files for every job and must not load
pydantic (see orchestrator/views/status.py).
"""

from __future__ import annotations

from typing import Any

_INT = "an integer"
_NUM = "a number"
_STR = "a string"
_OBJ = "an object"

#: progress.json fields and what each must be (None is always allowed); other fields are kept as they are
PROGRESS_FIELDS: dict[str, str] = {
    "run_id": _STR,
    "attempt": _INT,
    "state": _STR,
    "step": _INT,
    "start_step": _INT,
    "total_steps": _INT,
    "loss": _NUM,
    "lr": _NUM,
    "tokens_seen": _INT,
    "tokens_per_s": _NUM,
    "steps_per_s": _NUM,
    "eta_s": _NUM,
    "attempt_started_at": _NUM,
    "first_step_at": _NUM,
    "updated_at": _NUM,
    "finished_at": _NUM,
    "last_checkpoint_step": _INT,
    "last_checkpoint_at": _NUM,
    "output_uri": _STR,
    "eval_before": _OBJ,
    "eval_after": _OBJ,
}


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    if kind == _INT:
        return isinstance(value, int) and value >= 0
    if kind == _NUM:
        return isinstance(value, (int, float)) and value == value  # not NaN
    if kind == _STR:
        return isinstance(value, str)
    # an evaluation: numbers, or null for one that was not finite (trainer/runstore/finite_json.py)
    return isinstance(value, dict) and all(
        v is None or _is(v, _NUM) or k == "nonfinite" for k, v in value.items()
    )


def progress_problem(data: Any) -> str | None:
    """Why `data` (a parsed progress.json) cannot be used, or None when it can."""
    if not isinstance(data, dict):
        return f"not a JSON object (a {type(data).__name__})"
    for key, kind in PROGRESS_FIELDS.items():
        value = data.get(key)
        if value is not None and not _is(value, kind):
            return f"'{key}' must be {kind} (got {value!r:.40})"
    return None


def checked_progress(data: Any) -> dict[str, Any] | None:
    """`data` if it is a usable progress snapshot, else None."""
    return data if progress_problem(data) is None else None
