"""The health rules (`train.health`): one torch-free module for the trainer, the docs and the readers.

Per optimizer step the trainer hands `HealthRules.judge` the step's agreed loss, the gradient norm and one
all-reduced "something is not finite" flag (every rank decides alike); the answer is what to do:

- `STEP`: a healthy step (the optimizer steps).
- `SKIP`: a non-finite loss or gradient norm (fp16's own scaler skips, a finite loss with an overflowed
  gradient under fp16-mixed, are normal and not counted): the optimizer step is skipped, the data and the
  schedule move on. `max_skips_in_a_row` such steps are allowed.
- `ROLLBACK`: one more skip than that, or a loss spike after `warmup_steps` (`spike_factor` x the largest loss
  seen): the weights and optimizer go back to the newest healthy checkpoint; the step counter,
  the data position and the schedule stay where they are, so the data window that led here is stepped
  over. The rolled-back state is checkpointed at once, so a resume continues from it (deterministic).
- `UNHEALTHY`: a rollback wanted after `max_rollbacks` of them, or with no healthy checkpoint to go to:
  the attempt ends with exitcodes.UNHEALTHY, which no launcher restarts.

A sustained rise (`rise_factor` x the mean of the last `rise_window` losses for `rise_patience` steps
in a row) only warns. Defaults from the anchors (docs/health.md): Megatron-LM (non-finite checks on by
default, a spike is 10x the largest loss seen), LLM Foundry's KillLossSpike (2x the 100-step mean,
patience 4), NVIDIA's resiliency extension (at most 3 restarts without progress, first iterations not
monitored).

`HealthState` travels with the checkpoint (`TrainerState.health`), so the counters survive a resume;
`manifest_meta` says in the checkpoint's manifest whether it is healthy.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

STEP, SKIP, ROLLBACK, UNHEALTHY = "step", "skip", "rollback", "unhealthy"


def finite(value: float | None) -> bool:
    """None (not measured) counts as finite."""
    return value is None or math.isfinite(value)


@dataclass
class Verdict:
    action: str
    reason: str = ""
    warning: str | None = None


@dataclass
class HealthState:
    """The counters that travel with the checkpoint."""

    skipped: int = 0  # non-finite steps skipped in all
    in_a_row: int = 0
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # {"at_step", "to_step", "reason"}
    max_loss: float | None = None  # the largest finite loss seen
    healthy: bool = True  # the newest step's loss was finite (and not a spike)

    def to_json(self) -> dict[str, Any]:
        return {
            "skipped": self.skipped,
            "in_a_row": self.in_a_row,
            "rollbacks": list(self.rollbacks),
            "max_loss": self.max_loss,
            "healthy": self.healthy,
        }

    @classmethod
    def from_json(cls, saved: dict[str, Any] | None) -> HealthState:
        saved = saved or {}
        return cls(
            skipped=int(saved.get("skipped", 0)),
            in_a_row=int(saved.get("in_a_row", 0)),
            rollbacks=list(saved.get("rollbacks") or []),
            max_loss=saved.get("max_loss"),
            healthy=bool(saved.get("healthy", True)),
        )


class HealthRules:
    """`judge` per step; `spec` is the job's `train.health` (a HealthSpec or anything with its fields)."""

    def __init__(self, spec: Any, state: HealthState | None = None) -> None:
        self.spec = spec
        self.state = state or HealthState()
        self._window: deque[float] = deque(maxlen=spec.rise_window)
        self._rising = 0

    def judge(self, step: int, loss: float, grad_norm: float | None, not_finite: bool) -> Verdict:
        """What to do with step `step` (1-based, the step being taken). `not_finite`: the all-reduced
        flag (loss or gradient norm not finite on any rank)."""
        s, spec = self.state, self.spec
        if not spec.enabled:
            return Verdict(STEP)
        if not_finite:
            s.skipped += 1
            s.in_a_row += 1
            s.healthy = False
            what = "loss" if not finite(loss) else "gradient norm"
            value = loss if not finite(loss) else grad_norm
            reason = f"{what} {_word(value)} at step {step}"
            if s.in_a_row > spec.max_skips_in_a_row:
                return self._rollback(f"{reason} ({s.in_a_row} in a row)")
            return Verdict(SKIP, reason)
        s.in_a_row = 0
        if step > spec.warmup_steps and s.max_loss is not None and loss > spec.spike_factor * s.max_loss:
            s.healthy = False
            return self._rollback(
                f"loss spike at step {step}: {loss:.4g} > {spec.spike_factor:g}x {s.max_loss:.4g}"
            )
        s.healthy = True
        s.max_loss = loss if s.max_loss is None else max(s.max_loss, loss)
        return Verdict(STEP, warning=self._rise(step, loss))

    def _rollback(self, reason: str) -> Verdict:
        if len(self.state.rollbacks) >= self.spec.max_rollbacks:
            return Verdict(UNHEALTHY, f"{reason} after {_times(len(self.state.rollbacks))}")
        return Verdict(ROLLBACK, reason)

    def rolled_back(self, at_step: int, to_step: int, reason: str) -> None:
        """A rollback happened: count it; the next step starts a fresh streak."""
        self.state.rollbacks.append({"at_step": at_step, "to_step": to_step, "reason": reason})
        self.state.in_a_row = 0
        self.state.healthy = True
        self._window.clear()
        self._rising = 0

    def _rise(self, step: int, loss: float) -> str | None:
        """A sustained rise: `rise_patience` steps in a row above rise_factor x the window's mean."""
        spec = self.spec
        full = len(self._window) == self._window.maxlen
        mean = sum(self._window) / len(self._window) if self._window else None
        self._window.append(loss)
        if not full or mean is None or loss <= spec.rise_factor * mean:
            self._rising = 0
            return None
        self._rising += 1
        if self._rising == spec.rise_patience:
            return (
                f"loss rising: {spec.rise_patience} steps above {spec.rise_factor:g}x the mean of the last "
                f"{spec.rise_window} steps ({loss:.4g} vs {mean:.4g}) at step {step}"
            )
        return None


def manifest_meta(health: HealthState | None) -> dict[str, Any]:
    """What a checkpoint's manifest says about its health (`healthy`; absent in older ones: healthy)."""
    return {"healthy": bool(health.healthy)} if health is not None else {}


def unhealthy_reason(store: Any, attempt: int | None) -> str:
    """`unhealthy: <why>; newest healthy checkpoint: step N` from the attempt's epoch record."""
    try:
        records = store.epoch_records()
    except Exception:  # noqa: BLE001 - advisory: the exit code alone still says unhealthy
        records = {}
    for _n, record in sorted(records.items(), reverse=True):
        if record.get("ended") == "unhealthy" and (attempt is None or record.get("attempt") == attempt):
            healthy = record.get("healthy_step")
            kept = f"newest healthy checkpoint: step {healthy}" if healthy else "no healthy checkpoint"
            return f"{record.get('stop_detail') or 'unhealthy'}; {kept}"
    return "unhealthy (the trainer's health checks ended the run)"


def ended_as(store: Any, attempt: int | None) -> str | None:
    """How the attempt's epoch record says it ended (`unhealthy`, `stalled`, ...), or None."""
    try:
        records = store.epoch_records()
    except Exception:  # noqa: BLE001 - advisory
        return None
    for _n, record in sorted(records.items(), reverse=True):
        if record.get("attempt") == attempt:
            return record.get("ended")
    return None


def stall_reason(store: Any, attempt: int | None) -> str:
    """The watchdog's `stalled: ...` line from the attempt's epoch record (trainer/stops/watchdog.py)."""
    try:
        records = store.epoch_records()
    except Exception:  # noqa: BLE001 - advisory
        records = {}
    for _n, record in sorted(records.items(), reverse=True):
        if record.get("ended") == "stalled" and (attempt is None or record.get("attempt") == attempt):
            return str(record.get("stop_detail") or "stalled")
    return "stalled (the trainer's watchdog ended it)"


def _word(value: float | None) -> str:
    if value is None:
        return "missing"
    return "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _times(n: int) -> str:
    return "1 rollback" if n == 1 else f"{n} rollbacks"
