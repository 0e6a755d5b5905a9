"""Replay spot availability traces through a policy: cost, finish time, deadline, preemptions, waste.

The model, tick by tick (one tick = the trace's gap_seconds):
- at the start of each tick, a job on spot whose zone went down is preempted: the work since its last
  checkpoint is lost and the instance is gone (mode NONE);
- the policy then decides SPOT, ON_DEMAND or NONE from an `Observation`; spot is available when any zone
  is up, and a new spot instance goes to the first zone that is up (a job on spot stays in its zone);
- every start of an instance (first start, a switch between spot and on demand, a move to another zone
  after a preemption) pays the restart overhead: billed time with no progress;
- a voluntary stop or switch checkpoints first (nothing is lost); checkpoints are free and happen every
  `checkpoint_interval_s` of progress;
- billing is per second, on spot or on demand, for every second an instance runs (overhead included);
- after the end of the trace spot is unavailable;
- a decision may carry an unbilled delay before the new instance starts (`no-observer`: SkyPilot trying
  the spot offers before the on-demand ones) and may be a probe (`no-observer`: the trainer leaves on
  demand to look for spot): a restart even when it lands on on demand again, recorded with where it landed.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.errors import SpecError, UserError
from orchestrator.spot.policy import Decision, Mode, Observation, Policy
from orchestrator.spot.traces import Zones
from trainer.stops.spot_return import Landing


@dataclass(frozen=True)
class JobNumbers:
    """The few numbers the simulator needs about a job (from the planner, or given by hand)."""

    work_s: float
    spot_hourly_usd: float
    ondemand_hourly_usd: float
    checkpoint_interval_s: float
    restart_overhead_s: float
    #: seconds from launch; None = no deadline
    deadline_s: float | None = None

    def ondemand_only_s(self) -> float:
        """Time on demand alone needs: one start, then the work."""
        return self.restart_overhead_s + self.work_s

    def ondemand_only_usd(self) -> float:
        return self.ondemand_only_s() * self.ondemand_hourly_usd / 3600.0


@dataclass
class Result:
    policy: str
    start_tick: int
    finished: bool
    #: seconds from launch to the end of training; None if it did not finish within the trace
    finish_s: float | None
    deadline_s: float | None
    deadline_met: bool | None
    cost_usd: float
    #: cost / the cost of on demand alone (one start + the work)
    cost_vs_ondemand: float
    spot_s: float
    ondemand_s: float
    wait_s: float
    #: billed seconds spent starting instances (no progress)
    overhead_s: float
    work_done_s: float
    work_lost_s: float
    preemptions: int
    starts: int
    zone_moves: int
    #: probes back to spot (no-observer), and how many of them landed on demand again
    probes: int = 0
    probes_failed: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class _Run:
    """One simulated job as it goes, tick by tick: where it runs, its progress, and the tallies."""

    job: JobNumbers
    gap: float
    mode: Mode = Mode.NONE
    zone: int = -1
    last_zone: int = -1
    done: float = 0.0
    unsaved: float = 0.0
    overhead_left: float = 0.0
    delay_left: float = 0.0
    spot_s: float = 0.0
    od_s: float = 0.0
    wait_s: float = 0.0
    paid_overhead: float = 0.0
    lost: float = 0.0
    preemptions: int = 0
    starts: int = 0
    moves: int = 0
    finish: float | None = None
    landings: tuple[Landing, ...] = ()

    def preempt(self) -> None:
        """Spot was taken away: the work since the last checkpoint is lost, and the instance."""
        self.preemptions += 1
        self.done -= self.unsaved
        self.lost += self.unsaved
        self.unsaved = self.overhead_left = self.delay_left = 0.0
        self.mode = Mode.NONE

    def switch(self, want: Mode, first_zone: int, delay_s: float = 0.0) -> None:
        """Go to `want` (checkpointing first); a new instance pays the restart overhead (after `delay_s`
        unbilled), and a new spot instance goes to `first_zone`, the first zone that is up."""
        self.unsaved = 0.0  # a voluntary stop or switch checkpoints first
        if want is not Mode.NONE:
            self.starts += 1
            self.overhead_left = self.job.restart_overhead_s
            self.delay_left = delay_s
        if want is Mode.SPOT:
            if self.last_zone >= 0 and first_zone != self.last_zone:
                self.moves += 1
            self.zone = self.last_zone = first_zone
        self.mode = want

    def advance(self, now: float) -> None:
        """One tick from `now` in the current mode: waiting, or overhead then progress (billed)."""
        gap = self.gap
        if self.mode is Mode.NONE:
            self.wait_s += gap
            return
        delay = 0.0
        if self.delay_left > 0.0:  # no instance yet: unbilled
            delay = self.delay_left if self.delay_left < gap else gap
            self.delay_left -= delay
            self.wait_s += delay
            gap -= delay
        ov = self.overhead_left if self.overhead_left < gap else gap
        self.overhead_left -= ov
        progress = gap - ov
        work, interval = self.job.work_s, self.job.checkpoint_interval_s
        if self.done + progress >= work:
            used = ov + (work - self.done)
            self.finish = now + delay + used
            billed, self.done = used, work
        else:
            billed = gap
            self.done += progress
            self.unsaved += progress
            if interval > 0.0 and self.unsaved >= interval:
                self.unsaved %= interval
            elif interval <= 0.0:
                self.unsaved = 0.0
        self.paid_overhead += ov
        if self.mode is Mode.SPOT:
            self.spot_s += billed
        else:
            self.od_s += billed

    def result(self, policy: str, start_tick: int) -> Result:
        job, finish = self.job, self.finish
        cost = self.spot_s * (job.spot_hourly_usd / 3600.0) + self.od_s * (job.ondemand_hourly_usd / 3600.0)
        baseline = job.ondemand_only_usd()
        deadline = job.deadline_s
        met = None if deadline is None else (finish is not None and finish <= deadline + 1e-6)
        return Result(
            policy=policy,
            start_tick=start_tick,
            finished=finish is not None,
            finish_s=finish,
            deadline_s=deadline,
            deadline_met=met,
            cost_usd=cost,
            cost_vs_ondemand=cost / baseline if baseline > 0 else math.nan,
            spot_s=self.spot_s,
            ondemand_s=self.od_s,
            wait_s=self.wait_s,
            overhead_s=self.paid_overhead,
            work_done_s=self.done,
            work_lost_s=self.lost,
            preemptions=self.preemptions,
            starts=self.starts,
            zone_moves=self.moves,
            probes=sum(x.probe for x in self.landings),
            probes_failed=sum(x.probe and x.landed == Mode.ON_DEMAND.value for x in self.landings),
        )

    def follow(self, decision: Decision, now: float, first_zone: int) -> None:
        """Act on one decision: a new instance records where it landed; a probe always restarts."""
        want = decision.mode
        if want is Mode.SPOT and first_zone < 0:
            want = Mode.NONE
        if decision.probe or want is not self.mode:
            self.switch(want, first_zone, decision.delay_s)
            if want is not Mode.NONE:
                self.landings = (*self.landings, Landing(now, self.starts, want.value, decision.probe))


def simulate(
    policy: Policy,
    job: JobNumbers,
    zones: Zones,
    start_tick: int = 0,
    max_ticks: int | None = None,
) -> Result:
    """Run one job from `start_tick` of the traces until it finishes or time runs out.

    Time runs out at the end of the trace plus what on demand alone would need (so a policy that falls
    back at the very end can still finish), or after `max_ticks` ticks.
    """
    up, first = zones.as_lists()
    n = len(first)
    gap = zones.gap_s
    limit = n + math.ceil(job.ondemand_only_s() / gap) + 2
    if max_ticks is not None:
        limit = min(limit, start_tick + max_ticks)
    run = _Run(job, gap)
    obs = Observation(
        now_s=0.0, start_s=0.0, deadline_s=job.deadline_s, work_done_s=0.0, work_total_s=job.work_s,
        restart_overhead_s=job.restart_overhead_s, tick_s=gap, spot_available=False, mode=Mode.NONE,
    )  # fmt: skip
    decide = policy.decide
    now = 0.0
    for tick in range(start_tick, limit):
        fz = first[tick] if tick < n else -1
        if run.mode is Mode.SPOT and (tick >= n or not up[run.zone][tick]):
            run.preempt()
        obs.now_s = now
        obs.work_done_s = run.done
        obs.spot_available = fz >= 0
        obs.mode = run.mode
        obs.unsaved_work_s = run.unsaved
        obs.preemptions = run.preemptions
        obs.landings = run.landings
        run.follow(decide(obs), now, fz)
        run.advance(now)
        if run.finish is not None:
            break
        now += gap
    return run.result(policy.name, start_tick)


@dataclass
class Summary:
    """One policy over many start offsets."""

    policy: str
    runs: int
    met_share: float | None
    finished_share: float
    mean_cost_vs_ondemand: float
    median_cost_vs_ondemand: float
    max_cost_vs_ondemand: float
    mean_finish_h: float | None
    mean_preemptions: float
    mean_wait_h: float
    mean_work_lost_h: float
    mean_probes: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def start_ticks(zones: Zones, count: int, tail_s: float) -> list[int]:
    """`count` evenly spread start ticks that leave at least `tail_s` of trace after each start."""
    last = zones.n_ticks - math.ceil(tail_s / zones.gap_s)
    if last < 0:
        return [0]
    if count <= 1:
        return [0]
    return sorted({round(i * last / (count - 1)) for i in range(count)})


def summarize(results: list[Result]) -> Summary:
    ratios = sorted(r.cost_vs_ondemand for r in results)
    finished = [r for r in results if r.finished]
    met = [r.deadline_met for r in results if r.deadline_met is not None]
    n = len(results)
    return Summary(
        policy=results[0].policy,
        runs=n,
        met_share=(sum(met) / len(met)) if met else None,
        finished_share=len(finished) / n,
        mean_cost_vs_ondemand=sum(ratios) / n,
        median_cost_vs_ondemand=ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2,
        max_cost_vs_ondemand=ratios[-1],
        mean_finish_h=(sum(r.finish_s or 0.0 for r in finished) / len(finished) / 3600.0)
        if finished
        else None,
        mean_preemptions=sum(r.preemptions for r in results) / n,
        mean_wait_h=sum(r.wait_s for r in results) / n / 3600.0,
        mean_work_lost_h=sum(r.work_lost_s for r in results) / n / 3600.0,
        mean_probes=sum(r.probes for r in results) / n,
    )


def sweep(policies: list[Policy], job: JobNumbers, zones: Zones, starts: list[int]) -> list[Summary]:
    """Each policy from each start tick, summarized per policy."""
    return [summarize([simulate(p, job, zones, s) for s in starts]) for p in policies]


# ---- a job's numbers from the planner, and one `ftorch simulate` run ------------------------------------
#: JobNumbers inputs: (attribute of the planner's chosen Candidate, the option that overrides it)
PLAN_FIELDS = {
    "hours": ("est_hours", "--hours"),
    "spot_price": ("spot_hourly_usd", "--spot-price"),
    "ondemand_price": ("ondemand_hourly_usd", "--ondemand-price"),
    "checkpoint_interval_s": ("checkpoint_interval_s", "--checkpoint-interval"),
    "restart_overhead_s": ("restart_overhead_s", "--restart-overhead"),
}
_NUMBER_OPTIONS = tuple(option for _, option in PLAN_FIELDS.values())


def _from_planner(spec: Any) -> tuple[dict[str, float | None], str]:
    """The chosen offer's numbers, and a one-line description of it."""
    try:
        from orchestrator.sizing.planner import make_plan
    except ImportError:
        raise UserError(
            "the planner is not available in this build; give " + ", ".join(_NUMBER_OPTIONS)
        ) from None
    plan = make_plan(spec, offline=True)
    chosen = getattr(plan, "chosen", None)
    if chosen is None:
        raise UserError("the planner found no offer for this job; give " + ", ".join(_NUMBER_OPTIONS))
    where = " ".join(
        str(getattr(chosen, k)) for k in ("cloud", "instance_type", "accelerator") if getattr(chosen, k, None)
    )
    count = getattr(chosen, "count", None)
    offer = f"{where}{f' x{count}' if count else ''}"
    numbers: dict[str, float | None] = {}
    for key, (attr, _option) in PLAN_FIELDS.items():
        value = getattr(chosen, attr, None)
        numbers[key] = None if value is None else float(value)
    return numbers, offer


def job_numbers(
    spec: Any, given: dict[str, float | None], deadline: str | None
) -> tuple[JobNumbers, dict[str, str]]:
    """JobNumbers from the given values (keys of PLAN_FIELDS), the planner filling what is not given;
    and where each came from. `deadline` overrides resources.deadline."""
    from trainer.config import deadline_seconds

    sources = {k: "given" for k, v in given.items() if v is not None}
    values = dict(given)
    if any(v is None for v in values.values()):
        planned, offer = _from_planner(spec)
        for key, value in values.items():
            if value is None:
                if planned.get(key) is None:
                    option = PLAN_FIELDS[key][1]
                    raise UserError(f"the planner's offer ({offer}) has no value for {option}; give {option}")
                values[key] = planned[key]
                sources[key] = f"planner ({offer})"
    field = "--deadline" if deadline is not None else "resources.deadline"
    text = deadline if deadline is not None else spec.resources.deadline
    deadline_s = None
    if text is not None:
        try:
            deadline_s = deadline_seconds(str(text))
        except ValueError as exc:
            raise SpecError(field, str(exc)) from None
    job = JobNumbers(
        work_s=float(values["hours"] or 0.0) * 3600.0,
        spot_hourly_usd=float(values["spot_price"] or 0.0),
        ondemand_hourly_usd=float(values["ondemand_price"] or 0.0),
        checkpoint_interval_s=float(values["checkpoint_interval_s"] or 0.0),
        restart_overhead_s=float(values["restart_overhead_s"] or 0.0),
        deadline_s=deadline_s,
    )
    if job.work_s <= 0:
        raise SpecError("--hours", "the job's compute time must be > 0")
    return job, sources


def run(
    policies: list[Policy], job: JobNumbers, zones: Zones, start_tick: int, windows: int
) -> dict[str, Any]:
    """What `ftorch simulate` reports: the job, the traces, and per policy one result (one start) or a
    summary over `windows` start offsets spread over the traces."""
    began = time.perf_counter()
    payload: dict[str, Any] = {
        "job": dict(job.__dict__),
        "traces": {
            "zones": zones.names,
            "gap_s": zones.gap_s,
            "ticks": zones.n_ticks,
            "available_share": float(zones.any_up.mean()),
            "start_h": start_tick * zones.gap_s / 3600.0,
            "note": "traces are used as the spot availability signal for the job's instance type",
        },
    }
    if windows > 1:
        tail = (job.deadline_s or 0.0) + job.ondemand_only_s()
        starts = start_ticks(zones, windows, tail)
        payload["windows"] = len(starts)
        payload["summaries"] = [s.as_dict() for s in sweep(policies, job, zones, starts)]
    else:
        payload["results"] = [simulate(p, job, zones, start_tick).as_dict() for p in policies]
    payload["elapsed_s"] = time.perf_counter() - began
    return payload
