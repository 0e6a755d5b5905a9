"""`checkpoint.every: auto`: the Young/Daly interval from the measured cost and the interruption rate."""

from __future__ import annotations

import math

import pytest

from trainer.checkpoints.interval import AutoInterval, History, young_interval


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
