"""Resume exactness, shown to the user: after a resume, the learning rate the first step will use is
checked against the schedule (trainer/loop.py `lr_lambda_for`) and the data position against the one the
steps taken imply, and the log says "resumed at step N: lr and data position as planned", or names what
differs. No torch here: it reads plain numbers."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

#: relative tolerance of the lr comparison (the schedule is recomputed in float64 both ways)
LR_TOLERANCE = 1e-9


def differences(
    step: int,
    lrs: list[float],
    base_lrs: list[float],
    factor: Callable[[int], float],
    data_position: int,
    expected_position: int,
) -> list[str]:
    """What differs from the plan, in words (empty: as planned)."""
    found = []
    for i, (lr, base) in enumerate(zip(lrs, base_lrs, strict=False)):
        expected = base * factor(step)
        if not math.isclose(lr, expected, rel_tol=LR_TOLERANCE, abs_tol=1e-15):
            group = f" (group {i})" if len(lrs) > 1 else ""
            found.append(f"lr {lr:.6e}{group} where the schedule says {expected:.6e}")
            break
    if data_position != expected_position:
        found.append(f"data position {data_position} where {expected_position} was expected")
    return found


def check(
    step: int,
    scheduler: Any,
    factor: Callable[[int], float],
    data_position: int,
    expected_position: int,
    log: Callable[[str], None],
) -> list[str]:
    """Log the one line about the resume at `step`; return what differs."""
    found = differences(
        step,
        list(scheduler.get_last_lr()),
        list(scheduler.base_lrs),
        factor,
        data_position,
        expected_position,
    )
    if found:
        log(f"resumed at step {step}: not as planned: {'; '.join(found)}")
    else:
        log(f"resumed at step {step}: lr and data position as planned")
    return found
