"""`checkpoint.every: auto`: the Young/Daly interval from the measured checkpoint cost and interruption rate.

Young (1974): the interval that minimises lost work plus checkpoint overhead is about sqrt(2 * C * M),
C the cost of one checkpoint to the training (here: the time training blocks for it) and M the mean
time between interruptions that lose work. Both are re-estimated as the run goes:

- C: an exponential average of the measured blocking times of this attempt's checkpoints;
- M: a prior (the planner's interruption rate for the offer the job landed on, passed in the task;
  else FTORCH_AUTO_MTBF_S, default 1 h: trainer/stops/interruptions.py) updated with the run's own history:
  (prior + exposure) / (1 + interruptions so far), where a requested stop (cancel, budget) is not an
  interruption;
- a preemption with notice loses nothing (the trainer saves when told), so only interruptions without
  one count: M_eff = M / (1 - f), f the fraction of past interruptions that came with a notice
  (FTORCH_NOTICE_FRACTION before the run has a history).

No torch here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from trainer.stops.interruptions import NOT_INTERRUPTIONS, prior_mtbf_s

MIN_INTERVAL_S = float(os.environ.get("FTORCH_AUTO_MIN_INTERVAL_S", "5"))
MAX_INTERVAL_S = float(os.environ.get("FTORCH_AUTO_MAX_INTERVAL_S", "1800"))
#: assumed cost before anything was measured: the first checkpoint comes early and measures it
FIRST_COST_S = 0.05
MAX_NOTICE_FRACTION = 0.95


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval, sqrt(2 * cost * MTBF): the one used by trainer and planner."""
    return math.sqrt(2.0 * max(cost_s, 0.0) * max(mtbf_s, 0.0))


@dataclass
class History:
    """What the run has lived through so far (from the fence records of earlier attempts)."""

    exposure_s: float = 0.0
    interruptions: int = 0
    with_notice: int = 0

    @classmethod
    def from_epochs(cls, records: dict[int, dict[str, Any]], mine: int, now: float) -> History:
        earlier = [records[n] for n in sorted(records) if n < mine]
        starts = [float(r["claimed_at"]) for r in records.values() if r.get("claimed_at")]
        exposure = now - min(starts) if starts else 0.0
        noticed = sum(1 for r in earlier if r.get("ended") == "notice")
        interrupted = sum(1 for r in earlier if r.get("ended") not in NOT_INTERRUPTIONS)  # not a cancel
        return cls(exposure_s=max(0.0, exposure), interruptions=interrupted, with_notice=noticed)


@dataclass
class AutoInterval:
    """Chooses the interval and says why; `observe()` feeds it measured checkpoint costs."""

    mtbf_prior_s: float = field(default_factory=lambda: prior_mtbf_s()[0])
    notice_prior: float = field(default_factory=lambda: float(os.environ.get("FTORCH_NOTICE_FRACTION", "0")))
    history: History = field(default_factory=History)
    min_s: float = MIN_INTERVAL_S
    max_s: float = MAX_INTERVAL_S
    cost_s: float | None = None
    upload_s: float = 0.0
    alpha: float = 0.5

    def observe(self, blocking_s: float, upload_s: float = 0.0) -> None:
        """A measured checkpoint: how long training blocked, how long the upload took."""
        self.cost_s = (
            blocking_s if self.cost_s is None else (1 - self.alpha) * self.cost_s + self.alpha * blocking_s
        )
        self.upload_s = upload_s

    def mtbf_s(self) -> float:
        h = self.history
        return (self.mtbf_prior_s + h.exposure_s) / (1 + h.interruptions)

    def notice_fraction(self) -> float:
        h = self.history
        f = h.with_notice / h.interruptions if h.interruptions else self.notice_prior
        return min(MAX_NOTICE_FRACTION, max(0.0, f))

    def choose(self) -> tuple[float, str]:
        cost = self.cost_s if self.cost_s is not None else FIRST_COST_S
        mtbf = self.mtbf_s()
        f = self.notice_fraction()
        effective = mtbf / (1.0 - f)
        raw = young_interval(cost, effective)
        interval = min(self.max_s, max(self.min_s, raw, 2.0 * self.upload_s))
        why = (
            f"every {interval:.1f}s: sqrt(2 x {cost * 1000:.0f} ms checkpoint cost x {effective:.0f}s between "
            f"interruptions that lose work) = {raw:.1f}s (Young/Daly); MTBF {mtbf:.0f}s "
            f"(prior {self.mtbf_prior_s:.0f}s, {self.history.interruptions} interruption(s) in "
            f"{self.history.exposure_s:.0f}s); {f:.0%} with notice"
        )
        if f > 0:
            why += " (a notice saves before the machine goes, so the interval matters less)"
        if interval != raw:
            why += f"; clamped to [{max(self.min_s, 2.0 * self.upload_s):.1f}s, {self.max_s:.0f}s]"
        return interval, why
