"""Stop requests through the run store, polled: a controller elsewhere asks this attempt to checkpoint
and stop.

The cloud controller (orchestrator/spot/controller.py) cannot signal a process on a SkyPilot VM, but it can
write to the run store both of them use: `control/stop.json` (trainer.stops.interruptions.request_stop, the
same request `ftorch cancel` and the budget guard write before their SIGTERM). A background thread here
polls for a request made after this attempt started and sets the PreemptionFlag a SIGTERM or a cloud
notice sets; the loop checkpoints at the next step, records the attempt as `stopped` (not an
interruption) and exits 75.

Only on SkyPilot (SKYPILOT_TASK_ID set), where a controller can exist, unless FTORCH_STOP_POLL_S is set:
    FTORCH_STOP_POLL_S=10   seconds between polls (0 disables the watcher)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from trainer.stops.interruptions import STOP_REQUEST, stop_reason

__all__ = ["STOP_REQUEST", "StopRequestWatcher", "start_stop_watcher"]


class Flag(Protocol):
    def set(self, reason: str) -> None: ...

    def is_set(self) -> bool: ...


class StopRequestWatcher(threading.Thread):
    def __init__(
        self,
        flag: Flag,
        store: Any,
        poll_s: float,
        log: Callable[[str], None] | None = None,
        since: float | None = None,
    ) -> None:
        super().__init__(name="ftorch-stop-request", daemon=True)
        self.flag, self.store, self.poll_s = flag, store, poll_s
        self.since = time.time() if since is None else since  # requests older than the attempt are stale
        self.log = log or (lambda _m: None)
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def check(self) -> bool:
        """One poll: True (and the flag set) when a request newer than the attempt is there."""
        reason = stop_reason(self.store, self.since)
        if reason is None:
            return False
        self.log(f"stop requested through the run store: {reason}")
        self.flag.set(f"controller: {reason}")
        return True

    def run(self) -> None:
        while not self.stopped.is_set() and not self.flag.is_set():
            if self.check():
                return
            self.stopped.wait(self.poll_s)


def start_stop_watcher(flag: Flag, store: Any, log: Callable[[str], None] | None = None) -> Any:
    """Start polling the run store for a stop request (see above). Returns the thread, or None."""
    default = "10" if os.environ.get("SKYPILOT_TASK_ID") else "0"
    poll_s = float(os.environ.get("FTORCH_STOP_POLL_S", default) or 0)
    if poll_s <= 0:
        return None
    watcher = StopRequestWatcher(flag, store, poll_s, log)
    watcher.start()
    return watcher
