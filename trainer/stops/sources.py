"""The stop sources the loop polls after every step (trainer/observers.py `StopSource`), and the stop
before the first step.

The preemption notice (signals, cloud metadata: stops/preemption.py, stops/notices.py) and the stop
request (stops/stop_request.py) raise the flag from their own threads; these are the sources that decide
on the training thread, each keeping its own clock. The health checks (trainer/health/rules.py) add one.
The budget is also asked between evaluation batches (`BudgetStop.in_eval`), as the flag is.

Before the first step (tokenisation, model load, checkpoint read, the evaluation before training) there is
nothing to save: a raised flag ends the attempt there (`Interrupted`, exit 75). The loop asks at the
points every rank reaches alike; the data and model loaders ask `check_setup` between their own phases,
which only a single process arms (`arm_setup`: one rank leaving alone would leave the others waiting in a
collective).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.observers import Stop
from trainer.stops import budget

#: the flag `check_setup` asks (`arm_setup`); None: not armed (several ranks, or not in an attempt)
_SETUP_FLAG: Any = None


class Interrupted(Exception):
    """A notice (or a stop request, the budget) before the first step: nothing to save, nothing
    half-written; the attempt leaves with exit 75 (trainer/loop.py `run`). `where`: the phase it cut."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where
        self.code: int | None = None  # set by the loop once it recorded the stop


def arm_setup(flag: Any) -> None:
    """`check_setup` asks `flag` from now on (a single process: every check is its own to act on)."""
    global _SETUP_FLAG
    _SETUP_FLAG = flag


def disarm_setup() -> None:
    global _SETUP_FLAG
    _SETUP_FLAG = None


def check_setup(where: str) -> None:
    """Raise `Interrupted` when the armed flag is set: asked between tokenisation chunks and model
    loading phases (trainer/data/dataset.py, trainer/model/load.py). One attribute read when not armed."""
    if _SETUP_FLAG is not None and _SETUP_FLAG.is_set():
        raise Interrupted(where)


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

    def in_eval(self, step: int) -> bool:
        """Asked between evaluation batches: the same rule, without observing a step (an evaluation is no
        step); True when it stopped (a stop request, then the flag: the evaluation is abandoned and the
        loop saves). Never after the last step: the final evaluation and output end the run, as `poll`."""
        if step >= self.steps or self.flag.is_set():
            return False
        over = self.watch.over(None, self.checkpoints.last_time)
        if not over:
            return False
        budget.stop_now(self.store, self.flag, over, self.log)
        return True


class SpotProbeStop:
    """Spot return (stops/spot_probe.py): on demand, ahead of the deadline, checkpoint and go back to spot
    (exit 75: SkyPilot re-walks `ordered` from spot)."""

    def __init__(self, probe: Any, steps: int, reporter: Any) -> None:
        self.probe, self.steps, self.reporter = probe, steps, reporter

    def poll(self, step: int) -> Stop | None:
        if self.probe.due(step, self.steps, self.reporter.steps_per_s()):
            return Stop(self.probe.reason)
        return None
