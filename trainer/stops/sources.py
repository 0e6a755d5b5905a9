"""The stop sources the loop polls after every step (trainer/observers.py `StopSource`).

The preemption notice (signals, cloud metadata: stops/preemption.py, stops/notices.py) and the stop
request (stops/stop_request.py) raise the flag from their own threads; these are the sources that decide
on the training thread, each keeping its own clock. The health checks (trainer/health/rules.py) add one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.observers import Stop
from trainer.stops import budget


class BudgetStop:
    """resources.budget_usd (stops/budget.py): rank 0's watch; a stop request, then the flag."""

    def __init__(
        self, watch: Any, store: Any, flag: Any, checkpoints: Any, steps: int, log: Callable[[str], None]
    ) -> None:
        self.watch, self.store, self.flag, self.checkpoints = watch, store, flag, checkpoints
        self.steps, self.log = steps, log

    def poll(self, step: int) -> Stop | None:
        if step >= self.steps:
            return None
        over = self.watch.over(step, self.checkpoints.last_time)
        if not over:
            return None
        budget.stop_now(self.store, self.flag, over, self.log)  # a stop request, then the flag
        return Stop(budget.BUDGET)


class SpotProbeStop:
    """Spot return (stops/spot_probe.py): on demand, ahead of the deadline, checkpoint and go back to spot
    (exit 75: SkyPilot re-walks `ordered` from spot)."""

    def __init__(self, probe: Any, steps: int, reporter: Any) -> None:
        self.probe, self.steps, self.reporter = probe, steps, reporter

    def poll(self, step: int) -> Stop | None:
        if self.probe.due(step, self.steps, self.reporter.steps_per_s()):
            return Stop(self.probe.reason)
        return None
