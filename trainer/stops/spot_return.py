"""Going back from on demand to spot: the one rule, shared by the trainer and orchestrator.spot.policy.

The `deadline` policy runs on demand only while it must; it goes back to spot once the job is ahead of
the uniform-progress line (work_total x elapsed / window) by a margin and the work left is worth a
restart (`return_to_spot`). With an outside observer (the local supervisor, `ftorch`'s controller) that
rule is asked only while spot capacity exists. Without one (a SkyPilot job with the laptop closed), the
trainer asks it itself on its on-demand node, where spot capacity cannot be seen: going back is a probe
(checkpoint, exit 75, SkyPilot re-walks `ordered` from the spot end) that costs a restart and may land on
on demand again. So probes are bounded (`next_probe_at`): at most one per `PROBE_BASE_S`, and the wait
doubles after each probe that landed on on demand.

No torch, no third-party imports: the trainer and the orchestrator both import this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: DeadlinePolicy's defaults (tuned on the first half of the shared traces, bench/tune_deadline.py):
#: margin = (HYSTERESIS_RESTARTS x restart + HYSTERESIS_TICKS x tick) x (1 + BACKOFF x preemptions)
HYSTERESIS_RESTARTS = 0.0
HYSTERESIS_TICKS = 0.0
BACKOFF = 0.0
#: the work left must be at least this many restart overheads to be worth going back to spot
MIN_SPOT_WORK_RESTARTS = 2.0

#: probes without an observer: the first wait, its growth after each probe that landed on demand, its cap
PROBE_BASE_S = 3600.0
PROBE_FACTOR = 2.0
PROBE_CAP_S = 8 * 3600.0
#: how a probe landed
SPOT, ON_DEMAND = "spot", "on-demand"


@dataclass(slots=True)
class Progress:
    """Where a job stands: the facts the return-to-spot rule reads. Seconds on one clock; work in compute
    seconds on the job's instance. The orchestrator's policy `Observation` extends it (one type, one
    set of names); the trainer's probe builds it directly."""

    now_s: float
    start_s: float
    deadline_s: float | None
    work_done_s: float
    work_total_s: float
    restart_overhead_s: float
    #: seconds until the rule is asked again
    tick_s: float = 0.0
    #: work since the last checkpoint (lost if the instance goes before the next one)
    unsaved_work_s: float = 0.0
    preemptions: int = 0


def uniform_line(p: Progress, at_s: float) -> float:
    """The uniform-progress line: work that should be done at `at_s`."""
    assert p.deadline_s is not None
    window = p.deadline_s - p.start_s
    return p.work_total_s * (at_s - p.start_s) / window if window > 0 else p.work_total_s


def too_late(p: Progress, restarts: float = 1.0) -> bool:
    """The safety net: waiting one more tick, losing the unsaved work and paying `restarts` restarts
    would leave too little time to finish on demand."""
    remaining = max(p.work_total_s - p.work_done_s, 0.0)
    time_left = p.deadline_s - p.now_s if p.deadline_s is not None else math.inf
    return time_left - p.tick_s - remaining - p.unsaved_work_s - restarts * p.restart_overhead_s < 1e-6


def margin_s(
    p: Progress,
    hysteresis_s: float | None = None,
    hysteresis_restarts: float = HYSTERESIS_RESTARTS,
    hysteresis_ticks: float = HYSTERESIS_TICKS,
    backoff: float = BACKOFF,
) -> float:
    """How far ahead of the line a job on demand must be to go back to spot."""
    base = hysteresis_s
    if base is None:
        base = hysteresis_restarts * p.restart_overhead_s + hysteresis_ticks * p.tick_s
    return base * (1.0 + backoff * p.preemptions)


def return_to_spot(
    p: Progress, margin: float, min_spot_work_s: float | None = None, restarts: float = 1.0
) -> bool:
    """The rule: a job on demand goes back to spot when the deadline still leaves room for `restarts`
    restarts (1 with an observer that sees spot; 2 for a blind probe that may land on demand again),
    it is ahead of the uniform-progress line by `margin`, and the work left is worth a restart.
    With no deadline, spot is always preferred."""
    if p.deadline_s is None:
        return True
    if too_late(p, restarts):
        return False
    lead = p.work_done_s - uniform_line(p, p.now_s)
    remaining = p.work_total_s - p.work_done_s
    min_work = (
        min_spot_work_s if min_spot_work_s is not None else MIN_SPOT_WORK_RESTARTS * p.restart_overhead_s
    )
    return lead >= margin and remaining >= min_work


@dataclass(frozen=True, slots=True)
class Landing:
    """Where one attempt landed (spot or on demand), when, and whether it was a probe: an attempt that
    left on demand on purpose to look for spot. `landed` is None while the probe is under way (the
    probing attempt writes it; the next attempt fills in where it landed)."""

    at_s: float
    attempt: int
    landed: str | None
    probe: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"at": self.at_s, "attempt": self.attempt, "landed": self.landed, "probe": self.probe}

    @classmethod
    def from_json(cls, data: Any) -> Landing | None:
        if not isinstance(data, dict):
            return None
        try:
            landed = data.get("landed")
            landed = landed if landed in (SPOT, ON_DEMAND) else None
            return cls(float(data["at"]), int(data["attempt"]), landed, bool(data.get("probe", False)))
        except (KeyError, TypeError, ValueError):
            return None


def on_demand_in_a_row(landings: Sequence[Landing]) -> int:
    """Landings at the end of the list on demand (a fall back, or a probe that found no spot)."""
    count = 0
    for landing in reversed(landings):
        if landing.landed != ON_DEMAND:
            break
        count += 1
    return count


def next_probe_at(
    landings: Sequence[Landing],
    base_s: float = PROBE_BASE_S,
    factor: float = PROBE_FACTOR,
    cap_s: float = PROBE_CAP_S,
) -> float:
    """The earliest time of the next probe. After k landings on demand in a row (the fall back, then
    each probe that found no spot): `base_s` x `factor`^(k-1) (at most `cap_s`) after the last one.
    With no landing on demand on record: now (-inf)."""
    k = on_demand_in_a_row(landings)
    if k == 0:
        return -math.inf
    return landings[-1].at_s + min(base_s * factor ** (k - 1), cap_s)


def probes_apply(resources: Any) -> bool:
    """Whether a job goes back to spot by itself: spot, the `deadline` policy and a deadline. A
    `spot-fallback` job stays on demand for good; `spot-only` never leaves spot."""
    return (
        bool(resources.spot) and resources.deadline is not None and policy_name_for(resources) == "deadline"
    )


def policy_name_for(resources: Any) -> str:
    """The policy a job asks for: resources.policy, else derived from deadline / spot / fallback."""
    if resources.policy is not None:
        return str(resources.policy)
    if not resources.spot:
        return "on-demand"
    if resources.deadline is not None:
        return "deadline"
    return "spot-fallback" if resources.fallback == "on-demand" else "spot-only"
