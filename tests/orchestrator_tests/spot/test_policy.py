"""Policy decisions: unit rules, and whole runs on hand-made traces."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from orchestrator.spot.policy import (
    POLICY_NAMES,
    DeadlinePolicy,
    Mode,
    Observation,
    UniformProgressPolicy,
    make_policy,
    policy_name_for,
)
from orchestrator.spot.simulator import JobNumbers, simulate
from orchestrator.spot.traces import from_arrays
from trainer.config import ResourcesSpec, deadline_seconds

H = 3600.0
GAP = 300.0


def obs(**kw: object) -> Observation:
    base: dict[str, object] = dict(
        now_s=0.0,
        start_s=0.0,
        deadline_s=12 * H,
        work_done_s=0.0,
        work_total_s=8 * H,
        restart_overhead_s=300.0,
        spot_available=True,
        mode=Mode.NONE,
        unsaved_work_s=0.0,
        tick_s=GAP,
    )
    base.update(kw)
    return Observation(**base)  # type: ignore[arg-type]


def job(
    hours: float = 8, deadline_h: float | None = 12, restart: float = 300.0, ckpt: float = 600.0
) -> JobNumbers:
    return JobNumbers(
        work_s=hours * H,
        spot_hourly_usd=1.0,
        ondemand_hourly_usd=3.0,
        checkpoint_interval_s=ckpt,
        restart_overhead_s=restart,
        deadline_s=None if deadline_h is None else deadline_h * H,
    )


def ticks(hours: float) -> int:
    return int(hours * H / GAP)


# --- single decisions -------------------------------------------------------------------------------


def test_simple_policies() -> None:
    assert make_policy("on-demand").decide(obs()).mode is Mode.ON_DEMAND
    assert make_policy("spot-only").decide(obs()).mode is Mode.SPOT
    assert make_policy("spot-only").decide(obs(spot_available=False)).mode is Mode.NONE
    fallback = make_policy("spot-fallback")
    assert fallback.decide(obs()).mode is Mode.SPOT
    assert fallback.decide(obs(spot_available=False)).mode is Mode.ON_DEMAND
    assert fallback.decide(obs(mode=Mode.ON_DEMAND)).mode is Mode.ON_DEMAND  # never back
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("yolo")


def test_deadline_waits_while_ahead_and_runs_on_demand_when_behind() -> None:
    p = DeadlinePolicy()
    assert p.decide(obs(spot_available=False)).mode is Mode.NONE  # on the line at launch
    # 3 h in, 1 h done: the line says 2 h -> behind
    assert p.decide(obs(spot_available=False, now_s=3 * H, work_done_s=1 * H)).mode is Mode.ON_DEMAND
    # 3 h in, 2.5 h done: ahead -> wait for spot
    assert p.decide(obs(spot_available=False, now_s=3 * H, work_done_s=2.5 * H)).mode is Mode.NONE
    assert p.decide(obs(now_s=3 * H, work_done_s=1 * H)).mode is Mode.SPOT


def test_deadline_safety_net() -> None:
    p = DeadlinePolicy()
    # 8 h of work, 8 h 10 min left: one more tick plus a restart would not fit
    late = obs(deadline_s=8 * H + 600, now_s=0.0)
    assert p.decide(late).mode is Mode.ON_DEMAND
    assert p.decide(obs(deadline_s=8 * H + 300 + GAP + 1)).mode is Mode.SPOT  # just fits
    # unsaved work counts: it would be lost by a preemption
    assert p.decide(obs(deadline_s=8 * H + 300 + GAP + 1, unsaved_work_s=60)).mode is Mode.ON_DEMAND


def test_deadline_hysteresis_on_demand_to_spot() -> None:
    p = DeadlinePolicy(hysteresis_restarts=2, hysteresis_ticks=2, backoff=1)  # the pre-tuning rule
    margin = 2 * 300 + 2 * GAP
    on_line = obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=4 * H)
    assert p.decide(on_line).mode is Mode.ON_DEMAND  # on the line, spot available: stay
    after_preemption = obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=4 * H + margin, preemptions=1)
    assert p.decide(after_preemption).mode is Mode.ON_DEMAND  # the margin doubled
    slightly = obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=4 * H + margin - 1)
    assert p.decide(slightly).mode is Mode.ON_DEMAND
    ahead = obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=4 * H + margin)
    assert p.decide(ahead).mode is Mode.SPOT
    assert p.decide(obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=7.5 * H)).mode is Mode.SPOT
    # too little work left to pay a restart for: finish on demand
    tail = obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=8 * H - 500)
    assert p.decide(tail).mode is Mode.ON_DEMAND
    # on demand and no spot: stay on demand, even far ahead
    assert p.decide(obs(mode=Mode.ON_DEMAND, spot_available=False, work_done_s=7 * H)).mode is Mode.ON_DEMAND
    # the tuned default: back to spot as soon as on or ahead of the line (hysteresis cost money)
    assert DeadlinePolicy().decide(on_line).mode is Mode.SPOT
    assert DeadlinePolicy().decide(obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=4 * H - 1)).mode is (
        Mode.ON_DEMAND
    )


def test_uniform_progress_rules() -> None:
    p = UniformProgressPolicy()
    assert p.decide(obs(spot_available=False)).mode is Mode.NONE  # on the line at launch
    assert p.decide(obs(spot_available=False, now_s=3 * H, work_done_s=1 * H)).mode is Mode.ON_DEMAND
    assert p.decide(obs(spot_available=False, now_s=3 * H, work_done_s=2.5 * H)).mode is Mode.NONE
    assert p.decide(obs(deadline_s=8 * H + 600)).mode is Mode.ON_DEMAND  # the same safety net
    # hysteresis: on demand until ahead of where the line is 2 restarts (600 s) from now (2/3 h per h)
    ahead_at = 4 * H + 600 * 8 / 12
    assert p.decide(obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=ahead_at - 1)).mode is Mode.ON_DEMAND
    assert p.decide(obs(mode=Mode.ON_DEMAND, now_s=6 * H, work_done_s=ahead_at)).mode is Mode.SPOT
    assert p.decide(obs(deadline_s=None, spot_available=False)).mode is Mode.NONE
    assert make_policy("uniform-progress", baselines=True).name == "uniform-progress"
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("uniform-progress")  # not a job-file policy


def test_deadline_without_deadline_is_spot_only() -> None:
    p = DeadlinePolicy()
    assert p.decide(obs(deadline_s=None, spot_available=False)).mode is Mode.NONE
    assert p.decide(obs(deadline_s=None)).mode is Mode.SPOT


def test_policy_name_for_resources() -> None:
    assert policy_name_for(ResourcesSpec(policy="spot-only", deadline="12h")) == "spot-only"
    assert policy_name_for(ResourcesSpec(deadline="12h")) == "deadline"
    assert policy_name_for(ResourcesSpec(spot=False, deadline="12h")) == "on-demand"
    assert policy_name_for(ResourcesSpec(fallback="on-demand")) == "spot-fallback"
    assert policy_name_for(ResourcesSpec()) == "spot-only"


def test_deadline_seconds() -> None:
    now = datetime(2026, 12, 1, 0, 0, tzinfo=timezone.utc)
    assert deadline_seconds("12h", now) == 12 * H
    assert deadline_seconds("2026-12-01T07:00+01:00", now) == 6 * H
    later = (now + timedelta(hours=3)).isoformat()
    assert deadline_seconds(later, now) == 3 * H
    for bad, msg in [
        ("2026-12-01T07:00", "time zone"),
        ("soon", "duration"),
        ("2020-01-01T00:00Z", "future"),
    ]:
        with pytest.raises(ValueError, match=msg):
            deadline_seconds(bad, now)


# --- whole runs on hand-made traces -----------------------------------------------------------------


def run(name: str, trace: list[int], j: JobNumbers):
    return simulate(make_policy(name), j, from_arrays([trace], GAP))


def test_always_available() -> None:
    j = job()
    for name in ("spot-only", "spot-fallback", "deadline"):
        r = run(name, [1] * ticks(20), j)
        assert r.finished and r.deadline_met
        assert r.ondemand_s == 0 and r.preemptions == 0 and r.starts == 1 and r.wait_s == 0
        assert r.finish_s == pytest.approx(8 * H + 300)
        assert r.cost_usd == pytest.approx((8 * H + 300) / H * 1.0)
        assert r.cost_vs_ondemand == pytest.approx(1 / 3)
    od = run("on-demand", [1] * ticks(20), j)
    assert od.cost_usd == pytest.approx(j.ondemand_only_usd()) and od.cost_vs_ondemand == pytest.approx(1)


def test_never_available() -> None:
    j = job()
    never = [0] * ticks(20)
    assert not run("spot-only", never, j).finished
    assert run("spot-only", never, j).deadline_met is False
    fb = run("spot-fallback", never, j)
    assert fb.finish_s == pytest.approx(8 * H + 300) and fb.wait_s == 0
    d = run("deadline", never, j)
    # waits while on the uniform-progress line, then runs on demand once behind it
    assert d.deadline_met and d.spot_s == 0 and d.starts == 1
    assert d.wait_s == GAP and d.finish_s == pytest.approx(GAP + 8 * H + 300)


def test_flapping_spot_with_and_without_backoff() -> None:
    j = job(hours=4, deadline_h=6, restart=300)
    flapping = [1, 1, 0, 0] * ticks(12)
    d = run("deadline", flapping, j)
    backoff = simulate(
        DeadlinePolicy(hysteresis_restarts=2, hysteresis_ticks=2, backoff=1), j, from_arrays([flapping], GAP)
    )
    assert d.deadline_met and backoff.deadline_met
    # every spot spell is 10 minutes: 5 min of restart, then 5 min of work lost to a 10 min checkpoint
    # interval. With backoff the margin to go back to spot grows with each preemption, so the policy
    # chases it less; the tuned default (no backoff) chases it, still meets the deadline, and pays more
    # here: the price of being cheaper on the real traces (docs/policies.md).
    assert backoff.starts < d.starts and backoff.preemptions < d.preemptions
    assert backoff.starts <= 8 and backoff.cost_usd < d.cost_usd
    assert not run("spot-only", flapping, j).finished  # spot never gets past its restart + checkpoint


def test_gap_just_before_the_deadline() -> None:
    j = job(hours=8, deadline_h=12)
    # spot for 6 h, then none for 10 h
    trace = [1] * ticks(6) + [0] * ticks(10) + [1] * ticks(10)
    only = run("spot-only", trace, j)
    assert only.finished and not only.deadline_met
    for name in ("spot-fallback", "deadline"):
        r = run(name, trace, j)
        assert r.deadline_met, name
        assert r.spot_s > 5 * H and r.ondemand_s > 0
    d, fb = run("deadline", trace, j), run("spot-fallback", trace, j)
    assert d.cost_usd <= fb.cost_usd + 1e-9  # same here: both run on demand from the gap on


def test_zones_take_spot_where_any_zone_has_capacity() -> None:
    j = job(hours=2, deadline_h=None, ckpt=600)
    a = [1] * ticks(1) + [0] * ticks(10)
    b = [0] * ticks(0.5) + [1] * ticks(10.5)
    r = simulate(make_policy("spot-only"), j, from_arrays([a, b], GAP))
    assert r.finished and r.preemptions == 1 and r.zone_moves == 1 and r.starts == 2 and r.ondemand_s == 0
    assert r.work_lost_s == pytest.approx((1 * H - 300) % 600)


def test_all_names_build() -> None:
    assert [make_policy(n).name for n in POLICY_NAMES] == list(POLICY_NAMES)
