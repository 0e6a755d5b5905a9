"""Records read back from a run store are input from anyone who can write the store (a shared bucket):
each value is checked for its type before any reader does arithmetic or formatting with it. A value of
the wrong type is dropped with one warning line (once per file and field in a process), so `status`,
`logs`, the ledger and the trainer see "not recorded" rather than a traceback. No torch here."""

from __future__ import annotations

import math
import sys
from typing import Any

#: epoch record (fence/epoch-N.json) fields that are numbers
EPOCH_NUMBERS = frozenset(
    {"attempt", "epoch", "step", "start_step", "claimed_at", "started_at", "ended_at", "hourly_usd", "pid"}
)
EPOCH_TEXTS = frozenset({"ended", "stop_reason", "host", "price_source"})
#: `measured` (trainer/recording/measure.py) fields that are not numbers
MEASURED_TEXTS = frozenset({"device", "gpu_name"})
MEASURED_FLAGS = frozenset({"gradient_checkpointing"})

_warned: set[tuple[str, str]] = set()


def warn(where: str, what: str) -> None:
    """One line on stderr, once per (file, what) in this process."""
    if (where, what) in _warned:
        return
    _warned.add((where, what))
    sys.stderr.write(f"warning: {where}: {what}\n")


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def clean_epoch_record(raw: Any, where: str) -> dict[str, Any]:
    """An epoch record with every value of a wrong type dropped (and warned about); {} for a non-object."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        warn(where, f"not a JSON object ({type(raw).__name__}); skipped as history")
        return {}
    record: dict[str, Any] = {}
    bad: list[str] = []
    for key, value in raw.items():
        if value is None:
            record[key] = None
        elif (
            key in EPOCH_NUMBERS and not is_number(value) or key in EPOCH_TEXTS and not isinstance(value, str)
        ):
            bad.append(key)
        elif key == "measured":
            record[key] = _clean_measured(value, bad)
        elif key == "previous_attempt_step" and not (
            isinstance(value, dict) and all(is_number(v) for v in value.values())
        ):
            bad.append(key)
        else:
            record[key] = value
    if bad:
        warn(where, f"skipped {', '.join(bad)} (not of the recorded type)")
    return record


def _clean_measured(value: Any, bad: list[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        bad.append("measured")
        return {}
    out: dict[str, Any] = {}
    for key, item in value.items():
        if item is None:
            out[key] = None
        elif key in MEASURED_TEXTS:
            if isinstance(item, str):
                out[key] = item
            else:
                bad.append(f"measured.{key}")
        elif key in MEASURED_FLAGS:
            if isinstance(item, bool):
                out[key] = item
            else:
                bad.append(f"measured.{key}")
        elif key == "phases":
            if isinstance(item, dict):
                out[key] = {k: v for k, v in item.items() if is_number(v)}
                bad.extend(
                    f"measured.phases.{k}" for k, v in item.items() if v is not None and not is_number(v)
                )
            else:
                bad.append("measured.phases")
        elif is_number(item):
            out[key] = item
        else:
            bad.append(f"measured.{key}")
    return out
