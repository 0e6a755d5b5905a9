"""The loop's named points, and the two kinds of part that plug into them (no torch).

- An **observer** records: it is called at `step`, `eval`, `checkpoint_start`/`checkpoint` and `stop`
  and never changes the training state (the progress reporter, the trackers, the measurer, the notifier).
  Adding a recorder is one class with the methods it needs, appended to `Attempt.observers`.
- A **stop source** can end an attempt: after each step the loop asks each one `poll(step)`; the first
  `Stop` wins. A `Stop` without a `code` raises the preemption flag (checkpoint, then exit as the flag
  says: PREEMPTED, or BUDGET_STOPPED for the budget); one with a `code` ends the attempt with it at once
  (the health checks' UNHEALTHY: no checkpoint of an unhealthy state). Signals, cloud notices and stop
  requests are sources that raise the same flag from their own threads (`trainer/stops/`); the loop sees
  them at the next step boundary, agreed by every rank. Adding a stop source is one class with `poll`,
  appended to `Attempt.stop_sources`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step produced (every rank has the same, loss and grad norm agreed)."""

    step: int
    loss: float
    lr: float
    grad_norm: float | None
    #: input tokens of this step (this rank's), and seen so far
    tokens: int
    tokens_seen: int
    #: the optimizer step was skipped (the health checks: a non-finite loss or gradient)
    skipped: bool = False


class Observer:
    """A recorder called at the loop's named points; every method is optional (a no-op here)."""

    def on_step(self, record: StepRecord) -> None:
        """After each optimizer step."""

    def on_eval(self, step: int, result: dict[str, float]) -> None:
        """After a mid-run or final held-out evaluation."""

    def on_checkpoint_start(self, step: int) -> None:
        """Before a checkpoint is written."""

    def on_checkpoint(self, step: int, blocking_s: float) -> None:
        """After a checkpoint is handed to its writer (blocking_s: what the loop waited)."""

    def on_stop(self, step: int, reason: str | None) -> None:
        """The attempt leaves before the last step (after its final checkpoint, if any)."""


class Observers(list[Observer]):
    """The attempt's observers, called in order."""

    def step(self, record: StepRecord) -> None:
        for observer in self:
            observer.on_step(record)

    def eval(self, step: int, result: dict[str, float]) -> None:
        for observer in self:
            observer.on_eval(step, result)

    def checkpoint_start(self, step: int) -> None:
        for observer in self:
            observer.on_checkpoint_start(step)

    def checkpoint(self, step: int, blocking_s: float) -> None:
        for observer in self:
            observer.on_checkpoint(step, blocking_s)

    def stop(self, step: int, reason: str | None) -> None:
        for observer in self:
            observer.on_stop(step, reason)


@dataclass(frozen=True)
class Stop:
    """A stop source's answer: why; and the exit code when the attempt must end without a checkpoint."""

    reason: str
    code: int | None = None


class StopSource(Protocol):
    """Something that can end an attempt, asked after every step."""

    def poll(self, step: int) -> Stop | None: ...


def poll_all(sources: list[Any], step: int) -> list[Stop]:
    """What every source says after `step`, in order (each is asked: each keeps its own clock)."""
    return [stop for source in sources if (stop := source.poll(step)) is not None]
