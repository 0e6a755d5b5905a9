"""The cloud controller's notifications for a SkyPilot job (a hook for orchestrator/spot/controller.py).

The budget is not the controller's: the trainer stops itself at `resources.budget_usd`
(trainer/stops/budget.py), exits 0, and `ftorch status` reads the stop from the run store
(skypilot_state.budget_stop). Every event the controller sees (preempted, succeeded, failed, cancelled)
goes to orchestrator.backends.notify as on the local backend (which skips what the job already delivered).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from orchestrator.backends.notify import notify_job
from orchestrator.registry import Registry
from trainer.stops.interruptions import SPEND_RECORD

SPEND_FILE = SPEND_RECORD
#: the trainer's stop-request poll on a cloud VM (trainer/stops/stop_request.py) plus a save and exit
STOP_REACTION_S = 10.0 + 30.0


def event_hook(registry: Registry, job_id: str) -> Any:
    """`on_event(event, reason)` for the controller: the budget stop's records, then the notification."""

    def log(message: str) -> None:
        sys.stdout.write(f"{time.strftime('%H:%M:%S')} [controller] {message}\n")
        sys.stdout.flush()

    def on_event(event: str, reason: str | None) -> None:
        log(f"{event}" + (f": {reason}" if reason else ""))
        notify_job(registry, job_id, event, log)

    return on_event
