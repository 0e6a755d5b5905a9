"""Spot / on-demand policies: at each tick, run on spot, run on demand, or wait.

A policy is a pure function of one `Observation` (no hidden state, no I/O), so the simulator and the
local supervisor drive the same objects the same way:

    policy = make_policy("deadline")
    while not done:
        decision = policy.decide(Observation(now_s=..., start_s=..., deadline_s=..., ...))
        # decision.mode is Mode.SPOT, Mode.ON_DEMAND or Mode.NONE (hold no instance, wait)

Hysteresis lives in the rule itself and reads `Observation.mode` (what is running now), so a policy
never needs to remember anything between calls. See docs/policies.md for the rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from trainer.config import ResourcesSpec
from trainer.stops import spot_return as rule
from trainer.stops.spot_return import Landing, Progress

POLICY_NAMES = ("spot-only", "spot-fallback", "deadline", "on-demand")
#: policies the simulator also knows, for comparison only (not valid in a job file): Uniform Progress,
#: and `no-observer`, what a `deadline` job does with nobody watching (SkyPilot and the trainer alone)
BASELINE_NAMES = ("uniform-progress", "no-observer")


class Mode(str, Enum):
    """What the job runs on during the next tick."""

    NONE = "none"  # no instance: waiting (for spot capacity, or because there is slack)
    SPOT = "spot"
    ON_DEMAND = "on-demand"


@dataclass(slots=True, kw_only=True)
class Observation(Progress):
    """Everything a policy may look at: where the job stands (`Progress`, the facts the shared
    return-to-spot rule reads: times, work, restart overhead, tick, unsaved work, preemptions) and what
    only an outside observer sees. Times are seconds on one clock (epoch or simulation time)."""

    #: can spot capacity be had right now (in any zone the job may use)
    spot_available: bool
    #: what the job runs on now; Mode.NONE after a preemption
    mode: Mode
    #: where each start landed, and which were the trainer's probes back to spot (the run store's record;
    #: only `no-observer` reads it)
    landings: tuple[Landing, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    mode: Mode
    reason: str
    #: a probe back to spot by the trainer (checkpoint, exit 75): a restart even if it lands on the
    #: same mode; the run store records it
    probe: bool = False
    #: unbilled seconds before the new instance starts (SkyPilot trying the spot offers first)
    delay_s: float = 0.0


class Policy(Protocol):
    name: str

    def decide(self, obs: Observation) -> Decision: ...


_SPOT = Decision(Mode.SPOT, "spot capacity is available")
_WAIT = Decision(Mode.NONE, "no spot capacity: waiting")
_OD = Decision(Mode.ON_DEMAND, "on demand")


class OnDemandPolicy:
    """Baseline: on demand all the time."""

    name = "on-demand"

    def decide(self, obs: Observation) -> Decision:
        return _OD


class SpotOnlyPolicy:
    """Spot whenever there is capacity, otherwise wait. Never pays on-demand prices; may miss deadlines."""

    name = "spot-only"

    def decide(self, obs: Observation) -> Decision:
        return _SPOT if obs.spot_available else _WAIT


_FALLBACK_STAY = Decision(Mode.ON_DEMAND, "fell back to on demand: staying there")
_FALLBACK_GO = Decision(Mode.ON_DEMAND, "no spot capacity: falling back to on demand")


class SpotFallbackPolicy:
    """Spot until the first time it is unavailable, then on demand for good."""

    name = "spot-fallback"

    def decide(self, obs: Observation) -> Decision:
        if obs.mode is Mode.ON_DEMAND:
            return _FALLBACK_STAY
        return _SPOT if obs.spot_available else _FALLBACK_GO


_D_SAFETY = Decision(Mode.ON_DEMAND, "safety net: on demand now or the deadline slips")
_D_BEHIND = Decision(Mode.ON_DEMAND, "no spot capacity and behind uniform progress: on demand")
_D_HOLD = Decision(Mode.ON_DEMAND, "on demand until ahead of uniform progress (by the margin, if any)")
_D_BACK = Decision(Mode.SPOT, "ahead of uniform progress (by the margin, if any): back to spot")
_D_SPOT = Decision(Mode.SPOT, "spot capacity is available")
_D_WAIT = Decision(Mode.NONE, "no spot capacity, on or ahead of uniform progress: waiting")


def _safety_net(obs: Observation) -> bool:
    """True when waiting one more tick, losing the unsaved work and paying one restart would leave too
    little time to finish on demand."""
    return rule.too_late(obs)


def _line(obs: Observation, at_s: float) -> float:
    """The uniform-progress line: work that should be done at time `at_s`."""
    return rule.uniform_line(obs, at_s)


@dataclass(frozen=True)
class UniformProgressPolicy:
    """Uniform Progress of "Can't Be Late" (Wu et al., NSDI '24), kept as the baseline `deadline` must beat.

    Safety net (the same as `deadline`'s, so both carry the same guarantee), then: spot whenever there
    is capacity; without it, on demand when progress is behind the line W * elapsed / window, else wait.
    Hysteresis as in the paper's simulator: a job on demand returns to spot only once its progress is
    ahead of where the line will be `hysteresis_restarts` restart overheads from now (2d in the paper).
    Not a job-file policy: `ftorch simulate` and bench/ compare against it.
    """

    hysteresis_restarts: float = 2.0
    name: str = "uniform-progress"

    def decide(self, obs: Observation) -> Decision:
        if obs.deadline_s is None:
            return _SPOT if obs.spot_available else _WAIT
        if _safety_net(obs):
            return _D_SAFETY
        if obs.mode is Mode.ON_DEMAND:
            ahead = _line(obs, obs.now_s + self.hysteresis_restarts * obs.restart_overhead_s)
            if obs.spot_available and obs.work_done_s >= ahead:
                return _D_BACK
            return _D_HOLD
        if obs.spot_available:
            return _D_SPOT
        return _D_BEHIND if obs.work_done_s < _line(obs, obs.now_s) else _D_WAIT


@dataclass(frozen=True)
class DeadlinePolicy:
    """Uniform progress with a safety net and hysteresis (after "Can't Be Late", NSDI '24).

    1. Safety net: if waiting one more tick, losing the unsaved work and paying one restart would leave
       too little time to finish on demand, run on demand.
    2. Spot whenever there is capacity, except that a job on demand goes back to spot only once its
       progress is ahead of the uniform-progress line by `hysteresis_s` and the remaining work is worth
       a restart (at least `min_spot_work_s`).
    3. No spot capacity: run on demand if behind the line work_total * elapsed / (deadline - start) by
       more than `lag` (a share of the slack, the time the window has beyond the work), else wait.
       A job on demand stays on demand while spot is unavailable.

    The margin grows with each preemption, margin = hysteresis_s * (1 + backoff * preemptions), so spot
    capacity that keeps vanishing is chased less and less. `hysteresis_s` defaults to
    `hysteresis_restarts` restart overheads plus `hysteresis_ticks` ticks, `min_spot_work_s` to 2 restart
    overheads. The defaults were tuned on the first half of the shared traces (bench/tune_deadline.py).
    With no deadline it behaves like spot-only.
    """

    hysteresis_s: float | None = None
    min_spot_work_s: float | None = None
    backoff: float = rule.BACKOFF
    lag: float = 0.0
    hysteresis_restarts: float = rule.HYSTERESIS_RESTARTS
    hysteresis_ticks: float = rule.HYSTERESIS_TICKS
    name: str = "deadline"

    def margin_s(self, obs: Observation) -> float:
        return self._margin(obs)

    def _margin(self, p: Progress) -> float:
        return rule.margin_s(
            p, self.hysteresis_s, self.hysteresis_restarts, self.hysteresis_ticks, self.backoff
        )

    def back_to_spot(self, p: Progress, restarts: float = 1.0) -> bool:
        """The return rule, shared with the trainer (trainer/stops/spot_return.py)."""
        return rule.return_to_spot(p, self._margin(p), self.min_spot_work_s, restarts)

    def decide(self, obs: Observation) -> Decision:
        if obs.deadline_s is None:
            return _SPOT if obs.spot_available else _WAIT
        if _safety_net(obs):
            return _D_SAFETY
        if obs.mode is Mode.ON_DEMAND:
            return _D_BACK if obs.spot_available and self.back_to_spot(obs) else _D_HOLD
        if obs.spot_available:
            return _D_SPOT
        lead = obs.work_done_s - _line(obs, obs.now_s)
        slack = (obs.deadline_s - obs.start_s) - obs.work_total_s
        return _D_BEHIND if lead < -self.lag * max(slack, 0.0) else _D_WAIT


_N_SPOT = Decision(Mode.SPOT, "SkyPilot: the first spot offer with capacity")
_N_FALLBACK = "SkyPilot: no spot offer launches, the on-demand offers after them in `ordered`"
_N_STAY_SPOT = Decision(Mode.SPOT, "on spot: nobody watches the deadline (no safety net) until preempted")
_N_STAY_OD = Decision(Mode.ON_DEMAND, "on demand: not ahead enough to probe, or a probe too recent")


@dataclass(frozen=True)
class NoObserverPolicy:
    """What a `deadline` job does with no outside controller: SkyPilot and the trainer alone.

    - No instance (launch, or a preemption): SkyPilot walks `ordered` from the top: spot where there is
      capacity, else (after `failover_s` of failed spot launches, unbilled) the on-demand offers. It never
      waits for spot.
    - On spot: stays there until preempted. Nobody sees the deadline coming (no safety-net switch).
    - On demand: the trainer cannot see spot capacity. When the shared return rule says it is ahead
      enough (with room for two restarts: the probe, and a fall back), and no probe is too recent
      (trainer/stops/spot_return.py next_probe_at: one an hour, doubling after each probe that landed on
      demand), it checkpoints and exits 75: a probe, one restart, that lands on spot if SkyPilot finds
      capacity, else on demand again. `spot_available` is read only for where the probe lands.
    Not a job-file policy: `ftorch simulate` compares it with `deadline`, to show what the controller is
    worth.
    """

    failover_s: float = 120.0
    #: the return rule and its margins: the `deadline` policy's own
    returns: DeadlinePolicy = DeadlinePolicy()
    probe_base_s: float = rule.PROBE_BASE_S
    probe_factor: float = rule.PROBE_FACTOR
    probe_cap_s: float = rule.PROBE_CAP_S
    name: str = "no-observer"

    def _walk(self, obs: Observation, reason: str | None = None, probe: bool = False) -> Decision:
        """Where SkyPilot's recovery lands when it walks `ordered` from the spot end."""
        if obs.spot_available:
            return Decision(Mode.SPOT, reason or _N_SPOT.reason, probe=probe)
        return Decision(Mode.ON_DEMAND, reason or _N_FALLBACK, probe=probe, delay_s=self.failover_s)

    def decide(self, obs: Observation) -> Decision:
        if obs.mode is Mode.NONE:
            return self._walk(obs)
        if obs.mode is Mode.SPOT:
            return _N_STAY_SPOT
        due = rule.next_probe_at(obs.landings, self.probe_base_s, self.probe_factor, self.probe_cap_s)
        if obs.now_s >= due and self.returns.back_to_spot(obs, restarts=2.0):
            return self._walk(obs, "ahead enough: the trainer probes for spot (checkpoint, exit 75)", True)
        return _N_STAY_OD


def make_policy(name: str, baselines: bool = False) -> Policy:
    """A policy by its job-file name (resources.policy); with `baselines`, also the comparison ones."""
    policies: dict[str, Policy] = {
        "spot-only": SpotOnlyPolicy(),
        "spot-fallback": SpotFallbackPolicy(),
        "deadline": DeadlinePolicy(),
        "on-demand": OnDemandPolicy(),
    }
    if baselines:
        policies["uniform-progress"] = UniformProgressPolicy()
        policies["no-observer"] = NoObserverPolicy()
    if name not in policies:
        raise ValueError(f"unknown policy {name!r}; valid: {', '.join(policies)}")
    return policies[name]


def spot_return_env(resources: ResourcesSpec, restart_overhead_s: float | None) -> dict[str, str]:
    """The task env that lets the trainer probe back to spot by itself (trainer/stops/spot_probe.py): set
    for `deadline` jobs only, with the chosen offer's restart overhead."""
    if not rule.probes_apply(resources):
        return {}
    overhead = 300.0 if restart_overhead_s is None else float(restart_overhead_s)
    return {"FTORCH_SPOT_RETURN": json.dumps({"restart_overhead_s": round(overhead, 1)})}


def policy_name_for(resources: ResourcesSpec) -> str:
    """The policy a job asks for: resources.policy, else derived from deadline / spot / fallback."""
    return rule.policy_name_for(resources)
