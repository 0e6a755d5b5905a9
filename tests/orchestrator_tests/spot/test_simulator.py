"""Simulator bookkeeping, the deadline guarantee over many traces, trace loading, and speed."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO

from orchestrator.errors import UserError
from orchestrator.spot.policy import POLICY_NAMES, DeadlinePolicy, make_policy
from orchestrator.spot.simulator import JobNumbers, Result, simulate, start_ticks, summarize, sweep
from orchestrator.spot.traces import Zones, from_arrays, load_zones

H = 3600.0
#: ../shared beside the checkout (as CI lays it out)
SHARED = REPO.parent / "shared/data/spot-traces/availability/1-node/aws-02-15-2023"
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="shared spot traces not present")


def markov_zones(rng: random.Random, n_zones: int, n_ticks: int, gap: float) -> Zones:
    """Random on/off zones: spells of capacity and of none, of random mean lengths."""
    rows = []
    for _ in range(n_zones):
        p_down, p_up = rng.uniform(0.001, 0.3), rng.uniform(0.001, 0.3)
        state, row = rng.random() < 0.6, []
        for _ in range(n_ticks):
            row.append(int(state))
            if rng.random() < (p_down if state else p_up):
                state = not state
        rows.append(row)
    return from_arrays(rows, gap)


def random_job(rng: random.Random) -> JobNumbers:
    work = rng.uniform(0.2, 20) * H
    restart = rng.choice([0.0, 60.0, 300.0, rng.uniform(0, 1800)])
    slack = rng.choice([0.0, rng.uniform(0, 0.2), rng.uniform(0, 1.5)]) * work
    return JobNumbers(
        work_s=work,
        spot_hourly_usd=rng.uniform(0.1, 2.0),
        ondemand_hourly_usd=rng.uniform(2.0, 6.0),
        checkpoint_interval_s=rng.choice([0.0, 300.0, 600.0, rng.uniform(60, 3600)]),
        restart_overhead_s=restart,
        deadline_s=work + restart + slack,
    )


def check_books(r: Result, job: JobNumbers) -> None:
    """Cost and time add up."""
    expected = r.spot_s * job.spot_hourly_usd / H + r.ondemand_s * job.ondemand_hourly_usd / H
    assert r.cost_usd == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert r.cost_vs_ondemand == pytest.approx(r.cost_usd / job.ondemand_only_usd(), rel=1e-9)
    assert r.work_lost_s >= 0 and r.wait_s >= 0 and r.overhead_s >= 0
    assert r.overhead_s == pytest.approx(min(r.starts * job.restart_overhead_s, r.overhead_s), abs=1e-6)
    assert r.preemptions <= r.starts
    if r.finished:
        assert r.work_done_s == pytest.approx(job.work_s)
        billed = r.spot_s + r.ondemand_s
        assert billed == pytest.approx(job.work_s + r.work_lost_s + r.overhead_s, rel=1e-9, abs=1e-6)
        assert r.finish_s == pytest.approx(billed + r.wait_s, rel=1e-9, abs=1e-6)
        if job.deadline_s is not None:
            assert r.deadline_met == (r.finish_s <= job.deadline_s + 1e-6)
    else:
        assert r.finish_s is None and r.deadline_met in (None, False)


def test_bookkeeping_and_deadline_guarantee_on_random_traces() -> None:
    rng = random.Random(8)
    for case in range(600):
        gap = rng.choice([60.0, 195.0, 300.0, 600.0])
        job = random_job(rng)
        n_ticks = int(3 * job.deadline_s / gap) + 10
        zones = markov_zones(rng, rng.choice([1, 1, 2, 3]), n_ticks, gap)
        start = rng.randrange(0, n_ticks // 3)
        results = {name: simulate(make_policy(name), job, zones, start) for name in POLICY_NAMES}
        for r in results.values():
            check_books(r, job)
        od = results["on-demand"]
        assert od.finish_s == pytest.approx(job.ondemand_only_s()) and od.cost_vs_ondemand == pytest.approx(
            1.0
        )
        # on demand alone meets every deadline here (deadline >= restart + work); so must the policy
        assert results["deadline"].deadline_met, (case, job, start)


@needs_shared
def test_deadline_guarantee_on_real_trace_windows() -> None:
    rng = random.Random(15)
    files = sorted(SHARED.glob("*.json"))
    all_zones = load_zones([str(SHARED)])
    singles = [load_zones([str(f)]) for f in files]
    for _ in range(150):
        zones = rng.choice([all_zones, *singles])
        job = random_job(rng)
        start = rng.randrange(0, zones.n_ticks - int(job.deadline_s / zones.gap_s) - 1)
        r = simulate(make_policy("deadline"), job, zones, start)
        check_books(r, job)
        assert r.deadline_met, (job, start)


def test_deadline_policy_variants_keep_the_guarantee() -> None:
    rng = random.Random(3)
    variants = [
        DeadlinePolicy(hysteresis_s=0, min_spot_work_s=0, backoff=0),
        DeadlinePolicy(hysteresis_s=4 * H),
    ]
    for _ in range(60):
        job = random_job(rng)
        zones = markov_zones(rng, 1, int(2 * job.deadline_s / 300) + 10, 300)
        for p in variants:
            assert simulate(p, job, zones).deadline_met


def test_preemption_loses_work_since_the_last_checkpoint() -> None:
    gap = 300.0
    job = JobNumbers(2 * H, 1.0, 3.0, checkpoint_interval_s=1200, restart_overhead_s=300)
    # up 40 min (5 min restart + 35 min work: checkpoint at 20, 15 min unsaved), down 10 min, then up
    trace = [1] * 8 + [0] * 2 + [1] * 100
    r = simulate(make_policy("spot-only"), job, from_arrays([trace], gap))
    assert r.preemptions == 1 and r.starts == 2 and r.work_lost_s == pytest.approx(15 * 60)
    assert r.wait_s == 2 * gap and r.overhead_s == 600
    assert r.finish_s == pytest.approx(40 * 60 + 10 * 60 + 5 * 60 + (2 * H - 20 * 60))
    check_books(r, job)


def test_no_checkpoint_interval_means_nothing_is_lost() -> None:
    job = JobNumbers(2 * H, 1.0, 3.0, checkpoint_interval_s=0, restart_overhead_s=0)
    r = simulate(make_policy("spot-only"), job, from_arrays([[1, 0] * 100], 300.0))
    assert r.preemptions > 0 and r.work_lost_s == 0 and r.finish_s == pytest.approx(4 * H - 300)


def test_sweep_and_summary() -> None:
    zones = from_arrays([[1] * 200 + [0] * 200] * 1, 300.0)
    job = JobNumbers(4 * H, 1.0, 3.0, 600, 300, deadline_s=6 * H)
    starts = start_ticks(zones, 5, 6 * H)
    assert starts[0] == 0 and starts[-1] == 400 - 72 and len(starts) == 5
    summaries = {s.policy: s for s in sweep([make_policy(n) for n in POLICY_NAMES], job, zones, starts)}
    assert summaries["on-demand"].met_share == 1.0 and summaries["on-demand"].mean_cost_vs_ondemand == 1.0
    assert summaries["deadline"].met_share == 1.0
    assert summaries["spot-only"].met_share < 1.0
    assert summaries["spot-only"].runs == 5
    one = summarize([simulate(make_policy("spot-only"), job, zones, 0)])
    assert one.met_share == 1.0 and one.median_cost_vs_ondemand == pytest.approx(1 / 3)


# --- trace files ------------------------------------------------------------------------------------


def write_trace(path: Path, data: list[int], gap: float = 195) -> str:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return str(path)


def test_load_zones(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", [0, 1, 2, 3])
    b = write_trace(tmp_path / "b.json", [1, 1, 0])
    zones = load_zones([a, b])
    assert zones.names == ["a", "b"] and zones.gap_s == 195 and zones.n_ticks == 3
    assert zones.first_up().tolist() == [1, 0, 0] and zones.any_up.tolist() == [True, True, True]
    assert load_zones([str(tmp_path)]).names == ["a", "b"]  # a folder
    assert load_zones([str(tmp_path / "*.json")]).n_ticks == 3  # a glob
    two_nodes = load_zones([a], nodes=2)
    assert two_nodes.up.tolist() == [[False, False, True, True]]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "not JSON"),
        ('{"data": [1]}', "not a trace"),
        ('{"metadata": {"gap_seconds": 0}, "data": [1]}', "gap_seconds > 0"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "non-empty"),
    ],
)
def test_bad_trace_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_zones([str(path)])


def test_trace_errors(tmp_path: Path) -> None:
    a = write_trace(tmp_path / "a.json", [1], gap=60)
    b = write_trace(tmp_path / "b.json", [1], gap=195)
    with pytest.raises(UserError, match="share gap_seconds"):
        load_zones([a, b])
    with pytest.raises(UserError, match="does not exist"):
        load_zones([str(tmp_path / "nope.json")])
    with pytest.raises(UserError, match="matches no files"):
        load_zones([str(tmp_path / "x*.json")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no \\*.json"):
        load_zones([str(tmp_path / "empty")])


# --- speed ------------------------------------------------------------------------------------------


def test_a_45_day_trace_simulates_well_under_a_second_per_policy() -> None:
    ticks = 45 * 24 * 12  # 5-minute ticks
    rng = np.random.default_rng(0)
    zones = from_arrays([(rng.random(ticks) < 0.7).astype(int)], 300.0)
    # a job long enough to need the whole trace
    job = JobNumbers(30 * 24 * H, 1.0, 3.0, 600, 300, deadline_s=44 * 24 * H)
    for name in POLICY_NAMES:
        began = time.perf_counter()
        simulate(make_policy(name), job, zones, max_ticks=ticks)
        assert time.perf_counter() - began < 0.5, name
