"""The budget guard: stop a run, checkpoint kept, before it would spend more than `resources.budget_usd`.

The rule: when the cost so far plus the cost of the next checkpoint interval would pass the budget,
stop now (the trainer gets its notice, saves, exits), so the last checkpoint lands inside the budget.
The interval is `checkpoint.every` steps at the observed step rate, or `every` seconds, or (for
`auto`) the gap between the last two checkpoints seen; until two have been seen, the interval the
trainer starts with (trainer.checkpoints.interval: the same model, clamps and interruption prior as
the trainer and the planner); plus MARGIN_S for the guard's own reaction time. While the step rate is
still unknown (the first attempt starting up) only the margin counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.checkpoints.interval import AutoInterval, fixed_interval_s

#: what the guard itself adds: it looks once a second, and the trainer takes a moment to save and exit
MARGIN_S = 2.0


@dataclass
class BudgetGuard:
    budget_usd: float | None
    hourly_usd: float
    every_steps: int | None = None
    every_seconds: float | None = None
    #: steps per second from earlier attempts (progress.json), until this attempt has its own
    prior_rate: float | None = None
    #: the guard's own reaction time (a cloud controller looks once a tick, the trainer polls its stop)
    margin_s: float = MARGIN_S
    #: `auto`: the trainer's interval model (its prior MTBF and first cost) until two checkpoints are seen
    auto: AutoInterval = field(default_factory=AutoInterval)
    _first: tuple[float, int] | None = None
    _last: tuple[float, int] | None = None
    _ckpt_times: list[float] = field(default_factory=list)

    @classmethod
    def for_spec(cls, spec: dict[str, Any], hourly_usd: float, progress: dict[str, Any]) -> BudgetGuard:
        from trainer.config import read_every

        steps, seconds = read_every((spec.get("checkpoint") or {}).get("every", "auto"))
        return cls(
            budget_usd=(spec.get("resources") or {}).get("budget_usd"),
            hourly_usd=hourly_usd,
            every_steps=steps,
            every_seconds=seconds,
            prior_rate=progress.get("steps_per_s") or None,
        )

    def observe_step(self, step: int, now: float) -> None:
        if self._first is None:
            self._first = (now, step)
        if self._last is None or step != self._last[1]:
            self._last = (now, step)

    def observe_checkpoint(self, at: float | None) -> None:
        if at and (not self._ckpt_times or at != self._ckpt_times[-1]):
            self._ckpt_times.append(at)

    def rate(self) -> float | None:
        if self._first and self._last and self._last[1] > self._first[1] and self._last[0] > self._first[0]:
            return (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
        return self.prior_rate

    def interval_s(self) -> float | None:
        """Seconds until the next checkpoint interval is done; None while the step rate is unknown."""
        if self.every_steps is not None or self.every_seconds is not None:
            rate = self.rate()
            return fixed_interval_s(self.every_steps, self.every_seconds, 1.0 / rate if rate else None)
        if len(self._ckpt_times) >= 2:
            return self._ckpt_times[-1] - self._ckpt_times[-2]
        return self.auto.choose()[0]

    def check(self, spent_usd: float) -> str | None:
        """A reason starting with 'budget' when the run must stop now, else None."""
        if self.budget_usd is None or self.hourly_usd <= 0:
            return None
        interval = (self.interval_s() or 0.0) + self.margin_s
        next_cost = interval / 3600.0 * self.hourly_usd
        if spent_usd + next_cost <= self.budget_usd:
            return None
        return (
            f"budget: ${spent_usd:.4f} spent + ${next_cost:.4f} for the next checkpoint interval "
            f"would pass budget_usd ${self.budget_usd:g}; checkpoint kept"
        )
