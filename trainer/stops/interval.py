"""One checkpoint-cost and interval model: the planner prices it (orchestrator/sizing/planner.py), the trainer
runs it for `checkpoint.every: auto` (trainer/checkpoints/checkpointer.py), the budget guard expects it
(trainer/stops/budget.py). No torch here.

What one checkpoint costs (`CheckpointCost`), two terms that enter differently:

- `blocking_s`, the time training stops for it. The trainer saves asynchronously (trainer/checkpoints/async_save.py,
  trainer/checkpoints/sharded.py): it blocks only while the state is copied into host memory (the whole
  write with FTORCH_ASYNC_CHECKPOINT=0). This is what a checkpoint takes from the training, so it is
  Young's C below and the planner's overhead per checkpoint (C / interval).
- `upload_s`, the write to the run store, in a background thread. It takes no training time, but at most
  one upload is in flight (a save due during one is skipped), so the interval is never shorter than
  UPLOADS_PER_INTERVAL uploads; and a checkpoint counts only once committed, so an interruption without
  notice loses interval / 2 + upload_s of work on average (`lost_s`, the planner's lost work).

Before anything is measured the cost is estimated from the checkpoint's bytes (trainer/memory/facts.py's
`checkpoint_bytes`, the memory model's optimizer rules): blocking at SNAPSHOT_GBPS, upload at
CHECKPOINT_GBPS. The trainer measures both as it runs.

The interval (`auto_interval`): Young (1974), sqrt(2 * C * M), the interval that minimises lost work plus
checkpoint overhead, M the mean time between interruptions that lose work; clamped to
[max(MIN_INTERVAL_S, 2 uploads), MAX_INTERVAL_S], the same clamps for planner, trainer and guard; when
2 uploads take longer than MAX_INTERVAL_S the floor wins (the interval is stretched: a save cannot come
while the previous one is still uploading, and one that never finishes protects nothing). In the
trainer (`AutoInterval`) both are re-estimated as the run goes:

- C: an exponential average of the measured blocking times of this attempt's checkpoints (FIRST_COST_S
  before the first: the first checkpoint comes early and measures it);
- M: a prior (the planner's interruption rate for the offer the job landed on, passed in the task;
  else FTORCH_AUTO_MTBF_S, default 1 h: trainer/stops/interruptions.py) updated with the run's own history:
  (prior + exposure) / (1 + interruptions so far), where a requested stop (cancel, budget) is not an
  interruption;
- a preemption with notice loses nothing (the trainer saves when told), so only interruptions without
  one count: M_eff = M / (1 - f), f the fraction of past interruptions that came with a notice
  (FTORCH_NOTICE_FRACTION before the run has a history).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from trainer.stops.interruptions import NOT_INTERRUPTIONS, prior_mtbf_s

#: the clamps of every checkpoint interval the model chooses (planner, trainer, budget guard)
MIN_INTERVAL_S = float(os.environ.get("FTORCH_AUTO_MIN_INTERVAL_S", "5"))
MAX_INTERVAL_S = float(os.environ.get("FTORCH_AUTO_MAX_INTERVAL_S", "1800"))
#: never checkpoint more often than this many uploads take (one upload in flight at a time)
UPLOADS_PER_INTERVAL = 2.0
#: assumed blocking cost before anything was measured: the first checkpoint comes early and measures it
FIRST_COST_S = 0.05
MAX_NOTICE_FRACTION = 0.95
#: what a save costs in transfer (the run store in another region or cloud), as seconds of the offer's
#: price: the planner sets it in the task (orchestrator/backends/skypilot_render.py), and Young's C is
#: the blocking time plus it, so a save that costs money comes less often (the planner's interval too)
SAVE_COST_ENV = "FTORCH_SAVE_COST_S"
#: the copy into host memory that training blocks for (docs/benchmarks.md: 36 MiB in 7 ms on a CPU;
#: device-to-host over PCIe is of the same order), and the upload to object storage, in GB/s
SNAPSHOT_GBPS = 5.0
CHECKPOINT_GBPS = 0.5


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young's optimum checkpoint interval, sqrt(2 * cost * MTBF): the one used by trainer and planner."""
    return math.sqrt(2.0 * max(cost_s, 0.0) * max(mtbf_s, 0.0))


@dataclass(frozen=True)
class CheckpointCost:
    """What one checkpoint costs: training blocked for `blocking_s`, the upload took `upload_s`."""

    blocking_s: float
    upload_s: float = 0.0

    @classmethod
    def of_bytes(cls, nbytes: float) -> CheckpointCost:
        """The estimate before anything is measured, for a checkpoint of `nbytes`."""
        return cls(nbytes / (SNAPSHOT_GBPS * 1e9), nbytes / (CHECKPOINT_GBPS * 1e9))

    def lost_s(self, interval_s: float) -> float:
        """Work an interruption without notice loses on average: half an interval, and the upload in
        flight (the newest checkpoint is not committed yet)."""
        return interval_s / 2.0 + self.upload_s


@dataclass(frozen=True)
class Interval:
    """A chosen interval and how: Young's raw value, the MTBF it used, the clamps it met."""

    seconds: float
    raw_s: float
    effective_mtbf_s: float  # between interruptions that lose work (those without a notice)
    floor_s: float
    ceiling_s: float

    @property
    def clamped(self) -> bool:
        return self.seconds != self.raw_s


def auto_interval(
    cost: CheckpointCost,
    mtbf_s: float,
    notice_fraction: float = 0.0,
    min_s: float | None = None,
    max_s: float | None = None,
) -> Interval:
    """The checkpoint interval for `cost` when interruptions come every `mtbf_s` on average, a fraction
    `notice_fraction` of them with a notice (which loses nothing): Young's, within the clamps."""
    f = min(MAX_NOTICE_FRACTION, max(0.0, notice_fraction))
    effective = mtbf_s / (1.0 - f)
    raw = young_interval(cost.blocking_s, effective)
    floor = max(MIN_INTERVAL_S if min_s is None else min_s, UPLOADS_PER_INTERVAL * cost.upload_s)
    ceiling = MAX_INTERVAL_S if max_s is None else max_s
    return Interval(max(floor, min(ceiling, raw)), raw, effective, floor, ceiling)


def fixed_interval_s(
    every_steps: int | None, every_seconds: float | None, step_s: float | None
) -> float | None:
    """Seconds between checkpoints for `checkpoint.every` N steps (at `step_s` per step) or D seconds;
    None for auto, or while the step time is unknown."""
    if every_steps is not None:
        return every_steps * step_s if step_s else None
    return every_seconds or None


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
    #: a save's transfer dollars as seconds of the offer's price (SAVE_COST_ENV; 0: free to save)
    save_cost_s: float = field(default_factory=lambda: _env_seconds(SAVE_COST_ENV))

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

    def cost(self) -> CheckpointCost:
        return CheckpointCost(self.cost_s if self.cost_s is not None else FIRST_COST_S, self.upload_s)

    def choose(self) -> tuple[float, str]:
        cost = self.cost()
        priced = CheckpointCost(cost.blocking_s + self.save_cost_s, cost.upload_s)
        chosen = auto_interval(priced, self.mtbf_s(), self.notice_fraction(), self.min_s, self.max_s)
        f = self.notice_fraction()
        interval, raw = chosen.seconds, chosen.raw_s
        why = (
            f"every {interval:.1f}s: sqrt(2 x {cost.blocking_s * 1000:.0f} ms checkpoint cost x "
            f"{chosen.effective_mtbf_s:.0f}s between interruptions that lose work) = {raw:.1f}s (Young/Daly); "
            f"MTBF {self.mtbf_s():.0f}s (prior {self.mtbf_prior_s:.0f}s, {self.history.interruptions} "
            f"interruption(s) in {self.history.exposure_s:.0f}s); {f:.0%} with notice"
        )
        if f > 0:
            why += " (a notice saves before the machine goes, so the interval matters less)"
        if self.save_cost_s:
            why += f"; a save's transfer counts as {self.save_cost_s:.1f}s of the offer's price in the cost"
        if chosen.clamped:
            why += f"; clamped to [{chosen.floor_s:.1f}s, {chosen.ceiling_s:.0f}s]"
        return interval, why


def _env_seconds(name: str) -> float:
    try:
        return max(0.0, float(os.environ.get(name) or 0.0))
    except ValueError:
        return 0.0
