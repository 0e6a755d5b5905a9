"""`checkpoint.every: auto`: the Young/Daly interval from the measured cost and the interruption rate,
and the one interval model the planner, the trainer and the budget guard share."""

from __future__ import annotations

import math

import pytest

from trainer.stops.interval import (
    CHECKPOINT_GBPS,
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    SNAPSHOT_GBPS,
    AutoInterval,
    CheckpointCost,
    History,
    auto_interval,
    fixed_interval_s,
    young_interval,
)


def _auto(**kw) -> AutoInterval:
    return AutoInterval(
        mtbf_prior_s=kw.pop("mtbf", 3600.0), notice_prior=kw.pop("notice", 0.0), min_s=1, max_s=1e6, **kw
    )


@pytest.mark.parametrize(("cost", "mtbf"), [(0.5, 3600.0), (30.0, 6 * 3600.0), (7.0, 7200.0)])
def test_interval_matches_the_formula(cost: float, mtbf: float) -> None:
    auto = _auto(mtbf=mtbf)
    auto.observe(cost)
    interval, why = auto.choose()
    assert interval == pytest.approx(math.sqrt(2 * cost * mtbf)) == pytest.approx(young_interval(cost, mtbf))
    assert "Young/Daly" in why and f"{mtbf:.0f}s between" in why


def test_measured_costs_move_the_interval() -> None:
    auto = _auto()
    auto.observe(0.1)
    short, _ = auto.choose()
    for _ in range(6):  # checkpoints got slower (a bigger state, a slower store)
        auto.observe(2.5)
    longer, _ = auto.choose()
    assert longer > 4 * short
    assert longer == pytest.approx(math.sqrt(2 * auto.cost_s * 3600), rel=1e-9)


def test_the_run_history_re_estimates_the_rate() -> None:
    calm = _auto(history=History(exposure_s=3600, interruptions=0))
    stormy = _auto(history=History(exposure_s=3600, interruptions=5))
    for a in (calm, stormy):
        a.observe(1.0)
    assert calm.mtbf_s() == 7200 and stormy.mtbf_s() == pytest.approx(7200 / 6)
    assert stormy.choose()[0] == pytest.approx(math.sqrt(2 * 1.0 * 7200 / 6))


def test_with_notices_the_interval_matters_less_and_says_why() -> None:
    plain = _auto(history=History(exposure_s=0, interruptions=4, with_notice=0))
    noticed = _auto(history=History(exposure_s=0, interruptions=4, with_notice=3))
    for a in (plain, noticed):
        a.observe(1.0)
    (short, _), (longer, why) = plain.choose(), noticed.choose()
    assert longer == pytest.approx(short * 2)  # only 1 in 4 interruptions loses work: M_eff = 4x
    assert "75% with notice" in why and "matters less" in why


def test_clamped_and_never_shorter_than_two_uploads() -> None:
    auto = AutoInterval(mtbf_prior_s=3600, notice_prior=0, min_s=5, max_s=60)
    auto.observe(0.0001, upload_s=4.0)
    interval, why = auto.choose()
    assert interval == 8.0 and "clamped" in why
    auto.observe(100.0)
    assert auto.choose()[0] == 60


def test_history_from_fence_records() -> None:
    records = {
        1: {"claimed_at": 100.0, "ended": "notice"},
        2: {"claimed_at": 200.0},  # killed without notice: no end recorded
        3: {"claimed_at": 300.0},  # this attempt
    }
    history = History.from_epochs(records, mine=3, now=400.0)
    assert (history.exposure_s, history.interruptions, history.with_notice) == (300.0, 2, 1)


# ---- one model for planner, trainer and budget guard ---------------------------------------------------
def _three_intervals(blocking: float, upload: float, rate: float, every: object = "auto") -> list[float]:
    """The interval the planner prices, the trainer's auto interval and the budget guard's expectation,
    for one checkpoint cost and one interruption rate."""
    from support.planner_jobs import job

    from orchestrator.sizing.planner import checkpoint_interval
    from trainer.stops.budget import BudgetGuard
    from trainer.stops.interruptions import mtbf_from_rate

    mtbf = mtbf_from_rate(rate)
    spec = job(checkpoint={"uri": "s3://b/ck", "every": every})
    planner = checkpoint_interval(spec, 0.5, CheckpointCost(blocking, upload), rate)
    trainer = AutoInterval(mtbf_prior_s=mtbf, notice_prior=0.0)
    trainer.observe(blocking, upload)
    guard = BudgetGuard(
        budget_usd=10.0, hourly_usd=1.0, auto=AutoInterval(mtbf_prior_s=mtbf, notice_prior=0.0)
    )
    guard.auto.observe(blocking, upload)
    return [planner, trainer.choose()[0], guard.interval_s()]


@pytest.mark.parametrize(
    ("blocking", "upload", "rate", "expected"),
    [
        (0.1, 1.0, 0.1, math.sqrt(2 * 0.1 * 36000)),  # Young's, inside the clamps
        (2.0, 40.0, 20.0, 80.0),  # two uploads: the floor (Young: 27 s)
        (1e-4, 0.0, 60.0, MIN_INTERVAL_S),  # a cheap checkpoint on a stormy offer: the lower clamp
        (30.0, 60.0, 0.0, MAX_INTERVAL_S),  # never interrupted (on-demand): the upper clamp
    ],
)
def test_planner_trainer_and_budget_guard_choose_the_same_interval(
    blocking: float, upload: float, rate: float, expected: float
) -> None:
    planner, trainer, guard = _three_intervals(blocking, upload, rate)
    assert planner == trainer == guard == pytest.approx(expected)
    chosen = auto_interval(CheckpointCost(blocking, upload), 3600 / rate if rate else 1e12)
    assert chosen.seconds == pytest.approx(expected)


def test_the_clamps_and_fixed_intervals_are_shared() -> None:
    assert (MIN_INTERVAL_S, MAX_INTERVAL_S) == (5.0, 1800.0)  # docs/storage.md, docs/planner.md
    low = _three_intervals(1e-6, 0.0, 1000.0)
    high = _three_intervals(1e6, 0.0, 1e-6)
    assert low == [MIN_INTERVAL_S] * 3 and high == [MAX_INTERVAL_S] * 3
    # `checkpoint.every: 90s` is 90 s for planner and guard alike (the trainer times it itself)
    from support.planner_jobs import job

    from orchestrator.sizing.planner import checkpoint_interval
    from trainer.stops.budget import BudgetGuard

    spec = job(checkpoint={"uri": "s3://b/ck", "every": "90s"})
    assert checkpoint_interval(spec, 0.5, CheckpointCost(1.0), 0.1) == 90.0
    assert BudgetGuard(budget_usd=1.0, hourly_usd=1.0, every_seconds=90.0).interval_s() == 90.0
    assert fixed_interval_s(10, None, 0.5) == 5.0 and fixed_interval_s(10, None, None) is None


def test_blocking_is_the_cost_and_the_upload_is_at_risk() -> None:
    """The cost terms, stated once: Young's C is the blocking time; the upload only floors the interval
    and adds to the work an interruption loses."""
    slow_upload = auto_interval(CheckpointCost(0.5, 10.0), 3600.0)
    fast_upload = auto_interval(CheckpointCost(0.5, 0.1), 3600.0)
    assert slow_upload.raw_s == fast_upload.raw_s == pytest.approx(60.0)
    assert CheckpointCost(0.5, 10.0).lost_s(60.0) == 40.0
    cost = CheckpointCost.of_bytes(1e9)  # 1 GB: a snapshot into host memory, an upload to object storage
    assert cost.blocking_s == pytest.approx(1e9 / (SNAPSHOT_GBPS * 1e9))
    assert cost.upload_s == pytest.approx(1e9 / (CHECKPOINT_GBPS * 1e9)) and cost.upload_s > cost.blocking_s


def test_one_young_daly_implementation() -> None:
    """No other module computes a Young/Daly interval or states its own clamps."""
    import re

    from helpers import REPO

    pattern = re.compile(r"sqrt\(\s*2(\.0)?\s*\*|MIN_CKPT_INTERVAL|MAX_CKPT_INTERVAL|AUTO_INTERVAL_S\s*=")
    the_model = REPO / "trainer" / "stops" / "interval.py"
    assert pattern.search(the_model.read_text())  # the pattern finds the one model (this test can fail)
    found = [
        str(p.relative_to(REPO))
        for folder in ("orchestrator", "trainer")
        for p in (REPO / folder).rglob("*.py")
        if p != the_model and pattern.search(p.read_text())
    ]
    assert found == []
