"""Fault injection for tests: die at a named point, which no outside signal can hit reliably.

FTORCH_FAULTS="checkpoint-partial@15,before-manifest@20" kills the process with SIGKILL at those points
of the checkpoint for those steps. Unset (always, outside tests), this costs one dict lookup.
"""

from __future__ import annotations

import os
import signal


def _parse(text: str) -> set[tuple[str, int]]:
    points = set()
    for item in text.split(","):
        if "@" in item:
            name, step = item.strip().split("@", 1)
            points.add((name, int(step)))
    return points


_POINTS = _parse(os.environ.get("FTORCH_FAULTS", ""))


def maybe_die(point: str, step: int) -> None:
    if (point, step) in _POINTS:
        os.kill(os.getpid(), signal.SIGKILL)
