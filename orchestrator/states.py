"""Job states and attempt outcomes, as enums.

Both are `str` enums: the registry (SQLite) and `status --json` store and show the plain value
("RUNNING", "preempted"), and a member compares equal to its value, so rows written before the enums
existed read back unchanged.

An attempt ends with an `Outcome` (what happened, a fixed word) and a reason (prose for people: "preempted
(with notice, step 40)"). Code decides on the outcome only; the prose is never parsed, except once, in
`Outcome.of_reason`, for registries written before the outcome was stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _Word(str, Enum):
    """A str enum that prints, formats and hashes as its value (so "RUNNING" in TERMINAL works)."""

    def __str__(self) -> str:
        return str.__str__(self)

    __format__ = str.__format__
    __hash__ = str.__hash__


class JobState(_Word):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    #: stopped by the budget guard (the next checkpoint interval would pass resources.budget_usd)
    STOPPED = "STOPPED"
    #: the health checks ended the run (trainer/health/rules.py): non-finite losses or spikes that rollbacks
    #: did not cure; never restarted; the reason says what and the newest healthy checkpoint is kept
    UNHEALTHY = "UNHEALTHY"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.UNHEALTHY}
)
#: in the order `resume` names them
RESUMABLE = (JobState.FAILED, JobState.CANCELLED, JobState.STOPPED, JobState.UNHEALTHY)
ACTIVE = frozenset(set(JobState) - TERMINAL)


class Outcome(_Word):
    """How an attempt (or a job) ended."""

    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"
    #: the budget guard stopped it at a checkpoint
    BUDGET = "budget"
    #: a spot preemption (simulated, a notice from outside, or a SkyPilot recovery)
    PREEMPTED = "preempted"
    #: the policy moved the job to another market (spot <-> on demand) after a checkpoint
    SWITCH = "switch"
    #: the trainer crashed and will be restarted
    CRASHED = "crashed"
    FAILED = "failed"
    #: another attempt owns the run (fencing): never restarted, that would fence the owner
    FENCED = "fenced"
    #: the supervisor died under the attempt
    LOST = "lost"
    #: out of memory: the trainer recorded a smaller micro-batch per GPU (same effective batch) and the
    #: next attempt resumes with it; no crash counted (trainer/train_step/oom.py)
    ADAPTED = "adapted"
    #: the health checks ended the run (exit 86, trainer/health/rules.py): never restarted
    UNHEALTHY = "unhealthy"
    #: no step within the stall timeout (trainer/stops/watchdog.py): the trainer's watchdog ended it
    #: (exit 87) or the supervisor killed it for a stale heartbeat; restarted once per progress
    STALLED = "stalled"

    @classmethod
    def of_reason(cls, reason: str | None) -> Outcome | None:
        """The outcome of a reason written before outcomes were stored (its first word said it)."""
        if not reason:
            return None
        word = reason.split(maxsplit=1)[0].rstrip(":").lower()
        if word == "supervisor":
            return cls.LOST
        return cls._value2member_map_.get(word)  # type: ignore[return-value] # no exception per miss


@dataclass(frozen=True)
class AttemptEnd:
    """An attempt's outcome and the prose the registry shows for it."""

    outcome: Outcome
    reason: str
    #: the reason without its outcome word ("failed: <detail>"), for the job's own reason
    detail: str | None = None

    @classmethod
    def of(cls, outcome: Outcome, detail: str | None = None) -> AttemptEnd:
        """`failed: <detail>`-style reasons; a bare outcome reads as its word."""
        return cls(outcome, outcome.value if detail is None else f"{outcome.value}: {detail}", detail)
