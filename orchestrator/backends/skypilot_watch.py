"""The cloud controller's budget and notifications for a SkyPilot job (hooks for orchestrator/spot/controller.py).

- Spend: what `ftorch status` shows for the job, skypilot_cost's price x SkyPilot's running time summed
  over placements (the registry's `skypilot.json`, kept in step each tick by `on_record`); the price is
  the current placement's (the plan's offer it landed on, times its nodes).
- The rule is the local supervisor's (orchestrator.spot.budget.BudgetGuard): stop when the spend plus the next
  checkpoint interval would pass `resources.budget_usd`, with the controller's reaction time (a tick, and
  the trainer's stop-request poll) as the margin.
- The run store knows both: `control/spend.json` (price, spend, budget, when) is written every tick.
- Events: the budget stop ends the open attempt as `budget` and the job STOPPED "budget: ..."; every
  event (preempted, budget, succeeded, failed, cancelled) goes to orchestrator.notify as on the local
  backend.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from orchestrator.backends import skypilot_cost as cost
from orchestrator.backends import skypilot_state
from orchestrator.notify import notify_job
from orchestrator.registry import JobState, Outcome, Registry
from orchestrator.spot.budget import BudgetGuard
from trainer.stops.interruptions import SPEND_RECORD

SPEND_FILE = SPEND_RECORD
#: the trainer's stop-request poll on a cloud VM (trainer/stops/stop_request.py) plus a save and exit
STOP_REACTION_S = 10.0 + 30.0


class CloudBudget:
    """`budget(record, progress, now)` for the controller: a reason starting "budget" when it must stop."""

    def __init__(self, registry: Registry, job_id: str, store: Any, tick_s: float) -> None:
        self.registry, self.job_id, self.store = registry, job_id, store
        job = registry.get(job_id)
        self.guard = BudgetGuard.for_spec(job.spec, 0.0, store.read_progress() or {})
        self.guard.margin_s = tick_s + STOP_REACTION_S
        self.nodes = int((job.spec.get("resources") or {}).get("nodes") or 1)

    def hourly_usd(self, state: Mapping[str, Any]) -> float:
        """The current placement's price; before one, the dearest offer (a resume over its budget stops)."""
        segments = state.get("segments") or []
        if segments and segments[-1].get("hourly_usd") is not None:
            return float(segments[-1]["hourly_usd"])
        dearest = max((float(o["hourly_usd"]) for o in state.get("offers") or []), default=0.0)
        return dearest * self.nodes

    def __call__(
        self, record: Mapping[str, Any] | None, progress: Mapping[str, Any], now: float
    ) -> str | None:
        state = skypilot_state.read_state(self.registry, self.registry.get(self.job_id))
        spent = cost.cost_usd(state) or 0.0
        self.guard.hourly_usd = self.hourly_usd(state)
        if progress.get("step") is not None and str((record or {}).get("status")) == "RUNNING":
            self.guard.observe_step(int(progress["step"]), now)
        self.guard.observe_checkpoint(progress.get("last_checkpoint_at"))
        spend = {
            "hourly_usd": round(self.guard.hourly_usd, 6),
            "spent_usd": round(spent, 6),
            "budget_usd": self.guard.budget_usd,
            "at": now,
            "by": "controller",
        }
        try:
            self.store.write_json(SPEND_FILE, spend)
        except Exception as exc:  # advisory: the registry has the same numbers
            sys.stderr.write(f"controller: could not write {SPEND_FILE}: {exc}\n")
        return self.guard.check(spent)


def event_hook(registry: Registry, job_id: str) -> Any:
    """`on_event(event, reason)` for the controller: the budget stop's records, then the notification."""

    def log(message: str) -> None:
        sys.stdout.write(f"{time.strftime('%H:%M:%S')} [controller] {message}\n")
        sys.stdout.flush()

    def on_event(event: str, reason: str | None) -> None:
        if event == "budget":
            budget_stopped(registry, job_id, reason or "budget")
        log(f"{event}" + (f": {reason}" if reason else ""))
        notify_job(registry, job_id, event, log)

    return on_event


def budget_stopped(registry: Registry, job_id: str, reason: str) -> None:
    """The controller stopped the job at its budget (checkpoint asked for, managed job cancelled)."""
    now = time.time()
    for attempt in registry.attempts(job_id):
        if attempt.ended_at is None:
            registry.update_attempt(
                job_id, attempt.n, ended_at=now, end_reason=reason, outcome=Outcome.BUDGET
            )
    registry.event(job_id, "budget", reason.removeprefix("budget: "))
    registry.set_state(job_id, JobState.STOPPED, reason)
