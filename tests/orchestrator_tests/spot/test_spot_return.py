"""The return-to-spot rule shared by the trainer and the `deadline` policy, the probes' back-off, and the
`no-observer` policy in the simulator (what a deadline job does with nobody watching)."""

from __future__ import annotations

import math

import pytest

from orchestrator.spot.policy import DeadlinePolicy, Mode, NoObserverPolicy, Observation, make_policy
from orchestrator.spot.simulator import JobNumbers, _Run, simulate
from orchestrator.spot.traces import from_arrays
from trainer.config import ResourcesSpec
from trainer.stops.spot_return import (
    ON_DEMAND,
    SPOT,
    Landing,
    Progress,
    next_probe_at,
    probes_apply,
    return_to_spot,
)

H = 3600.0


def progress(now_h: float, done_h: float, deadline_h: float | None = 20.0) -> Progress:
    return Progress(now_h * H, 0.0, None if deadline_h is None else deadline_h * H, done_h * H, 10 * H, 300.0)


def test_returns_to_spot_only_when_ahead_and_the_work_left_is_worth_a_restart() -> None:
    assert return_to_spot(progress(4, 2.5), margin=0.0)  # the line is at 2 h: ahead by 0.5 h
    assert not return_to_spot(progress(4, 1.5), margin=0.0)  # behind the line
    assert not return_to_spot(progress(4, 2.5), margin=H)  # ahead, but not by the margin
    assert not return_to_spot(progress(19.0, 9.95), margin=0.0)  # 3 min left: not worth a restart
    assert return_to_spot(progress(4, 0.0, deadline_h=None), margin=0.0)  # no deadline: spot preferred


def test_a_blind_probe_needs_room_for_two_restarts() -> None:
    # ahead of the line, but only 8 minutes of room: one restart fits, a probe and its fall back do not
    p = Progress(0.5 * H, 0.0, 10 * H + 480.0, 0.5 * H, 10 * H, 300.0)
    assert return_to_spot(p, margin=0.0, restarts=1.0)
    assert not return_to_spot(p, margin=0.0, restarts=2.0)


def test_the_deadline_policy_uses_the_same_rule() -> None:
    policy = DeadlinePolicy()
    for done_h in (1.0, 2.0, 2.5, 9.99):
        p = progress(4, done_h)
        obs = Observation(
            now_s=p.now_s, start_s=0.0, deadline_s=p.deadline_s, work_done_s=p.work_done_s,
            work_total_s=p.work_total_s, restart_overhead_s=300.0, spot_available=True, mode=Mode.ON_DEMAND,
        )  # fmt: skip
        back = policy.decide(obs).mode is Mode.SPOT
        assert back == return_to_spot(p, margin=policy.margin_s(obs)), done_h


def test_probes_back_off_after_each_landing_on_demand() -> None:
    assert next_probe_at([]) == -math.inf
    fell_back = [Landing(0.0, 1, SPOT), Landing(2 * H, 2, ON_DEMAND)]
    assert next_probe_at(fell_back) == 3 * H  # one hour after falling back
    failed = [*fell_back, Landing(3 * H, 3, ON_DEMAND, probe=True)]
    assert next_probe_at(failed) == 5 * H  # doubled after a probe that found no spot
    failed2 = [*failed, Landing(5 * H, 4, ON_DEMAND, probe=True)]
    assert next_probe_at(failed2) == 9 * H
    many = failed2 + [Landing((10 + i) * H, 5 + i, ON_DEMAND, probe=True) for i in range(6)]
    assert next_probe_at(many) == 15 * H + 8 * H  # capped
    landed = [*failed2, Landing(9 * H, 5, SPOT, probe=True)]
    assert next_probe_at(landed) == -math.inf  # on spot: nothing to wait for
    assert Landing.from_json(failed2[-1].as_json()) == failed2[-1]
    assert Landing.from_json({"at": "x"}) is None


def test_only_deadline_jobs_probe() -> None:
    assert probes_apply(ResourcesSpec(deadline="12h"))
    assert not probes_apply(ResourcesSpec(deadline="12h", policy="spot-fallback"))
    assert not probes_apply(ResourcesSpec())
    assert not probes_apply(ResourcesSpec(deadline="12h", spot=False))


# ---- the simulator ---------------------------------------------------------------------------------
GAP = 300.0
#: spot for 2 h, none for 6 h, then spot for 30 h
TRACE = from_arrays([[1] * 24 + [0] * 72 + [1] * 360], GAP)
JOB = JobNumbers(10 * H, 1.0, 3.0, 600.0, 300.0, deadline_s=20 * H)


def landings(policy: NoObserverPolicy) -> list[Landing]:
    """Run the job, keeping the landings the simulator records."""
    seen: list[Landing] = []
    decide = policy.decide

    class Spy:
        name = policy.name

        def decide(self, obs: Observation):  # noqa: ANN202
            seen[:] = obs.landings
            return decide(obs)

    simulate(Spy(), JOB, TRACE)
    return seen


def test_no_observer_falls_back_probes_with_back_off_and_returns() -> None:
    r = simulate(make_policy("no-observer", baselines=True), JOB, TRACE)
    assert r.finished and r.deadline_met
    assert (r.preemptions, r.probes, r.probes_failed) == (1, 3, 2)
    seen = landings(NoObserverPolicy())
    assert [(x.at_s / H, x.landed, x.probe) for x in seen] == [
        (0.0, SPOT, False),
        (2.0, ON_DEMAND, False),  # spot gone: SkyPilot falls back at once
        (3.0, ON_DEMAND, True),  # an hour later: no spot yet
        (5.0, ON_DEMAND, True),  # two hours later: still none
        (9.0, SPOT, True),  # four hours later: spot is back (since 8 h)
    ]
    # never waits for spot: only SkyPilot's failed spot launches before each on-demand landing
    assert r.wait_s == pytest.approx(3 * NoObserverPolicy().failover_s)
    # each probe is a restart: starts = first + fall back + 3 probes
    assert r.starts == 5 and r.overhead_s == pytest.approx(5 * JOB.restart_overhead_s)


def test_no_observer_costs_more_than_the_full_deadline_policy_here() -> None:
    observed = simulate(DeadlinePolicy(), JOB, TRACE)
    alone = simulate(NoObserverPolicy(), JOB, TRACE)
    assert observed.wait_s > alone.wait_s  # the controller waits for spot while ahead; the job alone cannot
    assert alone.ondemand_s > observed.ondemand_s and alone.cost_usd > observed.cost_usd


def test_no_observer_never_waits_and_has_no_safety_net() -> None:
    # no spot at all: straight to on demand; spot that stays: never leaves it, deadline or not
    none = simulate(NoObserverPolicy(), JOB, from_arrays([[0] * 400], GAP))
    assert none.spot_s == 0 and (none.probes, none.probes_failed) == (3, 3)  # at 1 h, 3 h, 7 h
    assert none.wait_s == pytest.approx((1 + none.probes) * NoObserverPolicy().failover_s)
    run = _Run(JOB, GAP, mode=Mode.SPOT)
    late = Observation(
        now_s=19 * H, start_s=0.0, deadline_s=20 * H, work_done_s=1 * H, work_total_s=10 * H,
        restart_overhead_s=300.0, spot_available=True, mode=Mode.SPOT,
    )  # fmt: skip
    assert NoObserverPolicy().decide(late).mode is Mode.SPOT and run.mode is Mode.SPOT
    assert DeadlinePolicy().decide(late).mode is Mode.ON_DEMAND  # the observer's safety net


def test_the_task_env_turns_probes_on_for_deadline_jobs_only() -> None:
    from orchestrator.spot.policy import spot_return_env

    assert spot_return_env(ResourcesSpec(deadline="12h"), 240.0) == {
        "FTORCH_SPOT_RETURN": '{"restart_overhead_s": 240.0}'
    }
    assert spot_return_env(ResourcesSpec(fallback="on-demand"), 240.0) == {}
    assert spot_return_env(ResourcesSpec(deadline="12h", policy="spot-only"), None) == {}


def test_a_controller_driven_job_does_not_probe_from_its_on_demand_only_list(tmp_path) -> None:
    """The controller launches spot-only and on-demand-only lists and moves the job back itself; a probe
    from an on-demand-only list could only land on demand again."""
    from helpers import job_dict

    from orchestrator.backends.skypilot_controller import tasks_for
    from trainer.config import JobSpec

    job = job_dict(tmp_path / "m", tmp_path / "d.jsonl", tmp_path / "runs")
    job.setdefault("resources", {})["deadline"] = "12h"
    spec = JobSpec.model_validate(job)
    envs = {"FTORCH_RUN_ID": "j", "FTORCH_SPOT_RETURN": '{"restart_overhead_s": 300}'}
    task = {"envs": envs, "resources": {"ordered": [{"use_spot": True}, {"use_spot": False}]}}
    tasks = tasks_for(spec, "j", "file:///r", task, render_job=None)
    assert set(tasks) == {Mode.SPOT, Mode.ON_DEMAND}
    assert all(t["envs"] == {"FTORCH_RUN_ID": "j"} for t in tasks.values())
    assert "FTORCH_SPOT_RETURN" in task["envs"]  # the single list SkyPilot walks alone keeps it


def test_a_policy_observation_is_the_rules_progress_not_a_copy_of_it() -> None:
    # one type for the nine facts: what the policy sees is what the shared rule reads, field for field
    from dataclasses import fields

    shared = {f.name for f in fields(Progress)}
    own = {f.name for f in fields(Observation)} - shared
    assert own == {"spot_available", "mode", "landings"}, own
    seen = Observation(
        now_s=4 * H, start_s=0.0, deadline_s=20 * H, work_done_s=2.5 * H, work_total_s=10 * H,
        restart_overhead_s=300.0, unsaved_work_s=60.0, spot_available=True, mode=Mode.ON_DEMAND,
    )  # fmt: skip
    assert isinstance(seen, Progress)
    assert return_to_spot(seen, margin=0.0) == return_to_spot(progress(4, 2.5), margin=0.0) is True
