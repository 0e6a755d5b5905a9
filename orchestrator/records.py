"""A job and an attempt as the registry stores them (`orchestrator.registry` reads and writes them), and
the facts every layer reads off attempts: their cost and whether they were preempted.

Both are plain dataclasses; `JOB_COLUMNS` and `ATTEMPT_COLUMNS` are their field order, which the fast
bulk read (`Registry.snapshot`) relies on when it builds them from tuples.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.states import JobState, Outcome

_STATES = {s.value: s for s in JobState}
_OUTCOMES = {o.value: o for o in Outcome}
#: the column order of Job and Attempt below
JOB_COLUMNS = (
    "job_id", "name", "backend", "state", "reason", "run_uri", "output_uri", "spec_json", "created_at",
    "updated_at", "ended_at", "supervisor_pid", "supervisor_started", "cancel_requested", "backend_job_id",
    "hourly_usd",
)  # fmt: skip
ATTEMPT_COLUMNS = (
    "job_id", "n", "started_at", "ended_at", "pid", "exit_code", "end_reason", "start_step", "end_step",
    "first_step_at", "instance", "spot", "hourly_usd", "outcome",
)  # fmt: skip


@dataclass
class Job:
    job_id: str
    name: str
    backend: str
    state: JobState
    reason: str | None
    run_uri: str
    output_uri: str
    spec: dict[str, Any]
    created_at: float
    updated_at: float
    ended_at: float | None
    supervisor_pid: int | None
    supervisor_started: float | None
    cancel_requested: bool
    backend_job_id: str | None
    hourly_usd: float

    def __post_init__(self) -> None:
        self.state = _STATES.get(self.state) or JobState(self.state)  # the dict: status reads 1000s

    @property
    def storage_options(self) -> dict[str, Any]:
        """checkpoint.storage_options of the job's spec ({} when none)."""
        return dict((self.spec.get("checkpoint") or {}).get("storage_options") or {})

    def run_store(self, retry_seconds: float = 5.0) -> Any:
        """The job's run store (`trainer.runstore.store.RunStore`; imported here, on use, to keep status light)."""
        from trainer.runstore.store import RunStore

        return RunStore(self.run_uri, self.storage_options, retry_seconds=retry_seconds)


@dataclass
class Attempt:
    job_id: str
    n: int
    started_at: float
    ended_at: float | None = None
    pid: int | None = None
    exit_code: int | None = None
    end_reason: str | None = None
    start_step: int | None = None
    end_step: int | None = None
    first_step_at: float | None = None
    instance: str | None = None
    spot: bool | None = None
    hourly_usd: float = 0.0
    #: how it ended (None while it runs); registries from before outcomes were stored: from end_reason
    outcome: Outcome | None = None

    def __post_init__(self) -> None:
        if self.spot is not None:
            self.spot = bool(self.spot)
        if self.outcome is not None:
            self.outcome = _OUTCOMES.get(self.outcome) or Outcome(self.outcome)
        else:
            self.outcome = Outcome.of_reason(self.end_reason)


def job_from_values(values: tuple[Any, ...]) -> Job:
    """A Job from a JOB_COLUMNS tuple."""
    job = Job(*values)
    job.spec = json.loads(values[JOB_COLUMNS.index("spec_json")])
    job.cancel_requested = bool(job.cancel_requested)
    return job


# ---- facts about attempts: what they cost, whether they were preempted ------------------------------
def attempt_cost(attempt: Attempt, state: JobState, now: float, until: float | None = None) -> float:
    """An attempt's cost: its duration at its hourly price. A running attempt counts up to `now` (while
    the job runs); `until` cuts it at that time (cost so far at a step)."""
    if attempt.ended_at is not None:
        end = attempt.ended_at
    else:
        end = now if not state.terminal else attempt.started_at
    if until is not None:
        end = min(end, until) if attempt.ended_at is not None else until
    return max(0.0, end - attempt.started_at) / 3600.0 * attempt.hourly_usd


def cost_usd(attempts: list[Attempt], state: JobState, now: float) -> float:
    """What the attempts cost so far (running ones up to `now` while the job is active)."""
    return sum(attempt_cost(a, state, now) for a in attempts)


def preempted(attempt: Attempt) -> bool:
    """The attempt ended by a spot preemption (simulated or real)."""
    return attempt.outcome is Outcome.PREEMPTED
